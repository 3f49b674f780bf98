"""A cancelled run is observed like any other end (issue 30, item 4).

The run cancels itself from its first step's body (``request_cancel``, as an operator's cancel
from another process does: the flag in Redis) and stops at the next step boundary. Its
OpenTelemetry span must be ended — so the SDK exports it — and ``reactor_executions_total``
must count it under ``status="cancelled"``. Before, the end-event tables of
``reactor_app.metrics`` had no entry for ``execution_cancelled``: the span stayed open (never
exported) and the run was counted nowhere.

Spans go through the real OpenTelemetry SDK (a ``TracerProvider`` with the in-memory exporter);
the metrics through the real ``/metrics/`` view, read with ``prometheus_client``'s own parser.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client, override_settings
from django.urls import include, path
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client.parser import text_string_to_metric_families

from reactor_app import Reactor, Step, Success, step
from reactor_app.engine.cancel_flag import request_cancel
from reactor_app.metrics import installed, tracing
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus

pytestmark = pytest.mark.django_db(transaction=True)

urlpatterns = [path("metrics/", include("reactor_app.metrics.urls"))]

#: the steps whose bodies ran, in order
RAN: list[str] = []


class CancelsItsRun(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        RAN.append("first")
        request_cancel(context.root_execution_id, "stock count", by="ops")
        return Success("counted")


class NeverReached(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        RAN.append("second")
        return Success("late")


class CancelledMidway(Reactor):
    first = step(CancelsItsRun)
    second = step(NeverReached)


PATH = CancelledMidway.path()


def run_cancelled() -> Any:
    RAN.clear()
    result = CancelledMidway.run()
    assert result.status == ExecutionStatus.CANCELLED, result
    assert RAN == ["first"]  # stopped at the boundary after the cancel
    return result


def test_a_cancelled_runs_span_is_ended_and_exported(monkeypatch: pytest.MonkeyPatch) -> None:
    assert installed()["opentelemetry"]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # the project's SDK provider, without making it the process-wide one (settable only once)
    monkeypatch.setattr(tracing, "_tracer", lambda: provider.get_tracer(tracing.TRACER_NAME))

    result = run_cancelled()

    spans = {span.name: span for span in exporter.get_finished_spans()}
    run_span = spans.get("reactor CancelledMidway")
    assert run_span is not None, f"the run's span was not exported: {sorted(spans)}"
    assert run_span.attributes is not None
    assert run_span.attributes["reactor.execution_id"] == result.execution_id
    assert run_span.attributes["reactor.status"] == "cancelled"
    assert run_span.attributes["reactor.cancel.reason"] == "stock count"
    assert run_span.attributes["reactor.cancel.by"] == "ops"
    # an operator's decision, not an error of the run
    assert run_span.status.status_code == StatusCode.UNSET
    # the step that ran is its child, ended too
    first = spans["step first"]
    assert first.parent is not None and first.parent.span_id == run_span.context.span_id
    assert "step second" not in spans


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with override_settings(ROOT_URLCONF=__name__):
        response = Client().get("/metrics/")
    assert response.status_code == 200, response.content
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_a_cancelled_run_is_counted_in_the_scraped_metrics() -> None:
    assert installed()["prometheus"]
    key = ("reactor_executions_total", (("reactor", PATH), ("status", "cancelled")))
    before = scrape().get(key, 0.0)

    result = run_cancelled()

    assert scrape().get(key, 0.0) - before == 1
    row = Execution.objects.get(pk=result.execution_id)
    assert row.status == ExecutionStatus.CANCELLED
