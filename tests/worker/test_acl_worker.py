"""A coordination Redis that starts refusing its ACL user, met by a worker: the execution waits
for the rules to be fixed, nothing runs unprotected, nothing fails (docs/operations.md, "Redis
ACL").

A real prefork worker connects to a ``redis-server`` of this module's own as an ACL user (the
broker stays the suite's). While the first step of an execution runs, the test takes scripts
away from that user (an operator's mistake, a managed service's policy change): the locked
second step's admission is refused (``NOPERM``), a ``CoordinationUnavailable`` whose message
names the ACL, which a worker treats as an outage — the execution parks, each delivery refused
its claim meanwhile is sent again after a longer backoff — and it runs once the rules are
restored. ``tests/concurrency/test_redis_acl.py`` checks the refusals themselves in the
caller's process; before this test, the worker's side was followed in the code only.

Found by this test: each outage line of the worker's log said "coordination store
unreachable", whatever the server answered; it now carries the error's message.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from demo_project.shop.models import Activity
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from reactor_app.testing.servers import StandaloneServer
from tests.worker.full_redis_reactors import FullRedisReactor
from tests.worker.helpers import wait_until
from tests.worker.test_full_redis_worker import outages

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

USER, PASSWORD = "reactor", "acl-pw"
#: the rules of the user while it works: every key and channel, the documented commands
RULES = ["~*", "&*", "+@scripting", "+@pubsub", "+@connection", "+@read", "+@write"]
RULES += ["+@keyspace", "+time", "+info"]
#: how long the test keeps scripts refused once the execution has parked on it
KEPT_REFUSED = 3.0


@pytest.fixture(scope="module")
def coordination_server() -> Iterator[StandaloneServer]:
    server = StandaloneServer().start()
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", USER, "on", f">{PASSWORD}", "-@all", *RULES)
    admin.close()
    try:
        yield server
    finally:
        server.stop()


def user_url(server: StandaloneServer) -> str:
    return f"redis://{USER}:{PASSWORD}@127.0.0.1:{server.port}/0"


@pytest.fixture(scope="module")
def celery_worker_settings(coordination_server: StandaloneServer) -> dict[str, Any]:
    return {
        "REACTOR_REDIS_URL": user_url(coordination_server),
        "REACTOR_CONTENTION_BACKOFF": [0.2, 1.0],
        # a claim the refused user could not give back lapses soon
        "REACTOR_EXECUTION_CLAIM_TTL": 3,
    }


@pytest.fixture
def admin(coordination_server: StandaloneServer, settings: Any) -> Iterator[redis.Redis]:
    settings.REACTOR_REDIS_URL = user_url(coordination_server)
    client = redis.Redis.from_url(coordination_server.url)
    try:
        yield client
    finally:
        client.execute_command("ACL", "SETUSER", USER, "+@scripting")
        client.close()


def test_a_user_refused_scripts_parks_the_step_until_its_rules_are_fixed(
    worker: Any, admin: redis.Redis
) -> None:
    account = random.randrange(10**6)
    execution = FullRedisReactor.run_async(account=account, first_seconds=2.0)
    wait_until(
        lambda: (
            Activity.objects.filter(execution_id=execution.pk).exists()
            or Execution.objects.get(pk=execution.pk).status == ExecutionStatus.RUNNING
        ),
        30,
        message="the first step never started",
    )
    admin.execute_command("ACL", "SETUSER", USER, "-@scripting")
    try:
        wait_until(lambda: outages(execution) >= 1, 30, message="the refusal was never met")
        time.sleep(KEPT_REFUSED)
        # waiting, not failed: parked between deliveries, running during one (the claim is a
        # plain SET the user may still send; the lock's admission is the script it may not)
        row = Execution.objects.get(pk=execution.pk)
        waiting = (ExecutionStatus.PARKED, ExecutionStatus.PENDING, ExecutionStatus.RUNNING)
        assert row.status in waiting, row.status
        # the protected body never ran while its lock could not be taken
        assert not Activity.objects.filter(execution_id=execution.pk, step="locked").exists()
    finally:
        admin.execute_command("ACL", "SETUSER", USER, "+@scripting")

    result = execution.wait(timeout=60)
    assert result.ok, result.error
    ran = list(Activity.objects.filter(execution_id=execution.pk).values_list("step", flat=True))
    assert ran == ["first", "locked"]
    # each outage line of the worker's log says what to fix: before, they all said
    # "coordination store unreachable", which sends an operator to the network
    lines = [
        line
        for line in worker.process.read_log().splitlines()
        if "WARNING/" in line and "requeued" in line and "(outage " in line
    ]
    assert lines, worker.log(200)
    assert all("refusing its ACL user" in line for line in lines), lines
