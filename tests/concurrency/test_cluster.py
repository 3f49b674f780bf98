"""Coordination on a real 3-master Redis Cluster: what only a cluster can get wrong.

The primitive tests and the SC scenarios already run on the cluster (``redis_topology``, the
``url`` fixture of ``test_primitives``). Here: a step whose claims live on several nodes is
admitted claim by claim and gives back what it took on a refusal; operator reads and test
cleanup fan out over every primary; a client that knows only one startup node follows MOVED to
the others; a cluster that lost a node, and a one-server client pointed at a cluster node,
surface as ``CoordinationUnavailable`` — never as a generic step failure.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from reactor_app import (
    Reactor,
    Step,
    Success,
    from_input,
    step,
    with_lock,
    with_rate_limit,
    with_semaphore,
)
from reactor_app.coordination import holds_index, state
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    Admitted,
    Holder,
    LockClaim,
    OrderedLockClaim,
    PeriodClaim,
    RateLimitClaim,
    RateWindow,
    Refused,
    SemaphoreClaim,
)
from reactor_app.coordination.keys import hash_slot, key
from reactor_app.coordination.primitives import REGISTRY
from reactor_app.coordination.redis import get_client, is_cluster
from reactor_app.exceptions import CoordinationUnavailable
from reactor_app.testing.pytest_plugin import delete_prefixed_keys
from tests.concurrency.harness import (
    assert_listed_in_order,
    churn_between_pages,
    max_concurrency,
    now_ns,
    overlaps,
    run_in_processes,
)

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def cluster(reactor_redis_cluster: Any, settings: Any, redis_prefix: str) -> Any:
    """The session cluster as this test's coordination Redis; its keys deleted afterwards."""
    settings.REACTOR_REDIS_URL = reactor_redis_cluster.url
    assert is_cluster(get_client())
    yield reactor_redis_cluster
    delete_prefixed_keys(get_client(reactor_redis_cluster.url), redis_prefix)


def node_port(cluster: Any, redis_key: str) -> int:
    return int(cluster.port_of_slot(hash_slot(redis_key)))


def keys_on_distinct_nodes(cluster: Any, primitive: str, count: int, stem: str) -> list[str]:
    """``count`` user keys whose ``primitive`` keys live on ``count`` different primaries."""
    found: dict[int, str] = {}
    for index in range(1000):
        user_key = f"{stem}:{index}"
        found.setdefault(node_port(cluster, key(primitive, user_key)), user_key)
        if len(found) == count:
            return list(found.values())
    raise AssertionError("could not spread keys over the nodes")


def five_claims(account: str, coordinator: Coordinator | None = None) -> list[Any]:
    coordinator = coordinator or Coordinator()
    position = coordinator.assign_position("line:x", Holder(owner="o5"))
    return [
        OrderedLockClaim("line:x", position),
        PeriodClaim("nightly", every=3600),
        LockClaim(account, ttl=30),
        SemaphoreClaim("gateway", limit=2, ttl=30),
        RateLimitClaim("api", (RateWindow(1.0, 1000, "second"),)),
    ]


