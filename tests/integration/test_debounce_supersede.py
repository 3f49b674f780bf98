"""Superseded starts of a debounce burst name the start that runs, whatever order the settles of
the burst's starts commit in, and a start marked superseded never runs
(``ExecutionManager.supersede``).

Each start of a burst settles on its own, concurrently: one marks ``A`` superseded by ``F``
while another marks ``F`` superseded by ``C``. Found by the thread test in
``tests/worker/test_debounce.py`` (six simultaneous starts), three counterexamples are kept here:

* when the second settle committed first, ``A`` was left naming ``F``, a start that never runs
  (both commit orders, made sequential: every superseded row must name ``C``);
* a start its delivery had decided to run was marked superseded before the delivery wrote its
  start; the start then ran anyway, as well as the one that replaced it, and ended ``succeeded``
  naming it (the interleaving made exact: the settle runs right after the delivery's decision);
* the settles of one burst deadlocked on each other's rows, each cycle costing PostgreSQL's
  ``deadlock_timeout`` while they held the burst's rows; the deliveries' claims queued behind
  them until Redis had let the burst go, and every start still pending then ran (bursts of six
  starts from threads: no settle may be a deadlock's victim, and each burst ends with one
  start that runs and the others naming it).
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime

import pytest
from django.db import connection
from django.utils import timezone

from reactor_app.coordination import debounce as bursts
from reactor_app.engine import debounce, delivery, enqueueing
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.isolation_levels import LEVELS, at_level
from tests.worker.debounce_reactors import PlainRecompute, starts_at_once
from tests.worker.reactors import records

pytestmark = pytest.mark.django_db


def _pending(name: str) -> Execution:
    return Execution.objects.start(
        reactor="tests.debounced", inputs={"name": name}, status=ExecutionStatus.PENDING
    )


def _named(*rows: Execution) -> list[str]:
    return [str(Execution.objects.get(pk=row.pk).superseded_by_id) for row in rows]


@pytest.mark.parametrize("first", ["earlier pair", "later pair"])
def test_every_superseded_start_names_the_one_that_runs(first: str) -> None:
    a, f, c = _pending("a"), _pending("f"), _pending("c")
    now: datetime = timezone.now()
    if first == "earlier pair":
        Execution.objects.supersede([a.pk], f.pk, now, burst="tests")
        Execution.objects.supersede([f.pk], c.pk, now, burst="tests")
    else:  # the settle that replaced F committed before the one pointing A at F
        Execution.objects.supersede([f.pk], c.pk, now, burst="tests")
        Execution.objects.supersede([a.pk], f.pk, now, burst="tests")
    assert _named(a, f) == [str(c.pk), str(c.pk)]
    assert Execution.objects.get(pk=c.pk).status == ExecutionStatus.PENDING


def test_a_start_that_ran_is_not_superseded_when_it_is_pending_again() -> None:
    """A start a worker took runs, whatever comes after it — also once it is pending again
    (an interrupted run resumed) when a late settle of its burst comes."""
    ran, latest = _pending("ran"), _pending("latest")
    Execution.objects.filter(pk=ran.pk).update(started_at=timezone.now())
    assert Execution.objects.supersede([ran.pk], latest.pk, timezone.now(), burst="tests") == 0
    row = Execution.objects.get(pk=ran.pk)
    assert (row.status, row.superseded_by_id) == (ExecutionStatus.PENDING, None)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The executions whose task would have been sent to the broker (delivered by hand here)."""
    messages: list[str] = []
    monkeypatch.setattr(
        enqueueing, "_enqueue_or_leave_to_sweeper", lambda pk, **_: messages.append(str(pk))
    )
    return messages


