"""Coordination on real Celery workers for the entry points that had no worker test.

* ``background = True``: the run is handed to a worker, which takes the step's and the
  reactor's coordination itself — locked bodies of several executions never overlap across
  the two worker processes (while unlocked ones do), and every hold is owned by its execution.
* A failure retry on a worker takes and releases the step's lock per attempt: another
  execution runs on the key during the backoff, and each attempt is a fresh acquisition.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import pytest

from reactor_app.models import CoordinationEvent, Execution
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from reactor_app.testing import assert_not_locked
from tests.worker.coordination_reactors import (
    BackgroundExclusiveReactor,
    BackgroundLockedReactor,
    GapContenderReactor,
    GapFlakyReactor,
)
from tests.worker.helpers import overlapping, wait_until
from tests.worker.reactors import records

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = {"REACTOR_CONTENTION_BACKOFF": [0.2, 0.5], "REACTOR_CONTENTION_CEILING": 200}

EXECUTIONS = 6


def _hand_off(reactor: Any, key: str) -> list[Execution]:
    executions = []
    for _ in range(EXECUTIONS):
        handed = reactor.run(key=key)
        assert handed.status == "handed_off"
        executions.append(Execution.objects.get(pk=handed.execution_id))
    for execution in executions:
        result = execution.wait(timeout=120)
        assert result.ok, result.error
    return executions


def _acquisitions(key: str) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for event in CoordinationEvent.objects.filter(key=key, kind=CoordinationEventKind.ACQUIRED):
        counts[str(event.execution_id)] += 1
    return dict(counts)


def test_a_background_reactor_takes_its_step_lock_on_the_worker(worker: Any) -> None:
    executions = _hand_off(BackgroundLockedReactor, "b1")
    ids = {str(e.id) for e in executions}

    locked = records("bg_locked")
    assert len(locked) == EXECUTIONS
    assert overlapping(locked) == []  # one execution at a time inside the locked step
    free = records("bg_free")
    assert len({r["pid"] for r in free}) >= 2, "only one worker process ran"
    assert overlapping(free) != []  # the unlocked step did run concurrently
    for entry in locked:
        assert entry["pid"] != os.getpid()  # ran on a worker
        # from inside the body: the key is held by this execution, attributed to the step
        assert (entry["owner"], entry["step"]) == (entry["execution"], "locked")
    assert {r["execution"] for r in locked} == ids
    tokens = [r["token"] for r in sorted(locked, key=lambda r: r["start"])]
    assert tokens == sorted(tokens) and len(set(tokens)) == EXECUTIONS
    # one fresh acquisition per execution, each under its own id
    assert _acquisitions("bg:b1") == {execution_id: 1 for execution_id in ids}
    assert_not_locked("bg:b1")


def test_a_background_reactor_takes_its_reactor_lock_on_the_worker(worker: Any) -> None:
    executions = _hand_off(BackgroundExclusiveReactor, "b2")
    ids = {str(e.id) for e in executions}

    spans = records("bg_run")
    assert len(spans) == 2 * EXECUTIONS
    runs: dict[str, dict[str, Any]] = {}
    for entry in spans:
        assert entry["pid"] != os.getpid()
        # the reactor-level hold (step None) of this very execution covers both steps
        assert (entry["owner"], entry["step"]) == (entry["execution"], None)
        run = runs.setdefault(entry["execution"], {"start": entry["start"], "end": entry["end"]})
        run["start"] = min(run["start"], entry["start"])
        run["end"] = max(run["end"], entry["end"])
    assert set(runs) == ids
    assert overlapping(runs.values()) == []  # whole runs never overlap on one key
    assert set(_acquisitions("bg-run:b2")) == ids
    assert_not_locked("bg-run:b2")


def test_a_retry_on_a_worker_frees_the_step_lock_between_attempts(worker: Any) -> None:
    flaky = GapFlakyReactor.run_async(key="g1")
    wait_until(lambda: records("gap_attempt"), 30, message="the first attempt never ran")
    # another execution on the same key, started during the 2 s backoff
    contender = GapContenderReactor.run_async(key="g1")

    assert contender.wait(timeout=30).ok
    result = flaky.wait(timeout=30)
    assert result.ok, result.error
    assert Execution.objects.get(pk=flaky.pk).status == ExecutionStatus.SUCCEEDED

    first, second = records("gap_attempt")
    (other,) = records("gap_contender")
    assert (first["attempt"], second["attempt"]) == (1, 2)
    # the contender ran on the key between the two attempts...
    assert first["end"] <= other["start"] and other["end"] <= second["start"]
    # ...and each attempt was a fresh acquisition: tokens increase in time order
    assert first["token"] < other["token"] < second["token"]
    kinds = (
        CoordinationEvent.objects.filter(key="gap:g1", execution_id=flaky.id)
        .filter(kind__in=[CoordinationEventKind.ACQUIRED, CoordinationEventKind.RELEASED])
        .order_by("at", "id")
        .values_list("kind", flat=True)
    )
    assert list(kinds) == ["acquired", "released", "acquired", "released"]
    assert_not_locked("gap:g1")
