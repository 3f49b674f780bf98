"""Ending a pass of the executor: its end written onto the execution row, the ``Result`` it gives.

``finish_pass`` writes the status a pass ended in (and what goes with it: the result, the error
and rollback failures, a park's requeue) in one statement, with the pass's buffered history
first (``ExecutionRun.persist``), and emits the matching engine event.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import TYPE_CHECKING

from django.utils import timezone

from reactor_app.conf import reactor_settings
from reactor_app.engine.outcomes import PassEnd, RunEnd
from reactor_app.engine.result import Result
from reactor_app.serialization import encode, to_json
from reactor_app.status import EngineEvent, ExecutionStatus
from reactor_app.tracking import emit_engine
from reactor_app.write_behind import get_writer

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun


def finish_pass(run: ExecutionRun, end: RunEnd) -> None:
    """Write the end of this pass onto the execution row and emit its event."""
    if run.park_on_contention or reactor_settings.TRACKING_FLUSH_ON_FINISH:
        # The pass's buffered step runs and events are written just before the row's final
        # write (persist): whoever sees the row's new status (a Result, execution.wait())
        # finds its history written too — in bulk, O(1) statements whatever the number of
        # steps (docs/operations.md).
        run.history_first = True
    else:
        # In-process with the flush turned off, the caller waits for none of its history
        # (written within the freshness bound); only the superseded progress is dropped.
        get_writer().forget_progress(run.execution.pk)
    now = timezone.now()
    if end.status == PassEnd.SUCCEEDED:
        run.persist(
            status=ExecutionStatus.SUCCEEDED,
            result=encode(end.value, strict=False, where="the result"),
            finished_at=now,
            current_step="",
        )
        emit_engine(EngineEvent.EXECUTION_SUCCEEDED, run.execution, value=end.value)
    elif end.status == PassEnd.HALTED:
        run.state.ending.halted, run.state.ending.halt_reason = True, end.reason
        run.persist(status=ExecutionStatus.HALTED, finished_at=now, **_where(run))
        emit_engine(EngineEvent.EXECUTION_HALTED, run.execution, reason=end.reason)
    elif end.status == PassEnd.FAILED:
        run.persist(
            status=ExecutionStatus.FAILED,
            error=end.error.as_dict() if end.error else None,
            rollback_failures=to_json(end.rollback_failures),
            finished_at=now,
            **_where(run),
        )
        emit_engine(EngineEvent.EXECUTION_FAILED, run.execution, error=end.error)
    elif end.status == PassEnd.CANCELLED:
        run.persist(
            status=ExecutionStatus.CANCELLED,
            error=end.error.as_dict() if end.error else None,
            rollback_failures=to_json(end.rollback_failures),
            finished_at=now,
            **_where(run),
        )
        emit_engine(EngineEvent.EXECUTION_CANCELLED, run.execution, error=end.error)
    elif end.status == PassEnd.PARKED:
        if run.requeue_in is not None:
            requeue_at = now + timedelta(seconds=run.requeue_in)
            run.state.continuation.requeue_at = requeue_at.isoformat()
        # names this park's countdown requeue, so that one left over from an earlier park
        # (the execution was woken and parked again meanwhile) is recognised and dropped
        run.state.continuation.requeue_token = uuid.uuid4().hex
        run.persist(status=ExecutionStatus.PARKED)
        emit_engine(EngineEvent.EXECUTION_PARKED, run.execution)
    elif end.status == PassEnd.INTERRUPTED:
        run.persist(
            status=ExecutionStatus.INTERRUPTED,
            correlation_id=run.execution.correlation_id,
            current_step=end.reason or run.execution.current_step,
        )
        emit_engine(EngineEvent.EXECUTION_INTERRUPTED, run.execution, step=end.reason)
    elif end.status == PassEnd.HANDED_OFF:
        # the worker that picks it up emits execution_resumed
        run.state.origin.worker = True
        run.persist(status=ExecutionStatus.PENDING)


def _where(run: ExecutionRun) -> dict[str, str]:
    """The step the run stopped at, written with its end.

    An in-process run writes its progress behind (``ExecutionRun.checkpoint``) and its final
    write drops what is still buffered, so without this the row would keep the step it was at
    when the progress was last flushed — often its first — while a worker run, which persists
    each step, shows the failing one. The run's own ``current_step`` is where it stopped.
    """
    step = run.execution.current_step
    return {"current_step": step} if step else {}


def result_of(run: ExecutionRun, end: RunEnd) -> Result:
    return Result(
        status=end.status.value,
        value=end.value if end.status == PassEnd.SUCCEEDED else None,
        error=end.error,
        execution_id=run.execution_id,
        rollback_failures=end.rollback_failures,
        halt_reason=end.reason if end.status == PassEnd.HALTED else None,
    )
