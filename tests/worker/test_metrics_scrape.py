"""Prometheus metrics after a real contended run (issue 17, item 5).

Two executions on one lock key, delivered in this process (``deliver``, as a worker would):
the first parks in a step and keeps its reactor-level lock (docs/design.md §2.8), the second
is refused that lock and parks; a synchronous run on the same key, allowed no wait, is refused
and fails. The scrape is the real Django view (``reactor_app.metrics.urls``), read with
``prometheus_client``'s own text parser. Counters are process-wide and cumulative, so every
assertion is on the increase over a scrape taken before the run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client, override_settings
from django.urls import include, path
from prometheus_client.parser import text_string_to_metric_families

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.engine.dispatch import deliver, wake
from reactor_app.exceptions import CoordinationError
from reactor_app.metrics import installed
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.worker.reactors import ExclusiveReactor

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

REACTOR = f"{ExclusiveReactor.__module__}.{ExclusiveReactor.__qualname__}"

urlpatterns = [path("metrics/", include("reactor_app.metrics.urls"))]


@pytest.fixture
def in_process(settings: Any) -> Iterator[None]:
    """Deliveries run here; what they enqueue goes to a queue nobody reads."""
    settings.REACTOR_CELERY_QUEUE = f"reactor-nobody-{uuid.uuid4().hex[:8]}"
    settings.REACTOR_CONTENTION_BACKOFF = [0.01, 0.02]
    settings.REACTOR_CONTENTION_CEILING = 10
    settings.REACTOR_WORKER_WAIT = 0
    yield


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the metrics view: (name, sorted labels) -> value."""
    with override_settings(ROOT_URLCONF=__name__):
        response = Client().get("/metrics/")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def grew(before: dict[Any, float], after: dict[Any, float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def hold_lock(key: str) -> Admitted:
    admitted = Coordinator().admit([LockClaim(key, ttl=60)], Holder(owner="test-holder"))
    assert isinstance(admitted, Admitted), admitted
    return admitted


def test_a_contended_run_is_counted_in_the_scraped_metrics(in_process: None) -> None:
    assert installed() == {"prometheus": True, "opentelemetry": True}
    before = scrape()
    step_lock = hold_lock("side:71")
    try:
        # the first execution parks on its step lock, keeping the reactor lock excl:71
        first = ExclusiveReactor.run_async(key=71, side=71)
        assert deliver(str(first.id))["outcome"] == "parked"
        # the second wants excl:71 too: refused, parked
        second = ExclusiveReactor.run_async(key=71, side=72)
        assert deliver(str(second.id))["outcome"] == "parked"
        # a synchronous run (the lock waits 0 s by default): refused, failed
        with pytest.raises(CoordinationError):
            ExclusiveReactor.run(key=71, side=73).unwrap()
    finally:
        wake(Coordinator().release(step_lock, "success").woken)
    # both resume now that the contention is gone, one after the other
    assert deliver(str(first.id))["outcome"] == "succeeded"
    assert deliver(str(second.id))["outcome"] == "succeeded"
    for execution in (first, second):
        execution.refresh_from_db()
        assert execution.status == ExecutionStatus.SUCCEEDED
    after = scrape()

    # parks: the first on its step's lock, the second on the reactor lock
    assert grew(before, after, "reactor_parks_total", primitive="lock") == 2
    assert grew(before, after, "reactor_refusals_total", primitive="lock", outcome="parked") == 2
    assert grew(before, after, "reactor_refusals_total", primitive="lock", outcome="failed") == 1
    # excl:71 twice, side:71 and side:72 once each (the refused attempts admitted nothing)
    assert grew(before, after, "reactor_admissions_total", primitive="lock") == 4
    assert grew(before, after, "reactor_executions_total", reactor=REACTOR, status="parked") == 2
    assert grew(before, after, "reactor_executions_total", reactor=REACTOR, status="succeeded") == 2
    assert grew(before, after, "reactor_executions_total", reactor=REACTOR, status="failed") == 1
    # both resumes came from a park that recorded its time
    assert grew(before, after, "reactor_wake_latency_seconds_count", primitive="lock") == 2
    # holds acquired and released by deliveries of this process (excl:71 of the first was
    # kept across its park and adopted by the next delivery: still seen here)
    assert grew(before, after, "reactor_hold_duration_seconds_count", primitive="lock") == 4
    for step in ("audit", "side"):
        labels = {"reactor": REACTOR, "step": step, "outcome": "succeeded"}
        assert grew(before, after, "reactor_step_duration_seconds_count", **labels) == 2
    assert Execution.objects.filter(reactor=REACTOR, status=ExecutionStatus.FAILED).count() == 1
