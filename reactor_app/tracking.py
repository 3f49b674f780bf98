"""Recording what happened: engine and coordination events become signals and ORM rows.

``REACTOR_TRACKING = "full"`` records step runs and coordination events; ``"executions"``
records only the executions themselves (signals are always sent).

Signals are sent synchronously, on the thread where the event happens, with the payloads
documented below. The rows are written *behind* the work by ``write_behind.TrackingWriter``
(stamped when the event happens, written within ``REACTOR_TRACKING_FLUSH_INTERVAL``), so
neither a ``Step.call`` nor a step of a run waits on the database for its history. Operator
actions (``durable=True``) are written at once: an audit row must exist when the action
returns. ``flush()`` writes whatever is buffered (read-your-writes).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.utils import timezone

from reactor_app import signals
from reactor_app.conf import reactor_settings
from reactor_app.models import CoordinationEvent, Execution
from reactor_app.serialization import to_json
from reactor_app.signals import EventSignal
from reactor_app.status import EngineEvent, StepRunKind, StepRunStatus
from reactor_app.tracking_store import PendingStepRun
from reactor_app.write_behind import get_writer


def flush(*, finishing: Any = None) -> int:
    """Write this process's buffered tracking rows now (``write_behind.TrackingWriter.flush``)."""
    return get_writer().flush(finishing=finishing)


logger = logging.getLogger(__name__)
#: where Django's ``send_robust`` logs a failing receiver (``_send`` logs there too)
_dispatch_logger = logging.getLogger("django.dispatch")

# How each step-level engine event maps onto a StepRun row: (kind, status on finish)
_STEP_EVENTS: dict[str, tuple[str, str | None]] = {
    EngineEvent.STEP_STARTED: (StepRunKind.RUN, None),
    EngineEvent.STEP_SUCCEEDED: (StepRunKind.RUN, StepRunStatus.SUCCEEDED),
    EngineEvent.STEP_FAILED: (StepRunKind.RUN, StepRunStatus.FAILED),
    EngineEvent.STEP_RETRIED: (StepRunKind.RUN, StepRunStatus.RETRIED),
    EngineEvent.STEP_SKIPPED: (StepRunKind.RUN, StepRunStatus.SKIPPED),
    EngineEvent.COMPENSATION_STARTED: (StepRunKind.COMPENSATE, None),
    EngineEvent.COMPENSATION_SUCCEEDED: (StepRunKind.COMPENSATE, StepRunStatus.SUCCEEDED),
    EngineEvent.COMPENSATION_FAILED: (StepRunKind.COMPENSATE, StepRunStatus.FAILED),
    EngineEvent.UNDO_STARTED: (StepRunKind.UNDO, None),
    EngineEvent.UNDO_SUCCEEDED: (StepRunKind.UNDO, StepRunStatus.SUCCEEDED),
    EngineEvent.UNDO_FAILED: (StepRunKind.UNDO, StepRunStatus.FAILED),
}


def _send(signal: EventSignal, sender: type, payload: dict[str, Any]) -> None:
    """Deliver a signal to every receiver; a receiver that raises is logged, not propagated.

    Events are observations: a broken receiver must not break the protected work, leave a
    hold taken without its release, or leave an execution half-finished. What Django's
    ``send_robust`` does — its log record for a failing receiver included — without its
    per-send walk of the receivers (``EventSignal``); a signal with a coroutine receiver
    (Django 5) goes through ``send_robust`` itself, which runs those.

    Celery's soft time limit is not a receiver's failure: its signal handler raises it in
    whatever code the thread is running, a receiver's included, and it goes on up as it would
    from any other line, so the delivery stops as the limit asks (docs/operations.md, "Celery
    time limits"). Caught here, it would let the delivery run on past its soft limit, towards
    the hard one that kills its process.
    """
    if not signal.receivers:
        return
    receivers = signal.live_receivers(sender)
    if receivers is None:
        failures = [
            (receiver, response)
            for receiver, response in signal.send_robust(sender=sender, **payload)
            if isinstance(response, Exception)
        ]
        cut = next((e for _, e in failures if isinstance(e, SoftTimeLimitExceeded)), None)
        if cut is not None:
            raise cut
    else:
        failures = []
        for receiver in receivers:
            try:
                receiver(signal=signal, sender=sender, **payload)
            except SoftTimeLimitExceeded:
                raise
            except Exception as error:
                failures.append((receiver, error))
    for receiver, failure in failures:
        if receivers is not None:
            # what Django's send_robust logs for a failing receiver, as it did before
            _dispatch_logger.error(
                "Error calling %s in Signal.send_robust() (%s)",
                getattr(receiver, "__qualname__", repr(receiver)),
                failure,
                exc_info=failure,
            )
        logger.error(
            "receiver %r of %s raised %r",
            receiver,
            payload.get("kind"),
            failure,
            exc_info=(type(failure), failure, failure.__traceback__),
        )


