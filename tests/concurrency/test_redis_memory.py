"""The coordination Redis and its memory: a full server refuses, an evicting one is reported.

Against real servers the harness starts on free loopback ports (``make_full`` fills one to its
``maxmemory``, then lowers it below what the server uses):

* a server at its ``maxmemory`` under ``noeviction`` refuses writes. Every primitive's
  admission then fails with ``CoordinationOutOfMemory`` (a ``CoordinationUnavailable``, the
  class a worker's outage path takes; not run on a worker here), naming the step and what to
  change, and the body does not run; once memory is freed the same call runs. Before, the raw
  redis-py ``OutOfMemoryError`` escaped ``Step.call``;
* a server that may evict (``maxmemory`` set with any other policy) can free a held lock
  behind its holder's back: ``manage.py check --deploy`` warns (``reactor_app.W004``) and
  ``reactor_redis status`` says so — for one server, each primary of a cluster, and the master
  a Sentinel names. A property over every policy, with and without ``maxmemory``: warned
  exactly when the server may evict.
"""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.checks import run_checks
from django.core.management import call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor_app import Reactor, from_input, step
from reactor_app.exceptions import CoordinationOutOfMemory, CoordinationUnavailable
from reactor_app.testing.servers import StandaloneServer
from tests.concurrency.guarded_steps import SPANS, every_primitive

pytestmark = pytest.mark.django_db(transaction=True)

POLICIES = (
    "noeviction",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
)

PROTECTED = every_primitive("memory", wait=0)


class LockedRun(Reactor):
    inputs = ("n",)

    only = step(PROTECTED["lock"], n=from_input("n"))


@pytest.fixture
def admin(plain_server: StandaloneServer, settings: Any) -> Iterator[redis.Redis]:
    """The server as the coordination Redis of this test, its memory settings reset after."""
    settings.REACTOR_REDIS_URL = plain_server.url
    client = redis.Redis.from_url(plain_server.url)
    try:
        yield client
    finally:
        client.config_set("maxmemory", 0)
        client.config_set("maxmemory-policy", "noeviction")
        client.flushall()
        client.close()


def make_full(client: redis.Redis) -> None:
    """``maxmemory`` just above what the server uses, filled until it refuses a write, then
    lowered to one byte: every write refused until ``free``."""
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", used + 256 * 1024)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        for index in range(10_000):
            client.set(f"fill:{index}", "x" * 4096)
    # far over the limit, not on its edge: memory freed meanwhile (a closing client frees its
    # buffers, for one) must not let a write in. 128 kB under what it used was not enough: a
    # CI rehearsal on a loaded machine saw one claim accepted mid-outage in
    # test_full_redis_worker, so a delivery claimed, parked, and its next refusal counted
    # from 1 again
    client.config_set("maxmemory", 1)


def free(client: redis.Redis) -> None:
    names = list(client.scan_iter(match="fill:*"))
    client.delete(*names)
    client.config_set("maxmemory", 0)


@pytest.mark.parametrize("primitive", sorted(PROTECTED))
def test_a_full_coordination_redis_refuses_the_admission_and_the_body_does_not_run(
    admin: redis.Redis, primitive: str
) -> None:
    make_full(admin)
    SPANS.clear()
    outcome = PROTECTED[primitive].call(n=1)
    assert SPANS == [], "the body ran without coordination"
    error = outcome.error
    assert isinstance(error, CoordinationOutOfMemory), repr(error)
    assert isinstance(error, CoordinationUnavailable)  # the class a worker's outage path takes
    assert str(error).startswith("coordination store out of memory for step "), error
    assert "maxmemory" in str(error) and "the protected work did not run" in str(error)

    free(admin)
    assert PROTECTED[primitive].call(n=1).ok
    assert len(SPANS) == 1


def test_a_reactor_run_against_a_full_redis_fails_its_step_clearly(admin: redis.Redis) -> None:
    make_full(admin)
    SPANS.clear()
    result = LockedRun.run(n=2)
    assert not result.ok and SPANS == []
    assert isinstance(result.error, CoordinationOutOfMemory), repr(result.error)
    assert "step 'only'" in str(result.error), result.error


def eviction_warnings() -> list[str]:
    return [
        f"{message.msg} {message.hint}"
        for message in run_checks(tags=["reactor_app"], include_deployment_checks=True)
        if message.id == "reactor_app.W004"
    ]


@settings(
    max_examples=16,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(policy=st.sampled_from(POLICIES), limited=st.booleans())
def test_check_deploy_warns_exactly_when_the_coordination_redis_may_evict(
    admin: redis.Redis, policy: str, limited: bool
) -> None:
    admin.config_set("maxmemory-policy", policy)
    admin.config_set("maxmemory", "512mb" if limited else 0)
    warnings = eviction_warnings()
    if limited and policy != "noeviction":
        [warning] = warnings
        assert f"maxmemory-policy {policy}, maxmemory 512" in warning, warning
        assert "noeviction" in warning  # the hint: what to set
    else:
        assert warnings == []
    # plain ``check`` stays offline: it never asks the server
    assert not [m for m in run_checks(tags=["reactor_app"]) if m.id == "reactor_app.W004"]


def test_reactor_redis_status_says_the_server_may_evict(admin: redis.Redis) -> None:
    admin.config_set("maxmemory-policy", "volatile-ttl")
    admin.config_set("maxmemory", "512mb")
    out = StringIO()
    call_command("reactor_redis", "status", stdout=out)  # a warning: status still succeeds
    assert "may evict keys to free memory" in out.getvalue(), out.getvalue()
    assert "volatile-ttl" in out.getvalue()


def test_each_cluster_primary_that_may_evict_is_named(
    reactor_redis_cluster: Any, settings: Any
) -> None:
    settings.REACTOR_REDIS_URL = reactor_redis_cluster.url
    evicting = reactor_redis_cluster.ports[1]
    client = redis.Redis(host="127.0.0.1", port=evicting)
    try:
        client.config_set("maxmemory-policy", "allkeys-lru")
        client.config_set("maxmemory", "512mb")
        [warning] = eviction_warnings()
        assert f":{evicting}: maxmemory-policy allkeys-lru" in warning, warning
    finally:
        client.config_set("maxmemory", 0)
        client.config_set("maxmemory-policy", "noeviction")
        client.close()
    assert eviction_warnings() == []


def test_the_master_a_sentinel_names_is_asked(reactor_redis_sentinel: Any, settings: Any) -> None:
    settings.REACTOR_REDIS_URL = reactor_redis_sentinel.url
    client = redis.Redis(host="127.0.0.1", port=reactor_redis_sentinel.master_port())
    try:
        client.config_set("maxmemory-policy", "volatile-lru")
        client.config_set("maxmemory", "512mb")
        [warning] = eviction_warnings()
        assert "maxmemory-policy volatile-lru" in warning and "mymaster" in warning, warning
    finally:
        client.close()
