"""Live limits on running Celery workers (one Redis server): an operator raises a named
semaphore limit in the admin and the workers admit under the new limit within 1 s; removing
the override restores the settings value (``limit_scenarios.raise_then_remove``). The same on
a Redis Cluster: test_worker_live_limits_cluster.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.worker import limit_scenarios

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = limit_scenarios.WORKER_SETTINGS


@pytest.fixture(scope="module")
def celery_worker_concurrency() -> int:
    return 3


def test_an_admin_override_changes_admissions_on_running_workers(
    worker: Any, django_user_model: Any
) -> None:
    latency_ms, posted_ms = limit_scenarios.raise_then_remove(django_user_model)
    print(
        f"\nadmin override -> first admission under the new limit: "
        f"{latency_ms:.0f} ms (the POST itself: {posted_ms:.0f} ms)"
    )
