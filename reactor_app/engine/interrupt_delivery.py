"""Continuing interrupted executions from outside: resume, and time-outs found by the sweep.

* ``resume`` / ``resume_by_correlation`` continue an interrupted execution with a payload as
  the interrupt step's result — inline, under the execution claim, or on a worker for a
  ``background`` reactor. The status change is made under a row lock, so of two concurrent
  resumes exactly one wins; a second resume of the same interrupt is refused.
* ``time_out_interrupt`` marks an overdue interrupt timed out and hands the execution to a
  worker, which fails the interrupt step and rolls back (``engine.sweeper.sweep`` calls it).

What the executor does at an interrupt (pausing, reading the payload back) is the executor's.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from reactor_app import isolation
from reactor_app.dsl.registry import is_base, lookup
from reactor_app.engine.claim import CLAIM_WAIT, ExecutionClaim, delivery_owner
from reactor_app.engine.enqueueing import enqueue_on_commit
from reactor_app.engine.executor import ExecutionRun, run_inline
from reactor_app.engine.outcomes import PassEnd
from reactor_app.engine.priority import message_priority
from reactor_app.engine.progress import load_state
from reactor_app.engine.result import Result
from reactor_app.engine.state import InterruptEntry
from reactor_app.exceptions import ExecutionNotResumable, InputNotSerializable
from reactor_app.models import Execution
from reactor_app.serialization import encode
from reactor_app.status import ExecutionStatus

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor


def resume(reactor: type[Reactor], execution_id: Any, *, step: str | None, payload: Any) -> Result:
    """Continue an interrupted execution with ``payload`` as the interrupt step's result.

    Inline, unless the reactor is ``background`` (then on a worker: ``handed_off``). The status
    change is made under a row lock, so of two concurrent resumes exactly one wins; the other
    (and any later one) gets ``ExecutionNotResumable``.
    """
    background = reactor.background is True
    claim: ExecutionClaim | None = None
    if not background:
        claim = ExecutionClaim(execution_id, delivery_owner("resume"))
        if not claim.acquire(wait=CLAIM_WAIT):
            raise ExecutionNotResumable(
                f"execution {execution_id} is being run by another process",
                execution_id=str(execution_id),
                step=step,
                status=None,
            )
    try:
        execution = _take_interrupt(reactor, execution_id, step, payload, background)
        if background:
            return Result(status=PassEnd.HANDED_OFF.value, execution_id=str(execution.id))
        assert claim is not None
        claim.start_renewal()
        run = ExecutionRun(lookup(execution.reactor), execution, dict(execution.inputs))
        run.on_persist = claim.check
        return run_inline(run)
    finally:
        if claim is not None:
            claim.release()


def _take_interrupt(
    reactor: type[Reactor], execution_id: Any, step: str | None, payload: Any, background: bool
) -> Execution:
    # The payload is the interrupt step's result, read back by later steps (in another process
    # too): kept in the state, which goes through the codec, so checked by it here as every
    # result is (``runner.storable``). It was stored as display JSON, and a Decimal reached the
    # next step as a str, a tuple as a list.
    try:
        encode(payload, where="the resume payload")
    except TypeError as exc:
        raise InputNotSerializable(
            f"cannot resume execution {execution_id}: {exc}",
            reactor=reactor.path(),
            step=step,
            field_errors={"payload": str(exc)},
        ) from exc
    with isolation.atomic():
        execution = Execution.objects.select_for_update().filter(pk=execution_id).first()
        if execution is None:
            raise ExecutionNotResumable(
                f"there is no execution {execution_id}",
                execution_id=str(execution_id),
                step=step,
                status=None,
            )
        if not is_base(reactor) and execution.reactor != reactor.path():
            raise ExecutionNotResumable(
                f"execution {execution_id} is a run of {execution.reactor}, not {reactor.path()}",
                execution_id=str(execution_id),
                step=step,
                status=execution.status,
            )
        waiting_at = execution.current_step
        state = load_state(execution)
        entry = (state.interrupts or {}).get(waiting_at)
        refusal = None
        if execution.status != ExecutionStatus.INTERRUPTED or entry is None:
            refusal = f"it is {execution.status}, not waiting at an interrupt"
        elif step is not None and step != waiting_at:
            refusal = f"it waits at interrupt {waiting_at!r}, not {step!r}"
        elif "payload" in entry:
            refusal = f"interrupt {waiting_at!r} was already resumed"
        elif deadline_passed(entry, timezone.now()):
            refusal = f"interrupt {waiting_at!r} timed out"
        if refusal is not None:
            raise ExecutionNotResumable(
                f"execution {execution_id} cannot be resumed: {refusal}",
                execution_id=str(execution_id),
                step=step or waiting_at,
                status=execution.status,
            )
        assert entry is not None  # refused above otherwise
        now = timezone.now()
        entry["payload"] = payload
        entry["resumed_at"] = now.isoformat()
        if background:
            state.origin.worker = True
        execution.context = state.to_json()
        execution.status = ExecutionStatus.PENDING if background else ExecutionStatus.RUNNING
        execution.heartbeat_at = now
        execution.save(update_fields=["context", "status", "heartbeat_at", "updated_at"])
        if background:
            enqueue_on_commit(execution.id, priority=message_priority(state.origin.priority))
    return execution


def resume_by_correlation(
    reactor: type[Reactor], correlation_id: str, *, step: str | None, payload: Any
) -> Result:
    """Resume the (oldest) execution of ``reactor`` paused under ``correlation_id``."""
    waiting = Execution.objects.waiting_on_interrupt(str(correlation_id))
    if not is_base(reactor):
        waiting = waiting.filter(reactor=reactor.path())
    if step is not None:
        waiting = waiting.filter(current_step=step)
    execution = waiting.order_by("created_at").first()
    if execution is None:
        raise ExecutionNotResumable(
            f"no execution of {reactor.path()} waits at an interrupt with correlation id "
            f"{correlation_id!r}",
            execution_id=None,
            step=step,
            status=None,
            correlation_id=str(correlation_id),
        )
    return resume(reactor, execution.id, step=step, payload=payload)


def deadline_passed(entry: InterruptEntry, now: datetime) -> bool:
    deadline = parse_datetime(entry.get("deadline") or "")
    return deadline is not None and deadline <= now


def time_out_interrupt(execution_id: Any, now: datetime) -> bool:
    """Mark the interrupt timed out and hand the execution to a worker, which fails the
    interrupt step and rolls back."""
    with isolation.atomic():
        execution = Execution.objects.select_for_update().filter(pk=execution_id).first()
        if execution is None or execution.status != ExecutionStatus.INTERRUPTED:
            return False
        state = load_state(execution)
        entry = (state.interrupts or {}).get(execution.current_step)
        if not entry or "payload" in entry or not deadline_passed(entry, now):
            return False
        entry["timed_out"] = True
        state.origin.worker = True
        execution.context = state.to_json()
        execution.status = ExecutionStatus.PENDING
        execution.heartbeat_at = now
        execution.save(update_fields=["context", "status", "heartbeat_at", "updated_at"])
        enqueue_on_commit(execution.id, priority=message_priority(state.origin.priority))
    return True
