"""Cancelling executions in every state, with real Celery workers and real Redis.

* running: the worker inside a step that calls ``context.checkpoint()`` stops there, rolls
  back the completed step under its lock, releases the reactor-level lock and wakes the
  execution parked on it;
* parked (keeping its reactor-level lock across the park): ended at once by the canceller, the
  completed steps undone under their locks, the kept lock released, its waiter woken; it never
  runs again, even when the key it waited on frees;
* pending: never delivered into a run, its ordered-lock position abandoned (the next position
  goes at once, not after the poison-pill timeout);
* interrupted: ended, rolled back, and no longer resumable;
* an ended execution cannot be cancelled.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from django.db import transaction

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.engine.dispatch import wake
from reactor_app.exceptions import ExecutionNotCancellable, ExecutionNotResumable
from reactor_app.models import ContentionState, CoordinationEvent, Execution
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from reactor_app.testing import assert_not_locked, coordination_state
from tests.worker.cancel_reactors import (
    ApprovalReactor,
    CancellableReactor,
    InLineReactor,
)
from tests.worker.helpers import wait_until
from tests.worker.reactors import records

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# A parked execution is only back early when woken: backoffs far longer than the waits below.
WORKER_SETTINGS = {
    "REACTOR_CONTENTION_BACKOFF": [20.0, 40.0],
    "REACTOR_CONTENTION_CEILING": 10,
    "REACTOR_WORKER_WAIT": 0,
}


def ran(label: str, execution: Any) -> list[dict[str, Any]]:
    return [r for r in records(label) if r["execution"] == str(execution.id)]


def status(execution: Any) -> str:
    return str(Execution.objects.get(pk=execution.pk).status)


def parked_on(execution: Any, step: str) -> bool:
    return (
        status(execution) == ExecutionStatus.PARKED
        and ContentionState.objects.filter(execution_id=execution.pk, step=step).exists()
    )


def hold_lock(key: str) -> Admitted:
    admitted = Coordinator().admit([LockClaim(key, ttl=60)], Holder(owner="test-holder"))
    assert isinstance(admitted, Admitted), admitted
    return admitted


def audit_events(execution: Any) -> list[CoordinationEvent]:
    return list(
        CoordinationEvent.objects.filter(
            execution_id=execution.pk, kind=CoordinationEventKind.CANCELLED
        )
    )


def test_a_running_execution_stops_at_its_checkpoint_and_rolls_back_under_its_locks(
    worker: Any,
) -> None:
    key = uuid.uuid4().hex[:8]
    first = CancellableReactor.run_async(key=key, seconds=30)
    wait_until(lambda: ran("enter:work", first), 30, message="the work step never started")
    # an execution of the same exclusive workflow parks on its reactor-level lock
    waiter = CancellableReactor.run_async(key=key, seconds=0)
    wait_until(lambda: parked_on(waiter, ""), 30, message="the waiter never parked")
    (charge,) = ran("charge", first)

    began = time.monotonic()
    Execution.objects.get(pk=first.pk).cancel("customer asked", by="ops@example.com")
    result = first.wait(timeout=20)
    assert time.monotonic() - began < 10  # the checkpoint stopped it, not the 30 s body
    assert result.status == ExecutionStatus.CANCELLED and not result.ok
    assert result.error is not None and type(result.error).__name__ == "ExecutionCancelled"
    assert result.error.reason == "customer asked"  # type: ignore[attr-defined]
    assert result.error.by == "ops@example.com"  # type: ignore[attr-defined]
    assert result.rollback_failures == []

    row = Execution.objects.get(pk=first.pk)
    assert row.status == ExecutionStatus.CANCELLED and row.finished_at is not None
    # the step cut short was compensated, the completed one undone under its own lock (the
    # same fencing token the body had: re-taken for the undo by the rollback gate)
    assert ran("compensate:work", first)[0]["error"] == "ExecutionCancelled"
    (undo,) = ran("undo:charge", first)
    assert undo["token"] is not None and undo["token"] >= charge["token"]
    assert ran("work", first) == [] and ran("gated", first) == [] and ran("after", first) == []
    assert audit_events(first)[0].detail["reason"] == "customer asked"

    # the reactor-level lock was released and its waiter woken (its backoff is 20-40 s)
    assert waiter.wait(timeout=15).ok
    assert ran("after", waiter)
    assert_not_locked(f"cancel-flow:{key}")
    assert_not_locked(f"cancel-acct:{key}")


def test_a_parked_execution_is_ended_at_once_and_never_runs_again(worker: Any) -> None:
    key = uuid.uuid4().hex[:8]
    side = hold_lock(f"cancel-side:{key}")
    try:
        parked = CancellableReactor.run_async(key=key, seconds=0)
        wait_until(lambda: parked_on(parked, "gated"), 30, message="it never parked on 'gated'")
        # parked, it keeps the exclusive workflow's lock (docs/design.md §2.8)
        assert coordination_state().lock(f"cancel-flow:{key}").owner == str(parked.pk)
        waiter = CancellableReactor.run_async(key=key, seconds=0)
        wait_until(lambda: parked_on(waiter, ""), 30, message="the waiter never parked")

        row = Execution.objects.get(pk=parked.pk).cancel("duplicate order")
        # ended by the canceller itself, not by a later delivery
        assert row.status == ExecutionStatus.CANCELLED
        assert row.error["type"] == "ExecutionCancelled" and row.rollback_failures == []
        assert len(ran("undo:charge", parked)) == 1
        assert ran("undo:charge", parked)[0]["token"] is not None  # under its lock
        assert not ContentionState.objects.filter(execution_id=parked.pk).exists()
        # the kept reactor-level lock is gone and the waiter was woken
        assert not coordination_state().lock(f"cancel-flow:{key}").held or (
            coordination_state().lock(f"cancel-flow:{key}").owner == str(waiter.pk)
        )
        # woken at once (its backoff is 20-40 s): it runs up to the step lock the test holds
        wait_until(lambda: parked_on(waiter, "gated"), 15, message="the waiter was not woken")
    finally:
        wake(Coordinator().release(side, "success").woken)
    assert waiter.wait(timeout=15).ok
    # the key it waited on freed, its wake-up delivered: still it never ran again
    time.sleep(1.0)
    assert status(parked) == ExecutionStatus.CANCELLED
    assert ran("gated", parked) == [] and ran("after", parked) == []
    assert len(ran("undo:charge", parked)) == 1


def test_a_pending_execution_never_runs_and_leaves_its_ordered_place(worker: Any) -> None:
    key = uuid.uuid4().hex[:8]
    with transaction.atomic():
        # enqueued on commit: still pending when it is cancelled
        first = InLineReactor.run_async(key=key)
        assert status(first) == ExecutionStatus.PENDING
        row = Execution.objects.get(pk=first.pk).cancel("not needed")
        assert row.status == ExecutionStatus.CANCELLED
    second = InLineReactor.run_async(key=key)
    # the line moved past the cancelled position: no 60 s poison-pill wait
    began = time.monotonic()
    assert second.wait(timeout=20).ok
    assert time.monotonic() - began < 15
    time.sleep(0.5)  # the cancelled one's delivery came and went
    assert ran("after", first) == []
    assert status(first) == ExecutionStatus.CANCELLED


def test_an_interrupted_execution_is_rolled_back_and_cannot_be_resumed(worker: Any) -> None:
    key = uuid.uuid4().hex[:8]
    paused = ApprovalReactor.run(key=key)
    assert paused.status == ExecutionStatus.INTERRUPTED
    execution = Execution.objects.get(pk=paused.execution_id)
    execution.cancel("approval withdrawn")
    assert execution.status == ExecutionStatus.CANCELLED
    assert len(ran("undo:charge", execution)) == 1
    with pytest.raises(ExecutionNotResumable):
        ApprovalReactor.resume(execution.pk, step="approval", payload={"ok": True}).unwrap()
    assert ran("after", execution) == []


def test_an_ended_execution_cannot_be_cancelled(worker: Any) -> None:
    done = InLineReactor.run(key=uuid.uuid4().hex[:8])
    assert done.ok
    execution = Execution.objects.get(pk=done.execution_id)
    with pytest.raises(ExecutionNotCancellable) as raised:
        execution.cancel("too late")
    assert raised.value.status == ExecutionStatus.SUCCEEDED  # type: ignore[attr-defined]
    assert status(execution) == ExecutionStatus.SUCCEEDED
