"""A ``django.tasks`` priority reaches the broker: queued behind busy workers, a higher
priority call runs first (``reactor_app.engine.priority.celery_priority``).

A module of its own, so a worker of its own: Celery raises a worker's prefetch while it holds
a countdown message (as ``run_after`` and parks send) and lowers it again only eventually, so a
worker that held one may have reserved a message more than the test expects.
"""

from __future__ import annotations

from typing import Any

import pytest
from django_tasks import TaskResultStatus

from reactor_app.coordination.redis import get_client
from tests.worker import task_functions as tasks
from tests.worker.helpers import finished, wait_until
from tests.worker.reactors import records, trace_key

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_a_higher_priority_task_queued_behind_busy_workers_runs_first(worker: Any) -> None:
    # Both worker processes busy (acks late, prefetch 1: nothing more is reserved), then low
    # and high priority calls queue up alternately; once free, the workers take the high ones.
    blockers = [tasks.blocker.enqueue(name) for name in ("a", "b")]
    wait_until(lambda: len(records("blocking")) == 2, 60, message="the blockers did not start")
    queued = []
    for index in range(3):
        queued.append(tasks.ordered.using(priority=-80).enqueue(f"low-{index}"))
        queued.append(tasks.ordered.using(priority=80).enqueue(f"high-{index}"))
    client = get_client()
    for name in ("a", "b"):
        client.rpush(trace_key(f"release:{name}"), "go")
    for result in [*blockers, *queued]:
        assert finished(result, timeout=120).status == TaskResultStatus.SUCCESSFUL
    order = [r["label"] for r in sorted(records("ordered"), key=lambda r: r["at"])]
    # First come, first served would run low-0, high-0, low-1, high-1, low-2, high-2. The worker
    # may have reserved the first call sent before the release (Celery reserves a message
    # ahead of a free process), so one low call may run early; the rest follow priority.
    assert order[0].startswith("high"), order
    # two processes start the high calls side by side, so their start times may cross
    assert sorted(label for label in order[:4] if label.startswith("high")) == [
        "high-0",
        "high-1",
        "high-2",
    ], order
    # the low calls run last; two processes start them side by side too, so their start
    # times may cross as well (seen: low-2 before low-0, which one process had reserved)
    assert sorted(order[-2:]) == sorted(label for label in order[-2:] if label.startswith("low"))
    assert sorted(order) == sorted([f"{p}-{i}" for p in ("low", "high") for i in range(3)])
