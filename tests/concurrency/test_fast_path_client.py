"""The single-lock fast path's own client path (``Scripts.call``): what it keeps of redis-py.

``Scripts.call`` sends ``EVALSHA`` straight to a pooled connection of a one-server client. On a
private ``redis-server`` (started here, stopped by pid): its request bytes are redis-py's; a
server that lost its scripts (``SCRIPT FLUSH``, as after a restart) gets them again and the
call still answers; a connection the server closed under it fails at most that call (as an
outage) and is never handed out again; a stopped server is an outage, not a hang. Each time
the pool ends with no connection checked out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis._parsers.encoders import Encoder
from redis.connection import PythonRespSerializer

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.coordination.scripts import _pack_evalsha, scripts_for
from reactor_app.exceptions import CoordinationUnavailable
from reactor_app.testing.servers import StandaloneServer

pytestmark = pytest.mark.cluster  # starts its own server, like the cluster tests


@pytest.fixture
def server() -> Iterator[StandaloneServer]:
    with StandaloneServer() as started:
        yield started


@pytest.fixture
def client(server: StandaloneServer) -> Iterator[Any]:
    plain = redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=5)
    yield plain
    plain.close()


def checked_out(client: Any) -> int:
    return len(client.connection_pool._in_use_connections)


def admit_and_release(coordinator: Coordinator, owner: str) -> int:
    admitted = coordinator.admit([LockClaim("fast:key", ttl=30)], Holder(owner=owner))
    assert isinstance(admitted, Admitted), admitted
    token = admitted.holds[0].token
    released = coordinator.release(admitted, "success")
    assert released.freed == [("lock", "fast:key")], released
    assert token is not None
    return token


def test_the_request_bytes_are_redis_pys() -> None:
    args = ("ownér ✓", "", "step", 60000, 1.5, -3, "key\r\nwith newline")
    keys = ["k1", "ключ"]
    ours = _pack_evalsha("0123abcd", keys, args)
    theirs = b"".join(
        PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode).pack(
            "EVALSHA", "0123abcd", len(keys), *keys, *args
        )
    )
    assert ours == theirs
    with pytest.raises(TypeError):
        _pack_evalsha("0123abcd", keys, [True])


def test_the_fast_path_uses_the_pool_directly_and_gives_connections_back(client: Any) -> None:
    coordinator = Coordinator(client, prefix="fast-test")
    assert scripts_for(client)._direct_pool is client.connection_pool
    tokens = [admit_and_release(coordinator, f"o{n}") for n in range(5)]
    assert tokens == sorted(tokens) and len(set(tokens)) == 5  # fencing tokens still increase
    assert checked_out(client) == 0


def test_a_server_that_lost_its_scripts_gets_them_again(client: Any) -> None:
    coordinator = Coordinator(client, prefix="fast-test")
    first = admit_and_release(coordinator, "before")
    client.script_flush()
    assert client.script_exists(scripts_for(client)._scripts["lock_admit"].sha) == [False]
    assert admit_and_release(coordinator, "after") > first
    assert checked_out(client) == 0


def test_a_connection_closed_under_the_call_is_an_outage_and_is_not_reused(
    client: Any, server: StandaloneServer
) -> None:
    coordinator = Coordinator(client, prefix="fast-test")
    admit_and_release(coordinator, "warm")  # one pooled connection, idle now
    killer = redis.Redis.from_url(server.url)
    killed = killer.client_kill_filter(_type="normal", skipme=True)
    assert killed >= 1
    outcomes = []
    for n in range(3):
        try:
            outcomes.append(admit_and_release(coordinator, f"n{n}") > 0)
        except CoordinationUnavailable:
            outcomes.append(False)
    # the first call may meet the dead connection (redis-py's pool checks health on
    # checkout, so it may also reconnect first); every later one gets a live connection
    assert outcomes[1:] == [True, True], outcomes
    assert checked_out(client) == 0
    killer.close()


def test_a_stopped_server_is_an_outage_not_a_hang(client: Any, server: StandaloneServer) -> None:
    coordinator = Coordinator(client, prefix="fast-test")
    admit_and_release(coordinator, "warm")
    server.stop()
    with pytest.raises(CoordinationUnavailable):
        coordinator.admit([LockClaim("fast:key", ttl=30)], Holder(owner="late"))
    assert checked_out(client) == 0
