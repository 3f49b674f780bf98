"""Debounce on real workers: a burst of starts with one key becomes one run of the last
inputs, after the burst settles; the replaced starts end ``superseded``, pointing at it.

Bursts are recorded by the step bodies (``records("debounced")``: which execution ran, with
which inputs, when) and read back from the rows; the quiet periods are real seconds on the
Redis clock, so the tests space their starts well inside and well outside them.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import transaction

from reactor_app.exceptions import CoordinationKeyError, InputValidationError
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.worker.debounce_reactors import (
    CappedRecompute,
    KeyedOnMissingInput,
    PlainRecompute,
    Recompute,
    starts_at_once,
)
from tests.worker.reactors import records

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def runs() -> list[dict[str, Any]]:
    return sorted(records("debounced"), key=lambda r: r["at"])


def test_a_burst_becomes_one_run_of_the_last_inputs_after_it_settles(worker: Any) -> None:
    burst = []
    for version in range(5):
        burst.append(Recompute.run_async(account_id=1, version=version))
        time.sleep(0.1)
    other = Recompute.run_async(account_id=2, version=0)
    last_start = time.time_ns()

    result = burst[0].wait(timeout=60)  # a superseded start waits for the run that replaced it
    assert result.ok and result.value == {"account_id": 1, "version": 4}
    assert result.execution_id == str(burst[-1].id)
    assert other.wait(timeout=60).value == {"account_id": 2, "version": 0}

    done = runs()
    assert [(r["account_id"], r["version"]) for r in done] == [(1, 4), (2, 0)]
    assert done[0]["at"] >= last_start + 0.8e9  # a quiet period after the last start
    for execution in burst[:-1]:
        execution.refresh_from_db()
        assert execution.status == ExecutionStatus.SUPERSEDED
        assert execution.superseded_by_id == burst[-1].id  # the one that ran, not the next
        assert execution.started_at is None  # never ran
    assert Execution.objects.filter(status=ExecutionStatus.SUCCEEDED).count() == 2


def test_starts_after_the_quiet_period_each_run(worker: Any) -> None:
    first = Recompute.run_async(account_id=3, version=1)
    assert first.wait(timeout=60).ok
    second = Recompute.run_async(account_id=3, version=2)
    assert second.wait(timeout=60).value == {"account_id": 3, "version": 2}
    first.refresh_from_db()
    assert first.status == ExecutionStatus.SUCCEEDED
    assert [r["version"] for r in runs()] == [1, 2]


def test_max_wait_runs_a_burst_that_never_settles(worker: Any) -> None:
    began = time.time_ns()
    starts = []
    for version in range(12):  # a start every 0.25 s for 3 s: never a quiet second
        starts.append(CappedRecompute.run_async(account_id=4, version=version))
        time.sleep(0.25)
    burst_end = time.time_ns()
    for execution in starts:
        execution.wait(timeout=60)

    done = runs()
    assert len(done) >= 2, done  # capped at one second from each burst's first start
    assert done[0]["at"] < burst_end  # the first run did not wait for the burst to end
    assert done[0]["at"] <= began + 2.5e9
    statuses = Execution.objects.filter(pk__in=[s.pk for s in starts]).values_list(
        "status", flat=True
    )
    assert set(statuses) == {ExecutionStatus.SUCCEEDED, ExecutionStatus.SUPERSEDED}
    assert sorted(statuses).count(ExecutionStatus.SUCCEEDED) == len(done)


def test_a_per_call_debounce_and_concurrent_starts_from_threads(worker: Any) -> None:
    started = starts_at_once("acct5", 1.0)
    results = [execution.wait(timeout=60) for execution in started]

    done = runs()
    rows = Execution.objects.filter(pk__in=[e.pk for e in started])
    seen = [(str(r.pk), r.status, str(r.superseded_by_id), r.created_at) for r in rows]
    assert len(done) == 1, (done, seen)  # six simultaneous starts, one run
    [ran] = done
    assert {r.execution_id for r in results} == {ran["execution"]}
    superseded = [row for row in rows if row.status == ExecutionStatus.SUPERSEDED]
    assert len(superseded) == 5
    assert {str(row.superseded_by_id) for row in superseded} == {ran["execution"]}


def test_a_start_due_before_its_replacement_commits_does_not_run(worker: Any) -> None:
    # The second start's transaction stays open past the first one's due time, so the settle
    # on commit comes too late to stop the first: the worker asks Redis at delivery instead.
    first = PlainRecompute.run_async(account_id=6, version=1, debounce=("acct6", 0.5))
    with transaction.atomic():
        second = PlainRecompute.run_async(account_id=6, version=2, debounce=("acct6", 0.5))
        time.sleep(1.5)
    assert second.wait(timeout=60).value == {"account_id": 6, "version": 2}
    assert first.wait(timeout=60).execution_id == str(second.id)
    assert [(r["account_id"], r["version"]) for r in runs()] == [(6, 2)]
    first.refresh_from_db()
    assert first.status == ExecutionStatus.SUPERSEDED and first.superseded_by_id == second.id


def test_a_start_whose_replacement_rolled_back_runs_once_the_burst_lapses(worker: Any) -> None:
    first = PlainRecompute.run_async(account_id=7, version=1, debounce=("acct7", 0.5))
    with pytest.raises(RuntimeError), transaction.atomic():
        PlainRecompute.run_async(account_id=7, version=2, debounce=("acct7", 0.5))
        raise RuntimeError("the caller's transaction rolls back")
    assert first.wait(timeout=60).value == {"account_id": 7, "version": 1}
    assert [(r["account_id"], r["version"]) for r in runs()] == [(7, 1)]
    assert Execution.objects.count() == 1


def test_bad_debounce_options_fail_at_the_call_and_store_nothing(worker: Any) -> None:
    with pytest.raises(InputValidationError, match="debounce must be"):
        PlainRecompute.run_async(account_id=1, version=1, debounce=("", 1.0))
    with pytest.raises(InputValidationError, match="debounce must be"):
        PlainRecompute.run_async(account_id=1, version=1, debounce=("k", 0))
    with pytest.raises(CoordinationKeyError, match="debounce key function"):
        KeyedOnMissingInput.run_async(account_id=1, version=1)
    assert Execution.objects.count() == 0
