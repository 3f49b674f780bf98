"""Chaos (b): the coordination Redis killed and restarted empty while executions run.

The workers and this test use a private ``redis-server`` as the coordination store (the broker
stays where it is); 30 executions deposit into one account under a step lock, each through
``fenced_update``. Mid-run the server is SIGKILLed and, 0.3 s later, started again empty on the
same port. Without restarting anything and with no manual sweep, every execution ends
``succeeded`` within the documented bound; every fenced write was accepted (no token ever went
backwards, so no legitimate holder was refused and no stale one let through); the accepted
tokens increase in the order the writes happened; and outside the outage window no two
critical sections overlap. (Inside it, a holder whose key vanished with the server can still be
finishing its body while the next one enters: that is what the fencing token is for.)
"""

from __future__ import annotations

import itertools
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from demo_project.shop.models import Account, Activity
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from reactor_app.testing.servers import free_port, redis_server_binary
from tests.worker.helpers import wait_until
from tests.worker.trust_reactors import FencedDepositReactor

pytestmark = [pytest.mark.chaos, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

EXECUTIONS = 30
SETTLED_WITHIN = 120.0


class PrivateRedis:
    """A ``redis-server`` this test owns: started on a free loopback port, stopped by pid."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                redis_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        wait_until(lambda: _pings(client), 10, message="the private redis-server did not start")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path_factory.mktemp("coordination-redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def celery_worker_settings(private_redis: PrivateRedis) -> dict[str, Any]:
    return {
        "REACTOR_REDIS_URL": private_redis.url,
        "REACTOR_CONTENTION_CEILING": 1000,
        "REACTOR_CONTENTION_BACKOFF": [0.2, 1.0],
        "REACTOR_EXECUTION_CLAIM_TTL": 3,
        "REACTOR_SWEEP_INTERVAL": 1,
        "REACTOR_SWEEP_AFTER": 5,
        # the schedule kills (or takes the claim of) one execution's deliveries again and again on
        # purpose: the lost-delivery guard would rightly fail one killed three times at one point,
        # which is not what this checks (tests/worker/test_lost_deliveries.py checks the guard)
        "REACTOR_LOST_DELIVERY_LIMIT": 0,
    }


def test_a_coordination_redis_restarted_empty_strands_nothing_and_tokens_never_go_back(
    worker: Any, private_redis: PrivateRedis
) -> None:
    Account.objects.create(number=4242, balance=0)
    executions = [FencedDepositReactor.run_async(number=4242) for _ in range(EXECUTIONS)]
    wait_until(
        lambda: Activity.objects.filter(step="deposit").count() >= 5,
        30,
        message="no deposits before the outage",
    )
    outage_began = time.time()
    private_redis.kill()
    time.sleep(0.3)
    private_redis.start()
    outage_ended = time.time()

    ids = [e.id for e in executions]
    wait_until(
        lambda: (
            not Execution.objects.filter(pk__in=ids)
            .exclude(status__in=[ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED])
            .exists()
        ),
        SETTLED_WITHIN,
        interval=0.5,
        message="executions still running/parked/pending past the recovery bound",
    )
    failed = Execution.objects.filter(pk__in=ids).exclude(status=ExecutionStatus.SUCCEEDED)
    assert not failed.exists(), [(e.status, e.error) for e in failed]

    writes = list(Activity.objects.filter(step="deposit").order_by("finished_at"))
    assert all(w.detail["accepted"] for w in writes), [
        (w.fencing_token, w.detail) for w in writes if not w.detail["accepted"]
    ]
    assert Account.objects.get(number=4242).balance == len(writes) >= EXECUTIONS
    tokens = [w.fencing_token for w in writes]
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens

    # exclusion holds outside the outage window (with a margin for detection by renewal)
    window_start = outage_began - 0.1
    window_end = outage_ended + 3.0
    calm = [
        w
        for w in writes
        if w.finished_at.timestamp() < window_start or w.started_at.timestamp() > window_end
    ]
    calm.sort(key=lambda w: w.started_at)
    for a, b in itertools.pairwise(calm):
        assert b.started_at >= a.finished_at - timedelta(microseconds=0), (a.id, b.id)