def test_a_step_spanning_slots_is_admitted_claim_by_claim_and_released(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator = Coordinator()
    claims = five_claims("acct:1")[2:]  # lock, semaphore, rate limit
    prefix = coordinator.prefix
    names = [REGISTRY[c.primitive].admit_keys(c, prefix)[0] for c in claims]
    assert len({hash_slot(n) for n in names}) == 3
    assert len({node_port(cluster, n) for n in names}) >= 2, "the step should span nodes"

    calls: list[int] = []
    one_call = Coordinator._admit_call

    def counting(self: Coordinator, claims: Any, *args: Any) -> Any:
        calls.append(len(claims))
        return one_call(self, claims, *args)

    monkeypatch.setattr(Coordinator, "_admit_call", counting)
    admitted = coordinator.admit(claims, Holder(owner="o1", step="charge"))
    assert isinstance(admitted, Admitted), admitted
    assert calls == [1, 1, 1]  # one script call per claim: the keys cannot share a slot
    assert state.lock_state("acct:1").held
    assert state.semaphore_state("gateway").held == 1
    assert state.rate_limit_count("api", 1.0) == 1
    coordinator.release(admitted, "success")
    assert not state.lock_state("acct:1").held
    assert state.semaphore_state("gateway").held == 0


def test_a_refusal_part_way_gives_back_what_was_taken(cluster: Any) -> None:
    coordinator = Coordinator()
    full = coordinator.admit([SemaphoreClaim("gateway", limit=1)], Holder(owner="elsewhere"))
    assert isinstance(full, Admitted)

    result = coordinator.admit(
        [
            LockClaim("acct:7"),
            SemaphoreClaim("gateway", limit=1),
            RateLimitClaim("api", (RateWindow(60.0, 5, "minute"),)),
        ],
        Holder(owner="o2"),
    )
    assert isinstance(result, Refused)
    assert result.claim.primitive == "semaphore"
    # the lock taken before the refusal was given back; the rate limit (after it) never charged
    assert not state.lock_state("acct:7").held
    assert state.rate_limit_count("api", 60.0) == 0
    coordinator.release(full, "success")


def test_five_primitives_on_five_slots_are_all_taken_and_all_released(cluster: Any) -> None:
    coordinator = Coordinator()
    claims = five_claims("acct:5")
    prefix = coordinator.prefix
    groups = [REGISTRY[c.primitive].admit_keys(c, prefix) for c in claims]
    assert len({hash_slot(g[0]) for g in groups}) == 5
    admitted = coordinator.admit(claims, Holder(owner="o5", execution_id="e5", step="s"))
    assert isinstance(admitted, Admitted), admitted
    assert len(admitted.holds) == 5
    coordinator.release(admitted, "success")
    assert state.period_marked("nightly", 3600) == "e5"
    assert not state.lock_state("acct:5").held
    assert state.ordered_state("line:x").last_completed == 1


# -- a cross-slot step under real parallelism ------------------------------------------------

TRACE: list[tuple[str, int, int]] = []


@with_lock(lambda args: f"acct:{args['account']}", ttl=30, wait=60)
@with_semaphore(lambda args: "gateway", limit=2, wait=60)
@with_rate_limit(lambda args: "api", limit=10_000, period="minute")
class ChargeStep(Step):
    inputs = ("account",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        start = now_ns()
        time.sleep(0.01)
        TRACE.append((f"acct:{args['account']}", start, now_ns()))
        return Success("ok")


class ChargeReactor(Reactor):
    inputs = ("account",)
    charge = step(ChargeStep, account=from_input("account"))


def _charges(accounts: list[int], runs: int) -> list[tuple[str, int, int]]:
    TRACE.clear()
    for index in range(runs):
        result = ChargeReactor.run(account=accounts[index % len(accounts)])
        assert result.ok, result.error
    return list(TRACE)


def test_cross_slot_step_under_four_processes_keeps_lock_and_semaphore(cluster: Any) -> None:
    accounts = keys_on_distinct_nodes(cluster, "lock", 3, "acct")
    numbers = [int(name.split(":")[1]) for name in accounts]
    traces = run_in_processes(_charges, [(numbers, 12) for _ in range(4)])
    intervals = [entry for trace in traces for entry in trace]
    assert len(intervals) == 48
    for account in accounts:
        same = [i for i in intervals if i[0] == account]
        assert same and overlaps(same) == [], f"two holders of {account} overlapped"
    assert max_concurrency(intervals) <= 2  # the semaphore, on yet another slot
    assert state.live_holds() == []


# -- fan-out reads and cleanup ---------------------------------------------------------------


def test_live_holds_and_cleanup_reach_every_primary(cluster: Any, redis_prefix: str) -> None:
    coordinator = Coordinator()
    accounts = keys_on_distinct_nodes(cluster, "lock", 3, "spread")
    pools = keys_on_distinct_nodes(cluster, "semaphore", 3, "pool")
    holds = [coordinator.admit([LockClaim(a)], Holder(owner=f"o-{a}")) for a in accounts]
    holds += [
        coordinator.admit([SemaphoreClaim(p, limit=2)], Holder(owner=f"o-{p}")) for p in pools
    ]
    assert all(isinstance(h, Admitted) for h in holds)
    live = state.live_holds()
    listed = {(h["primitive"], h["key"]) for h in live}
    assert listed == {("lock", a) for a in accounts} | {("semaphore", p) for p in pools}
    assert all(h["ttl_left"] and h["ttl_left"] > 0 for h in live)

    client = get_client()
    deleted = delete_prefixed_keys(client, redis_prefix)
    assert deleted >= 3
    assert list(client.scan_iter(match=f"{redis_prefix}:*")) == []


def test_a_client_knowing_one_startup_node_follows_moved_to_the_others(
    cluster: Any, settings: Any
) -> None:
    first = cluster.ports[0]
    settings.REACTOR_REDIS_URL = f"redis+cluster://127.0.0.1:{first}"
    accounts = keys_on_distinct_nodes(cluster, "lock", 3, "moved")
    assert {node_port(cluster, key("lock", a)) for a in accounts} - {first}
    coordinator = Coordinator()
    for account in accounts:
        admitted = coordinator.admit([LockClaim(account)], Holder(owner="o"))
        assert isinstance(admitted, Admitted)
        coordinator.release(admitted, "success")


# -- outages -------------------------------------------------------------------------------


class OneLock(Reactor):
    inputs = ("account",)

    @step(account=from_input("account"))
    @with_lock(lambda args: args["account"], ttl=10, wait=0)
    def charge(self, args: dict[str, Any], context: Any) -> Any:
        RAN.append(args["account"])
        return Success("ok")


RAN: list[str] = []


def test_a_one_server_client_on_a_cluster_node_is_coordination_unavailable(
    cluster: Any, settings: Any
) -> None:
    first = cluster.ports[0]
    elsewhere = next(
        f"acct:{n}" for n in range(1000) if node_port(cluster, key("lock", f"acct:{n}")) != first
    )
    settings.REACTOR_REDIS_URL = f"redis://127.0.0.1:{first}/0"
    RAN.clear()
    result = OneLock.run(account=elsewhere)
    assert RAN == []
    assert isinstance(result.error, CoordinationUnavailable), result.error
    assert "redis+cluster://" in str(result.error)  # the message says how to configure it


def test_a_cluster_that_lost_a_primary_is_coordination_unavailable(
    settings: Any, redis_prefix: str, reactor_redis_cluster: Any
) -> None:
    # (reactor_redis_cluster: the harness's verdict on the redis-server binary, not used)
    from reactor_app.testing.servers import RedisClusterServers

    with RedisClusterServers(node_timeout_ms=500) as private:
        settings.REACTOR_REDIS_URL = private.url
        victim = private.servers[-1]
        account = next(
            f"acct:{n}"
            for n in range(1000)
            if private.port_of_slot(hash_slot(key("lock", f"acct:{n}"))) == victim.port
        )
        RAN.clear()
        assert OneLock.run(account=account).ok  # the node is up: it runs
        victim.kill()
        time.sleep(1.5)  # past node_timeout: the others mark the cluster down
        result = OneLock.run(account=account)
        assert [account] == RAN  # the second run never reached its body
        assert isinstance(result.error, CoordinationUnavailable), result.error


def test_acl_credentials_reach_every_node(cluster: Any, settings: Any) -> None:
    """An ACL user (not ``default``) on every primary; the URL's credentials are used for the
    startup node and for every node the client discovers through MOVED."""
    import redis

    user, password = "reactor-acl-test", "s3cret-acl"
    nodes = [redis.Redis(host="127.0.0.1", port=port) for port in cluster.ports]
    for node in nodes:
        node.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all")
    try:
        first = cluster.ports[0]
        settings.REACTOR_REDIS_URL = f"redis+cluster://{user}:{password}@127.0.0.1:{first}"
        coordinator = Coordinator()
        assert coordinator.client.acl_whoami() == user
        for account in keys_on_distinct_nodes(cluster, "lock", 3, "acl"):
            admitted = coordinator.admit([LockClaim(account)], Holder(owner="o"))
            assert isinstance(admitted, Admitted)
            coordinator.release(admitted, "success")

        settings.REACTOR_REDIS_URL = f"redis+cluster://{user}:wrong@127.0.0.1:{first}"
        with pytest.raises(CoordinationUnavailable):
            Coordinator().admit([LockClaim("acl:denied")], Holder(owner="o"))
    finally:
        for node in nodes:
            node.execute_command("ACL", "DELUSER", user)


def test_reactor_redis_status_describes_a_dict_configured_cluster(
    reactor_redis_cluster: Any, settings: Any
) -> None:
    from io import StringIO

    from django.core.management import call_command

    settings.REACTOR_REDIS_URL = None
    settings.REACTOR_REDIS = {
        "cluster": True,
        "startup_nodes": [f"127.0.0.1:{port}" for port in reactor_redis_cluster.ports],
    }
    out = StringIO()
    call_command("reactor_redis", "status", stdout=out)
    text = out.getvalue()
    assert "topology:     Redis Cluster via 127.0.0.1:" in text and "(REACTOR_REDIS)" in text
    assert "answers:      yes" in text


# -- the live-holds index, sharded by hash slot ------------------------------------------------


def _every_page(client: Any, prefix: str, limit: int, **filters: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cursor = None
    for _ in range(200):
        page = holds_index.page(limit=limit, cursor=cursor, client=client, prefix=prefix, **filters)
        rows += page.rows
        cursor = page.next_cursor
        if cursor is None:
            return rows
    raise AssertionError("paging never ended")


def _ids(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(r["primitive"], r["key"], r["owner"]) for r in rows]


def test_the_index_shard_of_a_hold_shares_its_slot(cluster: Any, redis_prefix: str) -> None:
    for user_key in ("acct:1", "acct:2", "{odd}", "k" * 40):
        keys = holds_index.keys_for(user_key, redis_prefix, sharded=True)
        hold_slot = hash_slot(key("lock", user_key, prefix=redis_prefix))
        assert {hash_slot(name) for name in keys} == {hold_slot}
        assert hash_slot(key("semaphore", user_key, prefix=redis_prefix)) == hold_slot
    tags = holds_index.slot_tags()
    assert len(set(tags)) == holds_index.SLOTS
    assert all(hash_slot(tag) == slot for slot, tag in enumerate(tags))


def test_the_index_lists_pages_and_orders_holds_across_every_primary(
    cluster: Any, redis_prefix: str
) -> None:
    client = get_client()
    coordinator = Coordinator()
    taken: list[Admitted] = []
    for n in range(45):
        claim = (
            LockClaim(f"ix:{n:02d}", ttl=20 + n % 7)
            if n % 4
            else SemaphoreClaim(f"ix:{n:02d}", limit=3, ttl=20 + n % 5)
        )
        admitted = coordinator.admit([claim], Holder(owner=f"o{n}", step="s"))
        assert isinstance(admitted, Admitted)
        taken.append(admitted)
    ports = {node_port(cluster, key("lock", f"ix:{n:02d}")) for n in range(45)}
    assert len(ports) == 3  # the holds (and their index shards) are on every primary
    truth = sorted(_ids(state.live_holds()))
    assert len(truth) == 45
    assert holds_index.totals(client=client, prefix=redis_prefix) == {
        "lock": 33,
        "semaphore": 12,
    }
    for ordering in (None, "-acquired", "ttl", "-ttl"):
        rows = _every_page(client, redis_prefix, 7, ordering=ordering)
        listed = _ids(rows)
        assert len(listed) == len(set(listed)), ordering
        assert sorted(listed) == truth, ordering
        assert_listed_in_order(rows, ordering)
    # by key prefix: every shard's matches, merged in key order
    under = _every_page(client, redis_prefix, 4, key_prefix="ix:1")
    assert [r["key"] for r in under] == [f"ix:{n}" for n in range(10, 20)]
    exact = holds_index.page(key="ix:07", client=client, prefix=redis_prefix)
    assert _ids(exact.rows) == [("lock", "ix:07", "o7")]
    # a renewal moves the hold to the end of the ttl order
    renewed = taken[5]
    coordinator.extend(renewed.holds, renewed.holder.owner, lease_ms=600_000)
    last = _every_page(client, redis_prefix, 50, ordering="ttl")[-1]
    assert (last["key"], last["owner"]) == ("ix:05", "o5")
    for admitted in taken:
        coordinator.release(admitted, "success")
    assert holds_index.all_entries(client=client, prefix=redis_prefix) == []
    assert holds_index.totals(client=client, prefix=redis_prefix) == {"lock": 0, "semaphore": 0}


def test_lapsed_holds_are_never_listed_and_are_pruned_on_a_cluster(
    cluster: Any, redis_prefix: str
) -> None:
    client = get_client()
    coordinator = Coordinator()
    taken = {}
    for n in range(12):
        claim = LockClaim(f"lp:{n}", ttl=30) if n % 2 else SemaphoreClaim(f"lp:{n}", 2, ttl=30)
        admitted = coordinator.admit([claim], Holder(owner=f"o{n}"))
        assert isinstance(admitted, Admitted)
        taken[n] = admitted
    gone = {0, 3, 4, 7}  # lapse as a killed holder's would: the lock key expires, a lease ends
    for n in gone:
        if n % 2:
            client.pexpire(key("lock", f"lp:{n}"), 1)
        else:
            client.zadd(key("semaphore", f"lp:{n}"), {f"o{n}": 1}, xx=True)
    time.sleep(0.01)
    assert len(holds_index.all_entries(client=client, prefix=redis_prefix)) == 12
    for ordering in (None, "ttl", "-ttl", "-acquired"):
        listed = {r["key"] for r in _every_page(client, redis_prefix, 3, ordering=ordering)}
        assert listed == {f"lp:{n}" for n in range(12) if n not in gone}, ordering
    remaining = {e[0] for e in holds_index.all_entries(client=client, prefix=redis_prefix)}
    assert remaining == {f"lp:{n}" for n in range(12) if n not in gone}


def test_paging_on_a_cluster_returns_each_steady_hold_once_while_others_come_and_go(
    cluster: Any, redis_prefix: str
) -> None:
    client = get_client()
    coordinator = Coordinator()
    steady = set()
    for n in range(30):
        assert isinstance(
            coordinator.admit([LockClaim(f"st:{n}")], Holder(owner=f"s{n}")), Admitted
        )
        steady.add(("lock", f"st:{n}", f"s{n}"))
    for ordering in (None, "-acquired", "ttl", "-ttl"):
        churn: list[Admitted] = []
        seen: list[tuple[str, str, str]] = []
        cursor = None
        for pages in range(100):
            page = holds_index.page(
                limit=4, cursor=cursor, ordering=ordering, client=client, prefix=redis_prefix
            )
            seen += _ids(page.rows)
            churn_between_pages(coordinator, churn, f"ch:{ordering}:{pages}", "c")
            cursor = page.next_cursor
            if cursor is None:
                break
        assert len(seen) == len(set(seen)), ordering
        assert {s for s in seen if s[1].startswith("st:")} == steady, ordering
        for admitted in churn:
            coordinator.release(admitted, "success")
