"""A topology setting that parses but names the wrong server: the call, the deploy check and
``reactor_redis status`` each say so, with what to change.

Five cases, each against real servers the harness starts on free loopback ports: a
``redis+sentinel://`` URL at a plain server, a Sentinel service name the sentinels do not know,
a ``redis+cluster://`` URL at a server without cluster mode, a one-server URL at a cluster node,
and a port nothing listens on. A direct ``Step.call`` gets ``CoordinationUnavailable`` carrying
the hint (never an "unexpected ResponseError"), and its body does not run;
``manage.py check --deploy`` reports ``reactor_app.E031``, while plain ``manage.py check`` stays
offline and reports nothing.
"""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError

from reactor_app import Step, Success, with_lock, with_semaphore
from reactor_app.coordination.redis import get_client
from reactor_app.exceptions import CoordinationUnavailable
from reactor_app.testing.servers import StandaloneServer, free_port

pytestmark = pytest.mark.django_db(transaction=True)

RAN: list[int] = []


@with_lock(lambda args: f"topology:{args['n']}", ttl=5, wait=0)
class Guarded(Step):
    inputs = ("n",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        RAN.append(args["n"])
        return Success(args["n"])


@with_semaphore(lambda args: f"topology-pool:{args['n']}", limit=2, ttl=5)
@with_lock(lambda args: f"topology:{args['n']}", ttl=5, wait=0)
class TwoSlots(Step):
    """A lock and a semaphore on keys of different hash slots: one admission script over two
    slots, which a cluster node refuses with CROSSSLOT."""

    inputs = ("n",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        RAN.append(args["n"])
        return Success(args["n"])


def refused_call(step: type[Step] = Guarded) -> CoordinationUnavailable:
    """Call ``step`` directly; it must fail with ``CoordinationUnavailable`` without running."""
    RAN.clear()
    outcome = step.call(n=1)
    assert RAN == [], "the body ran without coordination"
    assert isinstance(outcome.error, CoordinationUnavailable), repr(outcome.error)
    return outcome.error


def deploy_errors() -> list[Any]:
    """What ``manage.py check --deploy`` reports as reactor_app.E031 (through the command, so
    the check is registered as the deploy check the command runs)."""
    try:
        call_command("check", "--deploy", "--tag", "reactor_app", stdout=StringIO())
    except SystemCheckError as exc:
        text = str(exc)
        assert "reactor_app.E031" in text, text
        return [text]
    return []


def assert_plain_check_stays_offline() -> None:
    """Plain ``check`` (no ``--deploy``) runs no check that connects: nothing reported."""
    found = [m for m in run_checks(tags=["reactor_app"]) if m.id == "reactor_app.E031"]
    assert found == []
    call_command("check", "--tag", "reactor_app", stdout=StringIO())


def status_output() -> tuple[str, CommandError | None]:
    out = StringIO()
    try:
        call_command("reactor_redis", "status", stdout=out)
    except CommandError as exc:
        return out.getvalue(), exc
    return out.getvalue(), None


def test_a_sentinel_url_at_a_plain_server(plain_server: StandaloneServer, settings: Any) -> None:
    settings.REACTOR_REDIS_URL = f"redis+sentinel://127.0.0.1:{plain_server.port}/mymaster/0"
    error = refused_call()
    assert "is not a Sentinel" in str(error) and "redis://host:port" in str(error), error

    [report] = deploy_errors()
    assert f"127.0.0.1:{plain_server.port} is not a Sentinel" in report
    assert "point it at the sentinels" in report
    assert_plain_check_stays_offline()

    text, failed = status_output()
    assert failed is not None and "is not a Sentinel" in text, text


def test_an_unknown_sentinel_service_name(reactor_redis_sentinel: Any, settings: Any) -> None:
    port = reactor_redis_sentinel.sentinel_port
    settings.REACTOR_REDIS_URL = f"redis+sentinel://127.0.0.1:{port}/nosuchmaster/0"
    error = refused_call()
    assert "put the name the sentinels monitor" in str(error), error

    [report] = deploy_errors()
    assert "know no master named 'nosuchmaster' (they know: 'mymaster')" in report
    assert_plain_check_stays_offline()

    # the right name passes the deploy check and runs the step
    settings.REACTOR_REDIS_URL = reactor_redis_sentinel.url
    assert deploy_errors() == []
    assert Guarded.call(n=2).value == 2


def test_a_cluster_url_at_a_plain_server(plain_server: StandaloneServer, settings: Any) -> None:
    settings.REACTOR_REDIS_URL = f"redis+cluster://127.0.0.1:{plain_server.port}/"
    error = refused_call()
    assert "has no cluster mode: for one server use redis://" in str(error), error

    [report] = deploy_errors()
    assert f"127.0.0.1:{plain_server.port} has no cluster mode" in report
    assert_plain_check_stays_offline()

    # the same server as one server is fine
    settings.REACTOR_REDIS_URL = plain_server.url
    assert deploy_errors() == []
    text, failed = status_output()
    assert failed is None and "answers:      yes" in text and "problem:" not in text, text


@pytest.mark.cluster
def test_a_one_server_url_at_a_cluster_node(reactor_redis_cluster: Any, settings: Any) -> None:
    node = reactor_redis_cluster.ports[0]
    settings.REACTOR_REDIS_URL = f"redis://127.0.0.1:{node}/0"
    # a lock and a semaphore in one script: two hash slots, which the node refuses
    error = refused_call(TwoSlots)
    assert "ClusterCrossSlotError" in str(error), error
    assert "redis+cluster://host:port/" in str(error), error

    [report] = deploy_errors()
    assert f"127.0.0.1:{node}/0 is a Redis Cluster node, configured as one server" in report
    assert_plain_check_stays_offline()

    # the node answers PING, yet status says what is wrong and exits 1
    text, failed = status_output()
    assert "answers:      yes" in text, text
    assert "problem:      redis://127.0.0.1:" in text and "is a Redis Cluster node" in text
    assert failed is not None and failed.returncode == 1

    settings.REACTOR_REDIS_URL = reactor_redis_cluster.url
    assert deploy_errors() == []


def test_a_dead_host(settings: Any) -> None:
    port = free_port()  # nothing listens there
    settings.REACTOR_REDIS_URL = f"redis://127.0.0.1:{port}/0"
    error = refused_call()
    assert "check the host and port in REACTOR_REDIS_URL" in str(error), error

    [report] = deploy_errors()
    assert f"127.0.0.1:{port}/0 does not answer" in report
    assert_plain_check_stays_offline()


def test_a_dead_host_in_the_dict_setting_names_that_setting(settings: Any) -> None:
    port = free_port()
    settings.REACTOR_REDIS_URL = None
    settings.REACTOR_REDIS = {"cluster": True, "startup_nodes": [f"127.0.0.1:{port}"]}
    error = refused_call()
    assert "check the host and port in REACTOR_REDIS," in str(error), error
    [report] = deploy_errors()
    assert "does not answer" in report and "REACTOR_REDIS" in report


def test_a_server_that_answers_as_configured_passes(
    plain_server: StandaloneServer, settings: Any
) -> None:
    settings.REACTOR_REDIS_URL = plain_server.url
    assert deploy_errors() == []
    assert Guarded.call(n=3).value == 3
    assert get_client().ping()
