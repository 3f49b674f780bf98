"""Interrupts: pause, resume (inline and on a worker), refusals, timeouts, definition checks."""

from __future__ import annotations

import threading
import time
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from reactor_app import Reactor, from_input, from_result, interrupt, step, with_lock
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Holder, LockClaim
from reactor_app.engine.dispatch import sweep
from reactor_app.exceptions import DefinitionError, ExecutionNotResumable, InputNotSerializable
from reactor_app.models import CoordinationEvent, Execution
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from reactor_app.testing import assert_not_locked
from tests.worker.reactors import (
    ApprovalReactor,
    ApprovalStep,
    AuditStep,
    BackgroundApprovalReactor,
    PrepareStep,
    TimedApprovalReactor,
    records,
)

pytestmark = [pytest.mark.django_db(transaction=True)]


@with_lock(lambda inputs: f"order:{inputs['order_id']}", ttl=30)
class UndoableApprovalReactor(Reactor):
    """ApprovalReactor whose step before the pause records its undo (``AuditStep``)."""

    inputs = ("order_id",)

    prepare = step(AuditStep, account_id=from_input("order_id"))
    approval = interrupt(correlation_id=lambda inputs: f"undoable-order:{inputs['order_id']}")
    apply = step(ApprovalStep, approval=from_result("approval"))

    returns = "apply"


def test_interrupt_pauses_and_resume_continues_inline() -> None:
    paused = ApprovalReactor.run(order_id=1)

    assert paused.status == ExecutionStatus.INTERRUPTED
    execution = Execution.objects.get(pk=paused.execution_id)
    assert execution.correlation_id == "order:1"
    assert execution.current_step == "approval"
    # the reactor-level lock is not held across the pause
    assert_not_locked("order:1")

    result = ApprovalReactor.resume(paused.execution_id, step="approval", payload={"by": "ann"})

    assert result.ok, result.error
    assert result.value == {"applied": {"by": "ann"}}
    assert len(records("prepare")) == 1  # the step before the pause did not run again
    # resume is a coordinated entry point: the reactor lock was taken again, then released
    acquired = CoordinationEvent.objects.filter(
        key="order:1", kind=CoordinationEventKind.ACQUIRED, step=""
    )
    assert acquired.count() == 2
    assert_not_locked("order:1")


def test_regression_a_resume_payload_reaches_the_next_step_as_the_same_values() -> None:
    """The payload is the interrupt step's result and goes through the codec like every
    result. It was stored as display JSON: a Decimal reached the next step as a str, a date
    as a str, a tuple as a list."""
    paused = ApprovalReactor.run(order_id=11)
    payload = {"amount": Decimal("10.50"), "on": date(2026, 1, 2), "pair": (1, "a")}
    result = ApprovalReactor.resume(paused.execution_id, step="approval", payload=payload)
    assert result.ok, result.error
    applied = result.value["applied"]
    assert applied == payload
    assert [type(applied[k]) for k in ("amount", "on", "pair")] == [Decimal, date, tuple]


def test_a_payload_the_codec_cannot_hold_is_refused_and_the_interrupt_still_waits() -> None:
    paused = ApprovalReactor.run(order_id=12)
    with pytest.raises(InputNotSerializable, match="the resume payload") as raised:
        ApprovalReactor.resume(paused.execution_id, step="approval", payload={"tags": {"a"}})
    assert "payload" in raised.value.field_errors
    assert Execution.objects.get(pk=paused.execution_id).status == ExecutionStatus.INTERRUPTED
    result = ApprovalReactor.resume(paused.execution_id, step="approval", payload={"by": "bo"})
    assert result.value == {"applied": {"by": "bo"}}


@pytest.mark.parametrize(
    ("correlation", "says"),
    [("c" * 256, "256 characters long, more than the 255"), ("order\0:1", "a NUL character")],
    ids=["256-characters", "nul"],
)
def test_regression_a_correlation_id_the_row_cannot_hold_fails_the_run_not_the_database(
    correlation: str, says: str
) -> None:
    """Before, the pause's write raised a raw ``DataError`` out of ``Reactor.run``."""

    class PausesOn(Reactor):
        approval = interrupt(correlation_id=lambda inputs: correlation)

    result = PausesOn.run()
    assert result.status == ExecutionStatus.FAILED
    assert says in result.error.message
    assert Execution.objects.get(pk=result.execution_id).status == ExecutionStatus.FAILED


def test_a_second_resume_is_refused() -> None:
    paused = ApprovalReactor.run(order_id=2)
    assert ApprovalReactor.resume(paused.execution_id, step="approval", payload=1).ok

    with pytest.raises(ExecutionNotResumable) as refused:
        ApprovalReactor.resume(paused.execution_id, step="approval", payload=2)

    assert refused.value.execution_id == paused.execution_id
    assert refused.value.status == ExecutionStatus.SUCCEEDED
    assert len(records("apply")) == 1


