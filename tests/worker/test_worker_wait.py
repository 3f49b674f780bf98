"""A worker delivery that meets contention waits briefly in-process before it parks.

Six worker processes (``celery worker -c 6``) with ``REACTOR_WORKER_WAIT = 3``:

* a waiter is woken by the release itself and starts its body at once — long before any park
  backoff could have fired (20 s here) — and never parks;
* a waiter whose budget runs out parks (it does not fail) and is woken by a later release;
* five waiters on one key are served in the order they queued (one order for waiting and
  parked waiters: a freed lock is granted to the head waiter);
* a waiting delivery holds nothing: the key stays its holder's alone, and another key's work
  runs on the other worker processes meanwhile.
"""

from __future__ import annotations

import itertools
import statistics
import time
from typing import Any

import pytest

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.engine.dispatch import wake
from reactor_app.models import ContentionState, CoordinationEvent, Execution
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from reactor_app.testing import assert_not_locked, coordination_state
from tests.worker.helpers import overlapping, wait_until
from tests.worker.reactors import records
from tests.worker.trust_reactors import QueuedReactor

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = {
    "REACTOR_WORKER_WAIT": 3.0,
    "REACTOR_CONTENTION_BACKOFF": [20.0, 40.0],
    "REACTOR_CONTENTION_CEILING": 20,
}


@pytest.fixture(scope="module")
def celery_worker_concurrency() -> int:
    return 6


def hold(key: str) -> Admitted:
    admitted = Coordinator().admit([LockClaim(key, ttl=60)], Holder(owner="test-holder"))
    assert isinstance(admitted, Admitted), admitted
    return admitted


def release(admitted: Admitted) -> None:
    wake(Coordinator().release(admitted, "success").woken)


def waiting(key: str) -> list[str]:
    return Coordinator().waiters(LockClaim(key))


def test_a_waiter_is_woken_by_the_release_and_never_parks(worker: Any) -> None:
    first = QueuedReactor.run_async(key="w1", hold=0.5)
    wait_until(lambda: records("enter:queued"), 20, message="the first never entered")
    second = QueuedReactor.run_async(key="w1", hold=0.05)
    for execution in (first, second):
        assert execution.wait(timeout=30).ok
    runs = sorted(records("queued"), key=lambda r: r["start"])
    assert [r["execution"] for r in runs] == [str(first.id), str(second.id)]
    assert overlapping(runs) == []
    handoff_ms = (runs[1]["start"] - runs[0]["end"]) / 1e6
    # woken by the release, not by a park's requeue (whose backoff starts at 10 s here)
    assert handoff_ms < 5000, handoff_ms
    assert not ContentionState.objects.filter(execution=second).exists()
    print(f"\nrelease -> next body start on a worker: {handoff_ms:.1f} ms")


def test_a_waiter_whose_budget_runs_out_parks_and_is_woken_later(worker: Any) -> None:
    held = hold("queue:w2")
    try:
        execution = QueuedReactor.run_async(key="w2", hold=0.05)
        began = time.monotonic()
        state = wait_until(
            lambda: ContentionState.objects.filter(execution=execution).first(),
            20,
            message="the waiter never parked",
        )
        assert time.monotonic() - began >= 2.5  # it waited its budget first
        assert state.attempts == 1 and state.key == "queue:w2"
        # the contention row is written as the pass parks; the row's status follows when the
        # delivery finishes that pass
        wait_until(
            lambda: Execution.objects.get(pk=execution.pk).status == ExecutionStatus.PARKED,
            10,
            message="the waiter's execution never became parked",
        )
        assert waiting("queue:w2") == [str(execution.id)]  # parked, keeping its turn
    finally:
        release(held)
    result = execution.wait(timeout=15)  # woken by the release, far before its 10-20 s backoff
    assert result.ok, result.error
    assert [r["execution"] for r in records("queued")] == [str(execution.id)]


def test_five_waiters_on_one_key_are_served_in_the_order_they_queued(worker: Any) -> None:
    held = hold("queue:w3")
    executions = []
    try:
        for n in range(5):
            executions.append(QueuedReactor.run_async(key="w3", hold=0.1))
            wait_until(
                lambda n=n: len(waiting("queue:w3")) == n + 1,
                20,
                message=f"waiter {n} never queued",
            )
        assert waiting("queue:w3") == [f"wait:{e.id}" for e in executions]
    finally:
        release(held)
    for execution in executions:
        assert execution.wait(timeout=30).ok
    runs = sorted(records("queued"), key=lambda r: r["start"])
    assert [r["execution"] for r in runs] == [str(e.id) for e in executions]
    assert overlapping(runs) == []
    gaps = [(b["start"] - a["end"]) / 1e6 for a, b in itertools.pairwise(runs)]
    print(f"\nhand-offs between five waiters, ms: median {statistics.median(gaps):.1f}")
    assert not ContentionState.objects.filter(execution__in=executions).exists()
    assert_not_locked("queue:w3")


def test_a_waiting_delivery_holds_nothing_and_blocks_no_other_key(worker: Any) -> None:
    held = hold("queue:w4")
    try:
        blocked = QueuedReactor.run_async(key="w4", hold=0.05)
        wait_until(lambda: waiting("queue:w4"), 20, message="the waiter never queued")
        other = QueuedReactor.run_async(key="w5", hold=0.05)
        assert other.wait(timeout=20).ok  # ran on another process while w4's waiter waits
        assert waiting("queue:w4") == [f"wait:{blocked.id}"]
        lock = coordination_state().lock("queue:w4")
        assert (lock.owner, lock.count) == ("test-holder", 1)
        assert not CoordinationEvent.objects.filter(
            execution=blocked, kind=CoordinationEventKind.ACQUIRED
        ).exists()
    finally:
        release(held)
    assert blocked.wait(timeout=20).ok
