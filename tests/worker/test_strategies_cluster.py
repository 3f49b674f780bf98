"""The concurrency strategies on a real 3-master Redis Cluster: ``on_contention`` (skip,
cancel_newest, cancel_in_progress) and debounce, as their single-server tests run them.

The test functions are those of ``test_contention_strategies`` and ``test_debounce``, collected
here a second time against this module's worker, which knows the cluster by its first node only:
the strategy's keys (the lock, the debounce window, the cancel flags, the execution claims) hash
to slots on every node, so each decision crosses nodes the client learns from ``MOVED``.
"""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app.coordination.redis import get_client, is_cluster
from tests.worker.test_contention_strategies import (
    WORKER_SETTINGS as STRATEGY_SETTINGS,
)
from tests.worker.test_contention_strategies import (
    test_cancel_in_progress_cancels_the_holder_then_takes_its_place,
    test_cancel_newest_cancels_the_newcomer_and_undoes_its_completed_steps,
    test_skip_runs_the_rest_of_the_workflow_without_the_contended_step,
)
from tests.worker.test_debounce import (
    test_a_burst_becomes_one_run_of_the_last_inputs_after_it_settles,
    test_max_wait_runs_a_burst_that_never_settles,
)

pytestmark = [pytest.mark.worker, pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

__all__ = [
    "test_a_burst_becomes_one_run_of_the_last_inputs_after_it_settles",
    "test_cancel_in_progress_cancels_the_holder_then_takes_its_place",
    "test_cancel_newest_cancels_the_newcomer_and_undoes_its_completed_steps",
    "test_max_wait_runs_a_burst_that_never_settles",
    "test_skip_runs_the_rest_of_the_workflow_without_the_contended_step",
]


@pytest.fixture(scope="module")
def celery_worker_settings(reactor_redis_cluster: Any) -> dict[str, Any]:
    first = reactor_redis_cluster.ports[0]
    return {**STRATEGY_SETTINGS, "REACTOR_REDIS_URL": f"redis+cluster://127.0.0.1:{first}"}


def test_the_strategies_here_run_on_the_cluster(worker: Any) -> None:
    assert is_cluster(get_client())
