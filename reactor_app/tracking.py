"""Recording what happened: engine and coordination events become signals and ORM rows.

``REACTOR_TRACKING = "full"`` records step runs and coordination events; ``"executions"``
records only the executions themselves (signals are always sent).
"""

from __future__ import annotations

import logging
from typing import Any

from django.utils import timezone

from reactor_app import signals
from reactor_app.conf import reactor_settings
from reactor_app.models import CoordinationEvent, Execution, StepRun
from reactor_app.serialization import to_json
from reactor_app.status import EngineEvent, StepRunKind, StepRunStatus

logger = logging.getLogger(__name__)

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


def _send(signal: Any, sender: type, payload: dict[str, Any]) -> None:
    """Deliver a signal to every receiver; a receiver that raises is logged, not propagated.

    Events are observations: a broken receiver must not break the protected work, leave a
    hold taken without its release, or leave an execution half-finished.
    """
    for receiver, response in signal.send_robust(sender=sender, **payload):
        if isinstance(response, Exception):
            logger.error(
                "receiver %r of %s raised %r",
                receiver,
                payload.get("kind"),
                response,
                exc_info=(type(response), response, response.__traceback__),
            )


def full_tracking() -> bool:
    return reactor_settings.TRACKING == "full"


def emit_engine(kind: str, execution: Execution, **payload: Any) -> None:
    """Send the signals of one engine event."""
    payload = {"kind": kind, "execution": execution, **payload}
    _send(signals.signal_for(kind), Execution, payload)
    _send(signals.engine_event, Execution, payload)


class StepRecorder:
    """The StepRun row of one attempt, from its *started* event to its closing event."""

    def __init__(self, execution: Execution, step: str, kind: str, attempt: int) -> None:
        self.execution = execution
        self.step = step
        self.kind = kind
        self.attempt = attempt
        self.row: StepRun | None = None

    def started(self, **detail: Any) -> None:
        started_kind = {
            StepRunKind.RUN: EngineEvent.STEP_STARTED,
            StepRunKind.COMPENSATE: EngineEvent.COMPENSATION_STARTED,
            StepRunKind.UNDO: EngineEvent.UNDO_STARTED,
        }[self.kind]  # type: ignore[index]
        if full_tracking():
            self.row = StepRun.objects.create(
                execution=self.execution,
                step=self.step,
                kind=self.kind,
                attempt=self.attempt,
                status=StepRunStatus.STARTED,
                started_at=timezone.now(),
                detail=to_json(detail),
            )
        emit_engine(started_kind, self.execution, step=self.step, attempt=self.attempt)

    def finished(self, event: str, error: dict[str, Any] | None = None, **detail: Any) -> None:
        _, status = _STEP_EVENTS[event]
        if full_tracking():
            now = timezone.now()
            if self.row is None:
                # A step skipped or parked before its body started still leaves a row.
                self.row = StepRun(
                    execution=self.execution,
                    step=self.step,
                    kind=self.kind,
                    attempt=self.attempt,
                    started_at=now,
                )
            self.row.status = status or StepRunStatus.STARTED
            self.row.finished_at = now
            self.row.error = to_json(error)
            self.row.detail = to_json({**(self.row.detail or {}), **detail})
            if self.row.pk is None:
                self.row.save(force_insert=True)
            else:  # the closing write of every step: only what changed
                self.row.save(update_fields=["status", "finished_at", "error", "detail"])
        emit_engine(
            event, self.execution, step=self.step, attempt=self.attempt, error=error, **detail
        )

    def parked(self, **detail: Any) -> None:
        if full_tracking():
            now = timezone.now()
            StepRun.objects.create(
                execution=self.execution,
                step=self.step,
                kind=self.kind,
                attempt=self.attempt,
                status=StepRunStatus.PARKED,
                started_at=now,
                finished_at=now,
                detail=to_json(detail),
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
    **detail: Any,
) -> None:
    """Send the signals of one coordination event and store its ``CoordinationEvent`` row.

    ``execution_id`` must name an ``Execution`` row or be None (``Step.call`` owners are not
    executions).
    """
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
    _send(signals.signal_for(kind), CoordinationEvent, payload)
    _send(signals.coordination_event, CoordinationEvent, payload)
    if not full_tracking():
        return
    try:
        CoordinationEvent.objects.create(
            execution_id=execution_id or None,
            step=step or "",
            reactor=reactor or "",
            primitive=primitive,
            key=key,
            kind=kind,
            owner=owner or "",
            token=token,
            at=timezone.now(),
            detail=to_json(detail),
        )
    except Exception:  # pragma: no cover - history must never break the protected work
        logger.exception("could not record coordination event %s for %s", kind, key)
