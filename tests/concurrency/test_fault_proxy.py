"""The lost-reply harness itself: ``reactor_app.testing.fault_proxy.FaultProxy``.

What the coordination lost-reply tests rely on: traffic passes unchanged until a fault is
armed; an armed fault lets the matching request run on the server and takes its reply away (the
client sees its connection end); requests that do not match pass.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis as redis_py
from redis.backoff import NoBackoff
from redis.retry import Retry

from reactor_app.testing.fault_proxy import FaultProxy, is_script_call
from reactor_app.testing.servers import StandaloneServer

INCR = "return redis.call('INCR', KEYS[1])"


@pytest.fixture(scope="module")
def server() -> Iterator[StandaloneServer]:
    with StandaloneServer() as started:
        yield started


@pytest.fixture
def proxy(server: StandaloneServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", server.port) as started:
        yield started


def _through(proxy: FaultProxy) -> redis_py.Redis:
    # no re-sends (redis-py's default retries a connection error: the fault would be hidden)
    return redis_py.Redis(port=proxy.port, socket_timeout=5, retry=Retry(NoBackoff(), 0))


def test_traffic_passes_unchanged_until_a_fault_is_armed(proxy: FaultProxy) -> None:
    client = _through(proxy)
    client.set("fault-proxy:plain", "value")
    assert client.get("fault-proxy:plain") == b"value"
    assert proxy.lost == 0 and proxy.connections == 1


def test_a_lost_reply_is_a_connection_error_for_a_command_that_ran(
    proxy: FaultProxy, server: StandaloneServer
) -> None:
    direct = redis_py.Redis(port=server.port)
    direct.delete("fault-proxy:counter")
    client = _through(proxy)
    script = client.register_script(INCR)
    assert script(keys=["fault-proxy:counter"]) == 1  # loads the script, warms the connection
    proxy.lose_next_reply(matching=b"EVALSHA")
    with pytest.raises(redis_py.exceptions.ConnectionError):
        script(keys=["fault-proxy:counter"])
    assert proxy.lost == 1 and proxy.armed == 0
    assert direct.get("fault-proxy:counter") == b"2"  # the script ran: only its reply was lost
    assert script(keys=["fault-proxy:counter"]) == 3  # the next call reconnects and passes


def test_requests_that_do_not_match_pass_while_a_fault_waits(proxy: FaultProxy) -> None:
    client = _through(proxy)
    proxy.lose_next_reply(matching=is_script_call)
    client.set("fault-proxy:other", "1")
    assert client.get("fault-proxy:other") == b"1"
    assert proxy.armed == 1 and proxy.lost == 0
    proxy.disarm()
    assert client.eval("return 7", 0) == 7


def test_faults_armed_several_times_lose_that_many_replies(proxy: FaultProxy) -> None:
    client = _through(proxy)
    proxy.lose_next_reply(times=2)
    for _ in range(2):
        with pytest.raises(redis_py.exceptions.ConnectionError):
            client.ping()
    assert proxy.wait_lost(2)
    assert client.ping() is True


def test_bad_arguments_are_refused(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="times"):
        proxy.lose_next_reply(times=0)
    with pytest.raises(TypeError, match="matching"):
        proxy.lose_next_reply(matching="EVALSHA")  # type: ignore[arg-type]
