"""A Redis Cluster master killed under real workers, its replica promoted (issue 31 item 2; the
same fault on threads is ``test_fault_histories::test_cluster_master_killed_and_its_replica_
promoted``): the schedule of ``test_worker_failover_histories`` — every primitive at step and
reactor level, and a fenced lock, on one real ``celery worker -c 4``, the kill made certain to
land inside an anchor's body, the same checks — with the worker's ``REACTOR_REDIS_URL`` a
``redis+cluster://`` URL of a private 3-master cluster with one replica per master
(``ClusterWithReplicas``: the session's shared cluster must not lose a master). The master
holding the most of the worker's keys when the anchor has entered is SIGKILLed; the cluster
promotes its replica after ``cluster-node-timeout`` (2 s) and the clients follow ``MOVED``.

As for Sentinel, replication is asynchronous: the kill is a ``lose`` fault for every key
(only the killed master's slots lose anything, but which keys those were is not recorded).

Run by ``make soak`` only (any ``REACTOR_FAULT_SOAK_SECONDS``; ``=1`` runs it once): the
default run's time for fault schedules on workers goes to the Sentinel failover, and this
schedule checks nothing that one does not, but the topology. One failover per run, ``make
soak`` included: a cluster whose killed master is not brought back has no replica left for that
shard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reactor_app.testing.clock_watch import ClockWatch
from reactor_app.testing.history import History
from tests.chaos.fault_histories import SOAK, ClusterWithReplicas, running
from tests.chaos.test_worker_failover_histories import failover_schedule
from tests.chaos.worker_histories import worker_settings

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.cluster,
    pytest.mark.skipif(not SOAK, reason="make soak runs it (REACTOR_FAULT_SOAK_SECONDS)"),
]


@pytest.fixture(scope="module")
def cluster_with_replicas() -> Iterator[ClusterWithReplicas]:
    with running(lambda: ClusterWithReplicas(masters=3)) as cluster:
        yield cluster.add_replicas()


@pytest.fixture(scope="module")
def celery_worker_settings(
    cluster_with_replicas: ClusterWithReplicas, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The worker (and the test) coordinate through the cluster, starting from the replicas'
    addresses (they outlive the kill)."""
    ports = ",".join(f"127.0.0.1:{p}" for p in cluster_with_replicas.replica_of)
    return worker_settings(
        tmp_path_factory.mktemp("worker-cluster-deliveries"),
        REACTOR_REDIS_URL=f"redis+cluster://{ports}/",
    )


@pytest.fixture(scope="module")
def celery_worker_concurrency() -> int:
    """More pool processes than the semaphore's slots."""
    return 4


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_all_primitives_on_real_workers_through_a_cluster_master_kill(
    worker: Any,
    cluster_with_replicas: ClusterWithReplicas,
    tmp_path: Path,
    clock_watch: Callable[[History], ClockWatch],
) -> None:
    cluster = cluster_with_replicas

    def fail_over() -> tuple[int, int]:
        killed, replica = cluster.kill_busiest_master(worker.prefix)
        cluster.wait_promoted(replica)
        return killed, replica

    # the anchor's key may live on a master that stays up: its lease need not be lost
    failover_schedule(
        tmp_path / "history.jsonl",
        "cluster master killed",
        fail_over,
        rejoin=None,
        rounds=1,
        anchor_lease_lost=False,
        clock_watch=clock_watch,
    )
