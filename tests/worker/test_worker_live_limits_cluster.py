"""Live limits on running Celery workers on a real 3-master Redis Cluster: the overrides'
hash lives on one node, the semaphore's keys on whichever node their slot maps to; every
process still obeys the override within 1 s (``limit_scenarios.raise_then_remove``)."""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app.coordination.redis import get_client, is_cluster
from tests.worker import limit_scenarios

pytestmark = [pytest.mark.worker, pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def celery_worker_settings(reactor_redis_cluster: Any) -> dict[str, Any]:
    return {
        "REACTOR_REDIS_URL": f"redis+cluster://127.0.0.1:{reactor_redis_cluster.ports[0]}",
        **limit_scenarios.WORKER_SETTINGS,
    }


@pytest.fixture(scope="module")
def celery_worker_concurrency() -> int:
    return 3


def test_an_admin_override_changes_admissions_on_cluster_workers(
    worker: Any, django_user_model: Any
) -> None:
    assert is_cluster(get_client())
    latency_ms, posted_ms = limit_scenarios.raise_then_remove(django_user_model)
    print(
        f"\ncluster: admin override -> first admission under the new limit: "
        f"{latency_ms:.0f} ms (the POST itself: {posted_ms:.0f} ms)"
    )
