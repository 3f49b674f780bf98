"""The single-lock fast path's own client path (``Scripts.call``): what it keeps of redis-py.

``Scripts.call`` sends ``EVALSHA`` straight to the calling thread's own pooled connection of a
one-server client. On a private ``redis-server`` (started here, stopped by pid): its request
bytes are redis-py's; each thread keeps one connection, and a thread that ended gives its
connection back to the pool; a server that lost its scripts (``SCRIPT FLUSH``, as after a
restart) gets them again and the call still answers; a connection the server closed while it
was idle is found and replaced before the next call sends on it, and one closed under a
stream of calls fails at most one call (as an outage) and is never used again; a stopped
server is an outage, not a hang.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis._parsers.encoders import Encoder
from redis.connection import PythonRespSerializer

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.coordination.scripts import IDLE_CHECK_AFTER, _pack_evalsha, scripts_for
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


def admit_and_release(coordinator: Coordinator, owner: str, key: str = "fast:key") -> int:
    admitted = coordinator.admit([LockClaim(key, ttl=30)], Holder(owner=owner))
    assert isinstance(admitted, Admitted), admitted
    token = admitted.holds[0].token
    released = coordinator.release(admitted, "success")
    assert released.freed == [("lock", key)], released
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


def test_each_thread_keeps_one_connection_and_gives_it_back_when_it_ends(client: Any) -> None:
    coordinator = Coordinator(client, prefix="fast-test")
    assert scripts_for(client)._direct_pool is client.connection_pool
    tokens = [admit_and_release(coordinator, f"o{n}") for n in range(5)]
    assert tokens == sorted(tokens) and len(set(tokens)) == 5  # fencing tokens still increase
    # ten script calls, one connection: this thread's, kept between calls
    assert checked_out(client) == 1
    mine = scripts_for(client)._connection()

    all_in = threading.Barrier(3)
    seen: list[Any] = []

    def caller(n: int) -> None:
        admit_and_release(coordinator, f"t{n}", key=f"fast:key:{n}")  # never refused
        seen.append(scripts_for(client)._connection())
        all_in.wait(timeout=10)  # the three are alive (and hold their connections) together

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len({id(connection) for connection in [mine, *seen]}) == 4  # one per thread
    gc.collect()
    # the three ended: the next thread to take a connection gives theirs back first
    later = threading.Thread(target=admit_and_release, args=(coordinator, "later"))
    later.start()
    later.join(timeout=10)
    available = client.connection_pool._available_connections
    assert sum(1 for connection in seen if connection in available) >= 2  # one may be reused
    assert checked_out(client) == 2  # this thread's, and the later one's (it ended last)
    assert scripts_for(client)._connection() is mine


def test_a_server_that_lost_its_scripts_gets_them_again(client: Any) -> None:
    coordinator = Coordinator(client, prefix="fast-test")
    first = admit_and_release(coordinator, "before")
    client.script_flush()
    assert client.script_exists(scripts_for(client)._scripts["lock_admit"].sha) == [False]
    assert admit_and_release(coordinator, "after") > first
    assert checked_out(client) == 1


def kill_connections(server: StandaloneServer) -> None:
    killer = redis.Redis.from_url(server.url)
    killed = killer.client_kill_filter(_type="normal", skipme=True)
    killer.close()
    assert killed >= 1


def test_a_connection_closed_while_idle_is_replaced_before_the_next_call(
    client: Any, server: StandaloneServer
) -> None:
    coordinator = Coordinator(client, prefix="fast-test")
    admit_and_release(coordinator, "warm")
    kill_connections(server)
    time.sleep(IDLE_CHECK_AFTER * 2)  # idle long enough to be checked before use
    assert admit_and_release(coordinator, "after the kill") > 0
    assert checked_out(client) == 1


def test_a_connection_closed_under_a_stream_of_calls_fails_at_most_one(
    client: Any, server: StandaloneServer
) -> None:
    coordinator = Coordinator(client, prefix="fast-test")
    admit_and_release(coordinator, "warm")
    kill_connections(server)
    outcomes = []
    for n in range(3):  # back to back: not idle long enough to be checked first
        try:
            outcomes.append(admit_and_release(coordinator, f"n{n}") > 0)
        except CoordinationUnavailable:
            outcomes.append(False)
    assert outcomes[1:] == [True, True], outcomes
    assert checked_out(client) == 1


def test_a_stopped_server_is_an_outage_not_a_hang(client: Any, server: StandaloneServer) -> None:
    coordinator = Coordinator(client, prefix="fast-test")
    admit_and_release(coordinator, "warm")
    server.stop()
    with pytest.raises(CoordinationUnavailable):
        coordinator.admit([LockClaim("fast:key", ttl=30)], Holder(owner="late"))
    time.sleep(IDLE_CHECK_AFTER * 2)  # and when the check before the call meets it
    with pytest.raises(CoordinationUnavailable):
        coordinator.admit([LockClaim("fast:key", ttl=30)], Holder(owner="later"))
    assert checked_out(client) == 1
