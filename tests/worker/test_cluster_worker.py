"""The worker path on a real 3-master Redis Cluster (coordination), broker unchanged.

The worker and the test know the cluster by its FIRST node only (``redis+cluster://`` with one
startup node): execution claims (``ExecutionClaim``, a redis-py lock), holds, parked-waiter
sets and traces hash all over the cluster, so most of them live on other nodes and every
delivery depends on the client following the slot map. A delivery that met ``MOVED`` used to
stay ``pending`` forever; here none does.
"""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app.coordination.keys import hash_slot
from reactor_app.coordination.keys import key as redis_key
from reactor_app.coordination.redis import get_client, is_cluster
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.worker import scenarios

pytestmark = [pytest.mark.worker, pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def celery_worker_settings(reactor_redis_cluster: Any) -> dict[str, Any]:
    first = reactor_redis_cluster.ports[0]
    return {
        "REACTOR_REDIS_URL": f"redis+cluster://127.0.0.1:{first}",
        # a long park backoff: whatever resumes sooner was woken by a release
        "REACTOR_CONTENTION_BACKOFF": [15.0, 30.0],
        "REACTOR_CONTENTION_CEILING": 500,
        # the park-and-wake path is under test: no in-delivery wait before parking
        "REACTOR_WORKER_WAIT": 0,
    }


def claims_on_other_nodes(cluster: Any, executions: list[Execution]) -> int:
    first = cluster.ports[0]
    ports = [cluster.port_of_slot(hash_slot(redis_key("claim", str(e.id)))) for e in executions]
    return sum(port != first for port in ports)


def test_worker_runs_on_the_cluster_and_parks_then_completes(
    worker: Any, reactor_redis_cluster: Any
) -> None:
    assert is_cluster(get_client())
    executions = scenarios.contention_parks_then_completes(account=4)
    assert all(
        Execution.objects.get(pk=e.pk).status == ExecutionStatus.SUCCEEDED for e in executions
    )


def test_forty_executions_on_one_key_never_overlap_on_the_cluster(
    worker: Any, reactor_redis_cluster: Any
) -> None:
    executions = scenarios.forty_on_one_key_never_overlap(account=5)
    # most execution claims lived on nodes the client was not told about
    assert claims_on_other_nodes(reactor_redis_cluster, executions) >= 10
    assert not Execution.objects.exclude(status=ExecutionStatus.SUCCEEDED).filter(
        pk__in=[e.pk for e in executions]
    )


def test_parked_waiters_are_woken_by_the_release_on_the_cluster(worker: Any) -> None:
    scenarios.parked_waiters_are_woken(account=6)
