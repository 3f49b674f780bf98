"""The metrics integrations are optional: absent packages cost nothing, present ones report.

* A child process where ``prometheus_client`` and ``opentelemetry`` cannot be imported (a
  meta-path finder refuses them before anything else is imported) sets Django up, runs a
  coordinated reactor, and shows neither was imported nor any receiver connected.
* With ``opentelemetry-api`` installed, each execution delivery and each step attempt is a span
  (a recording tracer stands in for an SDK, which this project does not depend on).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN_CONTEXT, NonRecordingSpan, StatusCode

from reactor_app import Reactor, compose, from_input
from reactor_app.metrics import installed, tracing
from tests.conftest import PROJECT_ROOT
from tests.worker.reactors import ExclusiveFailingReactor, ExclusiveReactor

CHILD = textwrap.dedent(
    """
    import importlib.abc, json, sys

    BLOCKED = ("prometheus_client", "opentelemetry")

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Block())
    try:
        import prometheus_client  # noqa: F401
        raise SystemExit("the import blocker did not block")
    except ModuleNotFoundError:
        pass

    import django
    django.setup()

    from reactor_app import signals
    from reactor_app.metrics import installed
    from tests.worker.reactors import ExclusiveReactor

    result = ExclusiveReactor.run(key=91, side=91)
    receivers = [
        repr(r) for s in (signals.engine_event, signals.coordination_event) for r in s.receivers
    ]
    from django.test import Client
    from django.test.utils import override_settings
    with override_settings(ROOT_URLCONF="reactor_app.metrics.urls"):
        view = Client().get("/").status_code
    print(json.dumps({
        "status": result.status,
        "installed": installed(),
        "imported": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED),
        "metrics_receivers": [r for r in receivers if "metrics" in r],
        "view": view,
    }))
    """
)


@pytest.mark.django_db(transaction=True)
def test_the_library_runs_with_neither_package_importable(
    subprocess_env: Callable[..., dict[str, str]],
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PROJECT_ROOT,
        env=subprocess_env(),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {
        "status": "succeeded",
        "installed": {"prometheus": False, "opentelemetry": False},
        "imported": [],
        "metrics_receivers": [],
        "view": 501,
    }


class RecordingSpan(NonRecordingSpan):
    """A span that keeps what the receivers told it (the API's own spans record nothing)."""

    def __init__(self, name: str, context: Any, attributes: dict[str, Any]) -> None:
        super().__init__(INVALID_SPAN_CONTEXT)
        self.name = name
        self.parent = context
        self.attributes = dict(attributes)
        self.status: Any = None
        self.ended = False

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def set_status(self, status: Any, description: str | None = None) -> None:
        self.status = status

    def end(self, end_time: int | None = None) -> None:
        self.ended = True


class RecordingTracer:
    def __init__(self) -> None:
        self.spans: list[RecordingSpan] = []

    def start_span(
        self, name: str, context: Any = None, attributes: dict[str, Any] | None = None
    ) -> RecordingSpan:
        span = RecordingSpan(name, context, attributes or {})
        self.spans.append(span)
        return span


class ComposingReactor(Reactor):
    inputs = ("key", "side")

    inner = compose(ExclusiveReactor, key=from_input("key"), side=from_input("side"))


@pytest.mark.django_db(transaction=True)
def test_each_execution_and_step_is_a_span(monkeypatch: pytest.MonkeyPatch) -> None:
    assert installed()["opentelemetry"]
    tracer = RecordingTracer()
    monkeypatch.setattr(tracing, "_tracer", lambda: tracer)

    ok = ExclusiveReactor.run(key=92, side=92)
    assert ok.status == "succeeded"
    execution, *steps = tracer.spans
    assert execution.name == "reactor ExclusiveReactor"
    assert execution.attributes["reactor.execution_id"] == ok.execution_id
    assert execution.attributes["reactor.status"] == "succeeded"
    assert [s.name for s in steps] == ["step audit", "step side"]
    assert all(span.ended for span in tracer.spans)
    # steps are children of their execution's span
    assert all(trace.get_current_span(s.parent) is execution for s in steps)

    tracer.spans.clear()
    failed = ExclusiveFailingReactor.run(key=93, side=93)
    assert failed.status == "failed"
    execution = tracer.spans[0]
    assert execution.attributes["reactor.status"] == "failed"
    assert execution.status.status_code == StatusCode.ERROR
    failing = [s for s in tracer.spans[1:] if s.attributes.get("reactor.outcome") == "failed"]
    assert failing and failing[0].status.status_code == StatusCode.ERROR
    assert all(span.ended for span in tracer.spans)


@pytest.mark.django_db(transaction=True)
def test_a_composed_child_execution_span_is_a_child_of_its_parents(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracer = RecordingTracer()
    monkeypatch.setattr(tracing, "_tracer", lambda: tracer)
    assert ComposingReactor.run(key=94, side=94).status == "succeeded"
    names = [span.name for span in tracer.spans]
    outer = tracer.spans[names.index("reactor ComposingReactor")]
    inner = tracer.spans[names.index("reactor ExclusiveReactor")]
    assert outer.parent is None
    assert trace.get_current_span(inner.parent) is outer
    assert all(span.ended for span in tracer.spans)