@pytest.mark.django_db(transaction=True)
def test_a_start_superseded_after_its_delivery_decided_to_run_it_does_not_run(
    sent: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    burst = f"late-{uuid.uuid4().hex[:8]}"
    first = PlainRecompute.run_async(account_id=1, version=1, debounce=(burst, 30.0))
    later: list[Execution] = []
    decide = debounce.at_delivery

    def decide_then_replaced(execution: Execution, burst_key: str) -> str | None:
        decision = decide(execution, burst_key)  # the only start yet: it runs
        # a later start of the burst comes and settles (on its commit) before the delivery
        # writes the start of its pass
        later.append(PlainRecompute.run_async(account_id=1, version=2, debounce=(burst, 30.0)))
        return decision

    monkeypatch.setattr(debounce, "at_delivery", decide_then_replaced)
    summary = delivery.deliver(str(first.pk))
    monkeypatch.setattr(debounce, "at_delivery", decide)

    assert summary["outcome"] == "superseded", summary
    first.refresh_from_db()
    assert first.status == ExecutionStatus.SUPERSEDED
    assert first.superseded_by_id == later[0].pk
    assert first.started_at is None
    assert records("debounced") == []  # its body never ran

    assert delivery.deliver(str(later[0].pk))["outcome"] == "succeeded"
    assert [run["version"] for run in records("debounced")] == [2]  # one run: the latest


def _short_deadlock_timeout() -> None:
    """A deadlock costs this instead of a second: the test stays short even where the settles
    deadlock (where they did, before they took turns)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET deadlock_timeout = '50ms'")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("level", LEVELS, ids=lambda level: level or "default-level")
def test_the_settles_of_a_burst_take_turns(
    sent: list[str], caplog: pytest.LogCaptureFixture, level: str | None
) -> None:
    """At every isolation level a project may configure (``tests.isolation_levels``): at
    REPEATABLE READ a settle that waited its turn read a snapshot older than the previous
    settle's commit and failed to serialize, one after another (reactor_app/isolation.py)."""
    caplog.set_level(logging.WARNING, logger="reactor_app.managers")
    with at_level(level):
        _settle_bursts_at_once()
    victims = [r.getMessage() for r in caplog.records if "deadlock's victim" in r.getMessage()]
    assert victims == []


def _settle_bursts_at_once() -> None:
    for round_ in range(6):
        burst = f"turns-{round_}-{uuid.uuid4().hex[:8]}"
        started = starts_at_once(burst, 30.0, prepare=_short_deadlock_timeout)
        latest = bursts.starts(burst)[-1]
        rows = {
            str(row.pk): row for row in Execution.objects.filter(pk__in=[e.pk for e in started])
        }
        assert rows[latest].status == ExecutionStatus.PENDING
        for pk, row in rows.items():
            if pk != latest:
                assert (row.status, str(row.superseded_by_id)) == (
                    ExecutionStatus.SUPERSEDED,
                    latest,
                ), (round_, pk)


@pytest.mark.django_db(transaction=True)
def test_regression_a_late_settle_does_not_name_the_next_burst_s_start(
    sent: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the generated schedules (``test_debounce_schedules``) on a loaded machine: a
    start whose settle ran only after its burst had come due and a new burst had begun on the
    key was marked superseded by the new burst's start — its own burst's last start, and it
    never ran."""
    burst = f"next-{uuid.uuid4().hex[:8]}"
    held: list[tuple[debounce.Burst, list[str], str]] = []
    monkeypatch.setattr(debounce, "settle_on_commit", lambda *args: held.append(args))
    last_of_first = PlainRecompute.run_async(account_id=2, version=1, debounce=(burst, 0.05))
    monkeypatch.undo()
    time.sleep(0.1)  # its burst comes due (Redis clock, this machine): the next start opens one
    first_of_next = PlainRecompute.run_async(account_id=2, version=2, debounce=(burst, 0.05))
    assert bursts.starts(burst) == [str(first_of_next.pk)]
    (late,) = held
    debounce.settle(*late)  # the stalled process's hook, at last

    last_of_first.refresh_from_db()
    assert (last_of_first.status, last_of_first.superseded_by_id) == (
        ExecutionStatus.PENDING,
        None,
    )
    assert delivery.deliver(str(last_of_first.pk))["outcome"] == "succeeded"
    time.sleep(0.06)  # the next burst's start comes due
    assert delivery.deliver(str(first_of_next.pk))["outcome"] == "succeeded"
    # one run per burst, each its last start
    assert sorted(run["version"] for run in records("debounced")) == [1, 2]
