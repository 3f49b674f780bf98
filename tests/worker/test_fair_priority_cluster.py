"""Fair sharing (``fair_by``) and priority on real workers over the 3-master Redis Cluster.

The scenarios of ``test_fair_priority`` (``tests.worker.fair_priority_reactors``), with the
worker and the test knowing the cluster by its first node only: the line, its fair hash and
the hand-off grants share the key's hash slot, wherever that lives.
"""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app.coordination.redis import get_client, is_cluster
from tests.worker.fair_priority_reactors import fair_backlog, priority_line

pytestmark = [pytest.mark.worker, pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def celery_worker_settings(reactor_redis_cluster: Any) -> dict[str, Any]:
    first = reactor_redis_cluster.ports[0]
    return {
        "REACTOR_REDIS_URL": f"redis+cluster://127.0.0.1:{first}",
        "REACTOR_CONTENTION_BACKOFF": [20.0, 40.0],
        "REACTOR_CONTENTION_CEILING": 50,
        "REACTOR_WORKER_WAIT": 0,
    }


def test_fair_turns_on_the_cluster(worker: Any, reactor_redis_cluster: Any) -> None:
    assert is_cluster(get_client())
    line, order = fair_backlog(20)
    turns = [sorted(label[0] for label in line[index : index + 2]) for index in (0, 2, 4, 6, 8)]
    assert turns == [["a", "b"]] * 5, line[:10]
    last_b = max(index for index, label in enumerate(order) if label.startswith("b"))
    assert last_b < 15, order[:15]


def test_priority_on_the_cluster(worker: Any, reactor_redis_cluster: Any) -> None:
    assert is_cluster(get_client())
    line, order = priority_line(low=4, high=2)
    assert order == line
    assert [label.split("-")[0] for label in order] == ["high"] * 2 + ["low"] * 4
