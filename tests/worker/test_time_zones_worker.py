"""Real workers in a project without ``USE_TZ`` (naive local times, ``reactor_app.datetimes``).

The worker and this process both run with ``USE_TZ = False`` and ``TIME_ZONE =
"Asia/Kolkata"`` (UTC+05:30, so a time taken for UTC somewhere is off by hours): a contended
run parks and is woken, the times the worker writes (a park's next attempt, a step's start,
the coordination events the key timeline draws) agree with this process's clock, a deferred
task runs once when it is due — given an aware time or a naive one, in hops — and the
operator's timeline of the key answers. tests/integration/test_time_zones.py has the pages and
the API in both modes.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from reactor_app.models import CoordinationEvent
from reactor_app.write_behind import flush
from tests.worker import scenarios
from tests.worker import task_functions as tasks
from tests.worker.helpers import finished
from tests.worker.reactors import records

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = {
    "USE_TZ": False,
    "TIME_ZONE": "Asia/Kolkata",
    "REACTOR_CONTENTION_CEILING": 500,
    # parked waiters are woken by the release long before their backoff requeue
    "REACTOR_CONTENTION_BACKOFF": [15.0, 30.0],
    # the park-and-wake path: no in-delivery wait before parking
    "REACTOR_WORKER_WAIT": 0,
    "REACTOR_LONGEST_COUNTDOWN": 1.0,
}


def test_a_contended_run_parks_and_is_woken_and_its_key_timeline_answers(
    worker: Any, django_user_model: Any
) -> None:
    assert settings.USE_TZ is False
    assert '"USE_TZ": false' in worker.process.env["REACTOR_TEST_SETTINGS"]
    account = 41
    started = timezone.now()
    # the waiters' next attempts (the worker's clock) are compared with their steps' starts
    scenarios.parked_waiters_are_woken(account=account)
    flush()
    events = CoordinationEvent.objects.filter(key=f"acct:{account}", at__gte=started)
    assert events.exists()
    # every event the worker wrote is of this process's kind of time, and now or earlier
    assert all(timezone.is_naive(e.at) and started <= e.at <= timezone.now() for e in events)

    client = Client()
    client.force_login(django_user_model.objects.create_superuser("tz-worker", password="pw"))
    page = client.get(
        reverse("admin:reactor_app_coordination_timeline"), {"key": f"acct:{account}"}
    )
    assert page.status_code == 200
    assert page.content.decode().count('class="bar hold"') >= 4  # the first and 3 waiters


@pytest.mark.parametrize("given", ["aware", "naive"])
def test_a_deferred_task_runs_once_when_due(worker: Any, given: str) -> None:
    label = uuid.uuid4().hex[:8]
    due_at = time.time() + 2.5
    run_after = (
        datetime.fromtimestamp(due_at, UTC) if given == "aware" else datetime.fromtimestamp(due_at)
    )
    result = finished(tasks.stamped.using(run_after=run_after).enqueue(label), timeout=60)
    stamps = [stamp for stamp in records("stamped") if stamp["label"] == label]
    assert len(stamps) == 1, stamps
    assert stamps[0]["at"] >= due_at * 1e9  # not before it was due
    assert timezone.is_naive(result.started_at) and result.started_at.timestamp() >= due_at


def test_a_long_countdown_arrives_in_hops(worker: Any) -> None:
    scenarios.a_long_countdown_arrives_in_hops(worker)
