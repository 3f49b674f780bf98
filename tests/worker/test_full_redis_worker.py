"""A coordination Redis out of memory, met by a worker: the execution waits for it, nothing
runs unprotected, nothing fails (docs/operations.md, "Redis memory").

A real prefork worker whose coordination Redis is a ``redis-server`` of this module's own
(the broker stays the suite's). The test fills that server past its ``maxmemory``
(``noeviction``) while the first step of an execution runs: the locked second step's admission
is refused with ``CoordinationOutOfMemory``, a ``CoordinationUnavailable``, which a worker
treats as an outage: the execution parks and comes back after a backoff, and each delivery
finding the server still full (its claim refused too) is sent again after a longer one. It
runs once the memory is freed. ``tests/concurrency/test_redis_memory.py`` checks the error
itself in the caller's process.

Before, a delivery refused its claim by an outage was sent again after the first step of the
backoff every time, however long the outage lasted: a message per execution every 0.1 to 0.2 s
here (every 0.5 to 1 s at the default backoff), found by this test's log.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from demo_project.shop.models import Activity
from reactor_app.engine.state import ExecutionState
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from reactor_app.testing.servers import StandaloneServer
from tests.concurrency.test_redis_memory import free, make_full
from tests.worker.full_redis_reactors import FullRedisReactor
from tests.worker.helpers import wait_until

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

#: how long the test keeps the server full once the execution has parked on it: several of
#: its outage backoffs (capped at 1 s below)
KEPT_FULL = 4.0
BASE, CAP = 0.2, 1.0


@pytest.fixture(scope="module")
def coordination_server() -> Iterator[StandaloneServer]:
    server = StandaloneServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def celery_worker_settings(coordination_server: StandaloneServer) -> dict[str, Any]:
    return {
        "REACTOR_REDIS_URL": coordination_server.url,
        "REACTOR_CONTENTION_BACKOFF": [BASE, CAP],
        # a claim the full server would not let the parking delivery give back lapses soon
        "REACTOR_EXECUTION_CLAIM_TTL": 3,
    }


@pytest.fixture
def admin(coordination_server: StandaloneServer, settings: Any) -> Iterator[redis.Redis]:
    settings.REACTOR_REDIS_URL = coordination_server.url
    client = redis.Redis.from_url(coordination_server.url)
    try:
        yield client
    finally:
        client.config_set("maxmemory", 0)
        client.close()


def outages(execution: Execution) -> int:
    row = Execution.objects.get(pk=execution.pk)
    return int(ExecutionState.peek(row.context).continuation.outages or 0)


def test_a_full_coordination_redis_parks_the_step_until_memory_is_freed(
    worker: Any, admin: redis.Redis
) -> None:
    account = random.randrange(10**6)
    execution = FullRedisReactor.run_async(account=account, first_seconds=2.0)
    wait_until(
        lambda: Execution.objects.get(pk=execution.pk).status == ExecutionStatus.RUNNING,
        30,
        message="the first step never started",
    )
    make_full(admin)
    try:
        wait_until(lambda: outages(execution) >= 1, 30, message="the outage was never met")
        time.sleep(KEPT_FULL)
        status = Execution.objects.get(pk=execution.pk).status
        assert status in (ExecutionStatus.PARKED, ExecutionStatus.PENDING), status
        # the protected body never ran while the server was full
        assert not Activity.objects.filter(execution_id=execution.pk, step="locked").exists()
    finally:
        free(admin)

    result = execution.wait(timeout=60)
    assert result.ok, result.error
    ran = list(Activity.objects.filter(execution_id=execution.pk).values_list("step", flat=True))
    assert ran == ["first", "locked"]


def requeues_before_a_claim(worker: Any, execution: Execution) -> list[tuple[int, float]]:
    """(outage, delay) of each requeue of ``execution`` by a delivery that met the outage
    before it could claim it, in the worker's log order (its log records of level WARNING: the
    pool's redirected stderr repeats each line without that prefix). The whole log, not its
    last 80 lines (``worker.log()``): a CI rehearsal found fewer than five of these lines in
    those within 30 s; the message below shows what the log held if it happens again."""
    pattern = (
        r"WARNING/[^\]]*\] coordination store unavailable; "
        rf"{execution.pk} requeued in ([0-9.]+)s \(outage (\d+)\)"
    )
    return [(int(n), float(d)) for d, n in re.findall(pattern, worker.process.read_log())]


def test_deliveries_refused_their_claim_back_off_further_each_time(
    worker: Any, admin: redis.Redis
) -> None:
    account = random.randrange(10**6)
    make_full(admin)
    try:
        execution = FullRedisReactor.run_async(account=account, first_seconds=0.0)
        try:
            wait_until(lambda: len(requeues_before_a_claim(worker, execution)) >= 5, 30)
        except pytest.fail.Exception:
            pytest.fail(
                f"the deliveries of {execution.pk} were not refused their claim five times; "
                f"the worker's log ends:\n{worker.log(200)}"
            )
    finally:
        free(admin)
    result = execution.wait(timeout=60)
    assert result.ok, result.error

    requeues = requeues_before_a_claim(worker, execution)
    assert [n for n, _ in requeues] == list(range(1, len(requeues) + 1))
    for n, delay in requeues:
        # equal jitter: at least half the step, which doubles up to the cap (the log rounds)
        step = min(CAP, BASE * 2 ** (n - 1))
        assert delay >= step / 2 - 0.05, (n, delay, requeues)