def test_concurrent_resumes_one_wins() -> None:
    paused = ApprovalReactor.run(order_id=3)
    outcomes: list[Any] = []

    def resume(payload: int) -> None:
        from django.db import connections

        try:
            outcomes.append(
                ApprovalReactor.resume(paused.execution_id, step="approval", payload=payload)
            )
        except ExecutionNotResumable as exc:
            outcomes.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=resume, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(type(o).__name__ for o in outcomes) == ["ExecutionNotResumable", "Result"]
    assert len(records("apply")) == 1


def test_resume_by_correlation_id_and_wrong_step() -> None:
    paused = ApprovalReactor.run(order_id=4)

    with pytest.raises(ExecutionNotResumable, match="waits at interrupt 'approval'"):
        ApprovalReactor.resume(paused.execution_id, step="prepare", payload=None)
    with pytest.raises(ExecutionNotResumable):
        ApprovalReactor.resume_by_correlation("order:nope", step="approval", payload=None)

    result = ApprovalReactor.resume_by_correlation("order:4", step="approval", payload="yes")
    assert result.ok and result.value == {"applied": "yes"}


def test_resume_waits_for_the_reactor_lock_then_fails_synchronously() -> None:
    """Resume re-takes reactor-level coordination; held elsewhere → the sync contention error,
    and the step completed before the pause is undone as for any failure."""
    paused = UndoableApprovalReactor.run(order_id=5)
    assert paused.status == ExecutionStatus.INTERRUPTED
    assert records("rollback") == []  # nothing undone by the pause itself
    coordinator = Coordinator()
    held = coordinator.admit([LockClaim("order:5", ttl=30)], Holder(owner="someone-else"))
    try:
        result = UndoableApprovalReactor.resume(paused.execution_id, step="approval", payload=1)
    finally:
        coordinator.release(held, "success")
    assert result.status == ExecutionStatus.FAILED
    assert result.error.key == "order:5"
    assert records("apply") == []  # the step after the interrupt never ran
    assert records("rollback") == [
        {"step": "audit", "kind": "undo", "execution": paused.execution_id}
    ]
    assert result.rollback_failures == []
    assert_not_locked("order:5")


@pytest.mark.worker
def test_background_interrupt_pauses_and_resumes_on_a_worker(worker: Any) -> None:
    handed = BackgroundApprovalReactor.run(order_id=6)
    assert handed.status == "handed_off"
    execution = Execution.objects.get(pk=handed.execution_id)
    paused = execution.wait(timeout=30)
    assert paused.status == ExecutionStatus.INTERRUPTED

    resumed = BackgroundApprovalReactor.resume_by_correlation(
        "bg-order:6", step="approval", payload={"ok": True, "amount": Decimal("1.25")}
    )
    assert resumed.status == "handed_off"
    with pytest.raises(ExecutionNotResumable):
        BackgroundApprovalReactor.resume(execution.id, step="approval", payload={"ok": False})

    final = execution.wait(timeout=30)
    assert final.ok, final.error
    # read back on the worker through the codec: the Decimal is a Decimal there too
    assert final.value == {"applied": {"ok": True, "amount": Decimal("1.25")}}
    assert type(final.value["applied"]["amount"]) is Decimal


@pytest.mark.worker
def test_an_interrupt_past_its_timeout_is_failed_by_the_sweeper(worker: Any) -> None:
    paused = TimedApprovalReactor.run(order_id=7)
    assert paused.status == ExecutionStatus.INTERRUPTED
    time.sleep(1.1)

    assert paused.execution_id in sweep(now=timezone.now() + timedelta(seconds=1))

    execution = Execution.objects.get(pk=paused.execution_id)
    final = execution.wait(timeout=30)
    assert final.status == ExecutionStatus.FAILED
    assert "not resumed within 1.0s" in final.error.message
    assert [r["step"] for r in records("rollback")] == ["audit"]  # rolled back
    with pytest.raises(ExecutionNotResumable):
        TimedApprovalReactor.resume(paused.execution_id, step="approval", payload=1)


def test_coordination_on_an_interrupt_step_is_refused_at_definition() -> None:
    with pytest.raises(DefinitionError) as refused:

        class Bad(Reactor):
            inputs = ("order_id",)

            prepare = step(PrepareStep, account_id=from_input("order_id"))
            approval = with_lock(lambda args: "k")(interrupt())

    message = refused.value.message
    assert "interrupt step" in message
    assert "Reactor class" in message and "reactor-level" in message
