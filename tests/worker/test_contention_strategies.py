"""``on_contention`` on real workers: what a unit does when its lock is taken.

A ``Holding`` execution keeps ``strategy:<key>`` (its body loops until the test releases it, or
until it is cancelled); a newcomer meets it with each strategy. What ran, what was undone and
when is recorded by the bodies (``records``); the decisions are coordination events.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, SemaphoreClaim
from reactor_app.coordination.redis import get_client
from reactor_app.models import CoordinationEvent, Execution, StepRun
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from reactor_app.testing import assert_not_locked, within_freshness_bound
from tests.worker.contention_reactors import (
    CancelInProgress,
    CancelNewest,
    Holding,
    SkipNewcomer,
    SlotBody,
)
from tests.worker.helpers import overlapping, wait_until
from tests.worker.reactors import records, trace_key

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = {"REACTOR_CONTENTION_BACKOFF": [0.1, 0.5], "REACTOR_CANCEL_POLL": 0.1}


def holding(key: str) -> Execution:
    """A worker execution holding ``strategy:<key>`` until ``release(key)``."""
    execution = Holding.run_async(key=key)
    wait_until(
        lambda: any(r["key"] == key for r in records("hold-enter")),
        60,
        message="the holder did not take the key",
    )
    return execution


def release(key: str) -> None:
    get_client().rpush(trace_key(f"release:{key}"), "go")


def decisions(key: str) -> list[dict[str, Any]]:
    return [
        event.detail
        for event in CoordinationEvent.objects.filter(
            key=f"strategy:{key}", kind=CoordinationEventKind.ACQUISITION_FAILED
        )
    ]


def test_skip_runs_the_rest_of_the_workflow_without_the_contended_step(worker: Any) -> None:
    key = uuid.uuid4().hex[:8]
    holder = holding(key)
    result = SkipNewcomer.run_async(key=key).wait(timeout=60)
    assert result.ok, result.error
    assert records("skip-body") == []  # the body never ran
    assert [r["key"] for r in records("after")] == [key]
    run = StepRun.objects.get(execution_id=result.execution_id, step="body")
    assert (run.status, run.detail.get("reason")) == ("skipped", "contended")
    assert [d.get("on_contention") for d in decisions(key)] == ["skip"]
    release(key)
    assert holder.wait(timeout=60).ok


def test_cancel_newest_cancels_the_newcomer_and_undoes_its_completed_steps(worker: Any) -> None:
    key = uuid.uuid4().hex[:8]
    holder = holding(key)
    newcomer = CancelNewest.run_async(key=key)
    result = newcomer.wait(timeout=60)
    assert result.status == ExecutionStatus.CANCELLED, result.error
    assert "cancel_newest" in str(result.error)
    assert records("newest-body") == [] and records("after") == []
    assert [r["execution"] for r in records("audit-undo")] == [str(newcomer.id)]  # once
    assert [d.get("on_contention") for d in decisions(key)] == ["cancel_newest"]
    release(key)
    assert holder.wait(timeout=60).ok  # the holder was left alone


def test_cancel_in_progress_cancels_the_holder_then_takes_its_place(worker: Any) -> None:
    key = uuid.uuid4().hex[:8]
    holder = holding(key)
    replacement = CancelInProgress.run_async(key=key)

    assert replacement.wait(timeout=90).ok
    held = holder.wait(timeout=60)
    assert held.status == ExecutionStatus.CANCELLED
    assert [r["execution"] for r in records("audit-undo")] == [str(holder.id)]  # rolled back
    [hold] = records("hold")
    [replacing] = records("replacing-body")
    assert overlapping([hold, replacing]) == []  # the replacement ran once the holder let go
    [decision] = decisions(key)
    assert decision["on_contention"] == "cancel_in_progress"
    assert decision["cancelled"] == str(holder.id)
    cancelled = within_freshness_bound(
        lambda: list(
            CoordinationEvent.objects.filter(
                kind=CoordinationEventKind.CANCELLED, key=str(holder.id)
            )
        )
    )
    assert cancelled and cancelled[0].detail["by"] == "on_contention"
    assert_not_locked(f"strategy:{key}")


def test_a_skipping_semaphore_in_process_skips_while_its_slot_is_taken() -> None:
    key = uuid.uuid4().hex[:8]
    coordinator = Coordinator()
    other = Holder(owner="someone-else", execution_id=None, reactor="")
    taken = coordinator.admit([SemaphoreClaim(key=f"strategy-slots:{key}", limit=1, ttl=30)], other)
    assert isinstance(taken, Admitted)
    try:
        skipped = SlotBody.call(key=key)  # the only slot is someone else's: skipped at once
        assert skipped.ok and records("slot-body") == []
    finally:
        coordinator.release(taken, "success")
    assert SlotBody.call(key=key).ok
    assert [r["key"] for r in records("slot-body")] == [key]