def _copied(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else value


def full_tracking() -> bool:
    return reactor_settings.TRACKING == "full"


def emit_engine(kind: str, execution: Execution, **payload: Any) -> None:
    """Send the signals of one engine event."""
    payload = {"kind": kind, "execution": execution, **payload}
    _send(signals.signal_for(kind), Execution, payload)
    _send(signals.engine_event, Execution, payload)


_STARTED_EVENT = {
    StepRunKind.RUN: EngineEvent.STEP_STARTED,
    StepRunKind.COMPENSATE: EngineEvent.COMPENSATION_STARTED,
    StepRunKind.UNDO: EngineEvent.UNDO_STARTED,
}


class StepRecorder:
    """The StepRun row of one attempt, from its *started* event to its closing event.

    The row is a ``PendingStepRun`` of the write-behind buffer: *started* queues it (so a slow
    step shows as started within the freshness bound), the closing event updates it in place
    (one INSERT when both happen between two flushes).
    """

    def __init__(self, execution: Execution, step: str, kind: str, attempt: int) -> None:
        self.execution = execution
        self.step = step
        self.kind = kind
        self.attempt = attempt
        self.row: PendingStepRun | None = None

    def _new_row(self, **fields: Any) -> PendingStepRun:
        return PendingStepRun(
            {
                "execution_id": self.execution.pk,
                "step": self.step,
                "kind": self.kind,
                "attempt": self.attempt,
                **fields,
            }
        )

    def started(self, **detail: Any) -> None:
        if full_tracking():
            # a shallow copy: the writer makes it JSON later, and a body may change its args
            self.row = self._new_row(detail={k: _copied(v) for k, v in detail.items()})
            get_writer().update_step(
                self.row, status=StepRunStatus.STARTED, started_at=timezone.now()
            )
        emit_engine(
            _STARTED_EVENT[self.kind],  # type: ignore[index]
            self.execution,
            step=self.step,
            attempt=self.attempt,
        )

    def finished(self, event: str, error: dict[str, Any] | None = None, **detail: Any) -> None:
        _, status = _STEP_EVENTS[event]
        if full_tracking():
            now = timezone.now()
            if self.row is None:
                # A step skipped or parked before its body started still leaves a row.
                self.row = self._new_row(started_at=now, detail={})
            get_writer().update_step(
                self.row,
                status=status or StepRunStatus.STARTED,
                finished_at=now,
                error=error,
                detail={**(self.row.fields.get("detail") or {}), **detail},
            )
        emit_engine(
            event, self.execution, step=self.step, attempt=self.attempt, error=error, **detail
        )

    def parked(self, **detail: Any) -> None:
        if full_tracking():
            now = timezone.now()
            get_writer().update_step(
                self._new_row(
                    status=StepRunStatus.PARKED,
                    started_at=now,
                    finished_at=now,
                    detail=detail,
                )
            )


def record_coordination(
    kind: str,
    *,
    primitive: str,
    key: str,
    owner: str = "",
    step: str | None = None,
    reactor: str | None = None,
    execution_id: Any = None,
    token: int | None = None,
    durable: bool = False,
    at: datetime | None = None,
    **detail: Any,
) -> None:
    """Send the signals of one coordination event and store its ``CoordinationEvent`` row.

    ``execution_id`` must name an ``Execution`` row or be None (``Step.call`` owners are not
    executions). The row is stamped now — or ``at``, when the event happened earlier on
    another thread (a renewal) — and written behind (``write_behind``); ``durable`` rows
    (operator actions, their audit trail) are written before this returns, at every tracking
    level, and a failure to write one raises.
    """
    at = at or timezone.now()
    dedicated = signals.COORDINATION_SIGNALS[kind]
    catch_all = signals.coordination_event
    if dedicated.receivers or catch_all.receivers:
        payload = {
            "kind": kind,
            "primitive": primitive,
            "key": key,
            "owner": owner,
            "step": step,
            "reactor": reactor,
            "execution_id": str(execution_id) if execution_id else None,
            "token": token,
            "detail": detail,
        }
        _send(dedicated, CoordinationEvent, payload)  # most kinds have no receiver: a no-op
        _send(catch_all, CoordinationEvent, payload)
    if not durable:
        if full_tracking():
            # the row's values in EVENT_COLUMNS order; ``detail`` made JSON by the writer
            get_writer().add_event(
                (
                    execution_id or None,
                    step or "",
                    reactor or "",
                    primitive,
                    key,
                    kind,
                    owner or "",
                    token,
                    at,
                    detail,
                )
            )
        return
    # an operator action's audit row is written whatever the tracking level, before returning
    fields = {
        "execution_id": execution_id or None,
        "step": step or "",
        "reactor": reactor or "",
        "primitive": primitive,
        "key": key,
        "kind": kind,
        "owner": owner or "",
        "token": token,
        "at": at,
    }
    try:
        CoordinationEvent.objects.create(**{**fields, "detail": to_json(detail)})
    except Exception:
        # No protected work runs here: an operator's action was applied and its audit row
        # is missing. Say so to the operator (the error propagates), never report success.
        logger.exception("%s applied to %s, but its audit row could not be written", kind, key)
        raise
