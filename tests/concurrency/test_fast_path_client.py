"""The single-lock fast path's own client path (``Scripts.call``): what it keeps of redis-py.

``Scripts.call`` sends ``EVALSHA`` straight to the calling thread's own pooled connection of a
one-server client. On a private ``redis-server`` (started here, stopped by pid): its request
bytes are redis-py's; each thread keeps one connection, and a thread that ended gives its
connection back to the pool; a server that lost its scripts (``SCRIPT FLUSH``, as after a
restart) gets them again and the call still answers; a connection the server closed while it
was idle is found and replaced before the next call sends on it, and one closed under a
stream of calls fails at most one call (as an outage) and is never used again; one the pool no
longer owns (under Sentinel: connected to a master that moved) is replaced; an interrupt in the
middle of a reconnect leaves no reply behind for the next call to read; a stopped server is an
outage, not a hang. A bounded pool (or one whose connections are not plain) is used a call at
a time, as before: kept connections would take its allowance.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis._parsers.encoders import Encoder
from redis.connection import PythonRespSerializer

from reactor_app.coordination import function_library, kept_connections
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.coordination.kept_connections import IDLE_CHECK_AFTER, can_keep_connections
from reactor_app.coordination.scripts import _pack_call, scripts_for
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
    ours = _pack_call(b"EVALSHA", "0123abcd", keys, args)
    theirs = b"".join(
        PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode).pack(
            "EVALSHA", "0123abcd", len(keys), *keys, *args
        )
    )
    assert ours == theirs
    with pytest.raises(TypeError):
        _pack_call(b"EVALSHA", "0123abcd", keys, [True])


def test_each_thread_keeps_one_connection_and_gives_it_back_when_it_ends(client: Any) -> None:
    coordinator = Coordinator(client, prefix="fast-test")
    assert scripts_for(client)._direct_pool is client.connection_pool
    tokens = [admit_and_release(coordinator, f"o{n}") for n in range(5)]
    assert tokens == sorted(tokens) and len(set(tokens)) == 5  # fencing tokens still increase
    # ten script calls, one connection: this thread's, kept between calls
    assert checked_out(client) == 1
    mine = scripts_for(client)._kept.get()

    all_in = threading.Barrier(3)
    seen: list[Any] = []

    def caller(n: int) -> None:
        admit_and_release(coordinator, f"t{n}", key=f"fast:key:{n}")  # never refused
        seen.append(scripts_for(client)._kept.get())
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
    assert scripts_for(client)._kept.get() is mine


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


def test_a_connection_the_pool_no_longer_owns_is_replaced(client: Any, monkeypatch: Any) -> None:
    coordinator = Coordinator(client, prefix="fast-test")
    admit_and_release(coordinator, "warm")
    connection = scripts_for(client)._kept.get()
    before = connection._sock
    # what a Sentinel pool answers for a connection to the master it knew before a failover
    monkeypatch.setattr(client.connection_pool, "owns_connection", lambda _: False)
    assert admit_and_release(coordinator, "moved") > 0
    assert connection._sock is not None and connection._sock is not before
    assert checked_out(client) == 1


def test_an_interrupt_in_the_middle_of_a_reconnect_leaves_no_reply_behind(client: Any) -> None:
    coordinator = Coordinator(client, prefix="fast-test")
    first = admit_and_release(coordinator, "warm")
    connection = scripts_for(client)._kept.get()
    connection.disconnect()

    def interrupted_handshake(conn: Any) -> None:
        conn.on_connect()
        conn.send_command("PING")  # a request of the handshake, its reply not read yet
        raise KeyboardInterrupt

    connection.redis_connect_func = interrupted_handshake
    with pytest.raises(KeyboardInterrupt):
        coordinator.admit([LockClaim("fast:key", ttl=30)], Holder(owner="interrupted"))
    connection.redis_connect_func = None
    # at once, not after the idle check: the next call reads its own reply, not the PONG
    assert admit_and_release(coordinator, "next") > first
    assert checked_out(client) == 1


def test_threads_keep_at_most_half_of_the_pool(server: StandaloneServer) -> None:
    bounded = redis.Redis.from_url(server.url, max_connections=4, socket_timeout=5)
    coordinator = Coordinator(bounded, prefix="fast-test")
    for script in scripts_for(bounded)._scripts.values():
        bounded.script_load(script.script)  # no first-call reload taking a connection more
    function_library.load(bounded)  # nor a first-call load of the library
    calls_done = threading.Barrier(4)
    errors: list[BaseException] = []

    def caller(n: int) -> None:
        try:
            for round_ in range(3):
                admit_and_release(coordinator, f"b{n}.{round_}", key=f"fast:bounded:{n}")
        except BaseException as exc:  # surfaced below, not lost in the thread
            errors.append(exc)
        calls_done.wait(timeout=10)  # alive (keeping what they keep) until all are done

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    calls_done.wait(timeout=10)
    assert not errors, errors
    # two of the three keep one (half of max_connections = 4); the third took one per call
    assert checked_out(bounded) == 2
    for thread in threads:
        thread.join(timeout=10)
    gc.collect()
    # they ended: this thread's first call gives theirs back and keeps one of its own
    assert admit_and_release(coordinator, "after") > 0
    assert checked_out(bounded) == 1
    bounded.close()


def test_resp3_or_cached_connections_are_taken_a_call_at_a_time(
    server: StandaloneServer,
) -> None:
    resp3 = redis.Redis.from_url(server.url, protocol=3, socket_timeout=5)
    try:
        # a RESP3 connection may hold push messages nobody asked for: never kept
        assert not can_keep_connections(resp3.connection_pool)
        assert admit_and_release(Coordinator(resp3, prefix="fast-test"), "resp3") > 0
        assert checked_out(resp3) == 0  # given back after the call, as before
    finally:
        resp3.close()
    default = redis.ConnectionPool.from_url(server.url)
    assert can_keep_connections(default)
    default.cache = object()  # client-side caching: the pool hands out other connections
    assert not can_keep_connections(default)


def test_greenlets_sharing_a_thread_take_a_connection_per_call(monkeypatch: Any) -> None:
    patched = {"socket"}  # gevent patching sockets but not threads: one thread, many greenlets
    monkey = types.SimpleNamespace(is_module_patched=lambda name: name in patched)
    monkeypatch.setitem(sys.modules, "gevent.monkey", monkey)
    pool = redis.ConnectionPool()
    assert not can_keep_connections(pool)
    patched.add("threading")  # a greenlet-local threading.local: one connection per greenlet
    assert can_keep_connections(pool)


def test_a_kept_connection_collected_during_the_interpreters_teardown_raises_nothing(
    server: StandaloneServer, monkeypatch: Any
) -> None:
    """The main thread's kept connection may be collected at exit after the interpreter set
    the module's globals to None (seen at the end of a benchmark run: "Exception ignored in
    _Pinned.__del__"): nothing needs its connection back then, and nothing may be printed."""
    pool = redis.ConnectionPool.from_url(server.url)
    pinned = kept_connections._Pinned(pool, kept_connections._Allowance(1))
    monkeypatch.setattr(kept_connections, "_ended", None)  # what the teardown leaves
    pinned.__del__()  # raised AttributeError: 'NoneType' object has no attribute 'append'
    monkeypatch.undo()
    before = len(kept_connections._ended)
    pinned.__del__()  # a thread that ended while the interpreter runs: queued to give back
    assert len(kept_connections._ended) == before + 1
    kept_connections._give_back_ended()
    assert not kept_connections._ended
    pinned.pid = None  # its collection after the test must not queue the connection again
    pool.disconnect()
