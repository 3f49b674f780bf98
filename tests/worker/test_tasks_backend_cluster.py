"""The ``django.tasks`` backend on a real 3-master Redis Cluster: a task function's tracked run
and the coordination decorators stacked on ``@task`` (a lock, a semaphore), as their
single-server tests run them.

The test functions are those of ``test_tasks_backend``, collected here a second time against
this module's worker, which knows the cluster by its first node only: the lock and semaphore
keys, the execution claims and the cancel flags hash to slots on every node.
"""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app.coordination.redis import get_client, is_cluster
from tests.worker.test_tasks_backend import WORKER_SETTINGS as TASK_SETTINGS
from tests.worker.test_tasks_backend import (
    test_a_lock_stacked_on_task_serializes_one_accounts_calls,
    test_a_semaphore_under_task_admits_at_most_its_limit,
    test_an_enqueued_task_runs_on_a_worker_as_a_tracked_execution,
)

pytestmark = [pytest.mark.worker, pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

__all__ = [
    "test_a_lock_stacked_on_task_serializes_one_accounts_calls",
    "test_a_semaphore_under_task_admits_at_most_its_limit",
    "test_an_enqueued_task_runs_on_a_worker_as_a_tracked_execution",
]


@pytest.fixture(scope="module")
def celery_worker_settings(reactor_redis_cluster: Any) -> dict[str, Any]:
    first = reactor_redis_cluster.ports[0]
    return {**TASK_SETTINGS, "REACTOR_REDIS_URL": f"redis+cluster://127.0.0.1:{first}"}


def test_the_tasks_here_run_on_the_cluster(worker: Any) -> None:
    assert is_cluster(get_client())
