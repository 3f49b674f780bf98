"""OpenTelemetry spans per execution delivery and per step attempt, fed by signals.

Imported only when ``opentelemetry-api`` is installed (``reactor_app.metrics.install``). The
API alone records nothing: spans reach a backend once the project configures an SDK tracer
provider. A span covers one delivery of an execution (started or resumed, to succeeded, failed,
halted, parked, interrupted or cancelled), so a parked execution shows one span per delivery;
step spans are its children. A cancelled run's span ends with its status unset (a cancel is an
operator's decision, not an error of the run) and says who cancelled it and why. Spans are not
made current (no context is attached), so the protected work's own context is left alone.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from reactor_app import signals
from reactor_app.metrics import EXECUTION_ENDS, STEP_ENDS, Pending
from reactor_app.status import EngineEvent

TRACER_NAME = "reactor_app"

_EXECUTION_STARTS = {EngineEvent.EXECUTION_STARTED, EngineEvent.EXECUTION_RESUMED}
#: plain text: looking the member up on its enum, per event, costs more than the comparison
_STEP_STARTED: str = EngineEvent.STEP_STARTED.value

_executions = Pending()
_steps = Pending()


def _tracer() -> Any:
    """The tracer spans start on, or None while no tracer provider is configured.

    Looked up per event: the project may set its provider after reactor_app is ready. Until
    it does, the API's default provider hands out spans that record nothing; building them
    (attributes, contexts) on every engine event would be work for nothing, so none is built.
    """
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None
    return trace.get_tracer(TRACER_NAME)


def _error(span: Any, error: Any) -> None:
    message = error.get("message") if isinstance(error, dict) else str(error or "")
    span.set_status(Status(StatusCode.ERROR, message or None))
    if isinstance(error, dict) and error.get("type"):
        span.set_attribute("reactor.error.type", str(error["type"]))


def _cancelled(span: Any, error: Any) -> None:
    fields = error.fields() if hasattr(error, "fields") else {}
    for name in ("reason", "by"):
        if fields.get(name):
            span.set_attribute(f"reactor.cancel.{name}", str(fields[name]))


def on_engine_event(sender: Any, kind: str, execution: Any, **payload: Any) -> None:
    if kind in _EXECUTION_STARTS:
        tracer = _tracer()
        if tracer is None:
            return
        # a composed child runs inside its parent's delivery: its span is a child of the
        # parent's (an async child runs in a delivery of its own: a root span)
        parent_span = _executions.peek(execution.parent_id) if execution.parent_id else None
        span = tracer.start_span(
            f"reactor {execution.reactor_name}",
            context=trace.set_span_in_context(parent_span) if parent_span is not None else None,
            attributes={
                "reactor.path": execution.reactor,
                "reactor.execution_id": str(execution.pk),
                "reactor.resumed": kind == EngineEvent.EXECUTION_RESUMED,
            },
        )
        _executions.push(execution.pk, span)
        return
    status = EXECUTION_ENDS.get(kind)
    if status is not None:
        span = _executions.pop(execution.pk)
        if span is not None:
            span.set_attribute("reactor.status", status)
            if status == "failed":
                _error(span, payload.get("error"))
            elif status == "cancelled":
                # an operator's decision, not an error of the run: the span's status stays
                # unset, the reason and who asked are attributes
                _cancelled(span, payload.get("error"))
            span.end()
        return
    step_key = (execution.pk, payload.get("step"), payload.get("attempt"))
    if kind == _STEP_STARTED:
        tracer = _tracer()
        if tracer is None:
            return
        parent = _executions.peek(execution.pk)
        context = trace.set_span_in_context(parent) if parent is not None else None
        span = tracer.start_span(
            f"step {payload.get('step')}",
            context=context,
            attributes={
                "reactor.path": execution.reactor,
                "reactor.execution_id": str(execution.pk),
                "reactor.step": str(payload.get("step")),
                "reactor.attempt": int(payload.get("attempt") or 1),
            },
        )
        _steps.push(step_key, span)
        return
    outcome = STEP_ENDS.get(kind)
    if outcome is not None:
        span = _steps.pop(step_key)
        if span is not None:
            span.set_attribute("reactor.outcome", outcome)
            if outcome != "succeeded":
                _error(span, payload.get("error"))
            span.end()


def connect() -> None:
    signals.engine_event.connect(on_engine_event, dispatch_uid="reactor_app.metrics.tracing")
