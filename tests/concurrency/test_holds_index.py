"""The live-holds index (issue 14) against the holds themselves, in a real Redis.

The ground truth is ``state.live_holds()`` — a SCAN of every lock and semaphore key under the
prefix, O(keys) — and the index must agree with it after any sequence of admissions, releases,
renewals, lapses (a lock key expiring, a semaphore lease running out) and force-releases: it
never lists a hold that is gone and never misses a live one, and its by-expiry entry of every
live hold is the hold's lease as Redis has it. Paging through it, in every ordering, returns
each hold once, also while holds come and go between pages.
"""

from __future__ import annotations

import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor_app.coordination import holds_index, lock, semaphore, state
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim, SemaphoreClaim
from reactor_app.coordination.redis import get_client
from reactor_app.testing.pytest_plugin import delete_prefixed_keys, new_key_prefix
from tests.concurrency.harness import assert_listed_in_order, churn_between_pages

KEYS = ["a", "a:1", "a:2", "b"]
OWNERS = ["o1", "o2", "o3"]

operation = st.one_of(
    st.tuples(st.just("lock"), st.sampled_from(KEYS), st.sampled_from(OWNERS)),
    st.tuples(st.just("semaphore"), st.sampled_from(KEYS), st.sampled_from(OWNERS)),
    st.tuples(st.just("release"), st.integers(0, 20), st.just("")),
    st.tuples(st.just("lapse"), st.integers(0, 20), st.just("")),
    st.tuples(st.just("renew"), st.integers(0, 20), st.integers(31, 90)),
    st.tuples(st.just("force"), st.sampled_from(KEYS), st.sampled_from(["lock", "semaphore"])),
)


def identities(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(r["primitive"], r["key"], r["owner"]) for r in rows]


def every_page(coordinator: Coordinator, limit: int, **filters: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cursor = None
    for _ in range(100):
        page = holds_index.page(
            limit=limit,
            cursor=cursor,
            client=coordinator.client,
            prefix=coordinator.prefix,
            **filters,
        )
        rows += page.rows
        cursor = page.next_cursor
        if cursor is None:
            return rows
    raise AssertionError("paging never ended")


def lease_ms(coordinator: Coordinator, primitive: str, user_key: str, owner: str) -> int | None:
    """When the hold's lease ends as Redis has it (ms), or None when it is gone."""
    client = coordinator.client
    if primitive == "lock":
        name = lock.hold_key(user_key, coordinator.prefix)
        seconds, micros = client.time()
        if client.hget(name, "owner") != owner:
            return None
        left = client.pttl(name)
        return int(seconds) * 1000 + int(micros) // 1000 + left if left > 0 else None
    expiry = client.zscore(semaphore.leases_key(user_key, coordinator.prefix), owner)
    return int(expiry) if expiry is not None else None


def check_orderings(coordinator: Coordinator, truth: list[tuple[str, str, str]]) -> None:
    """Every ordering pages through exactly the live holds, each once, in its order."""
    by_time = every_page(coordinator, limit=3)
    for ordering in ("-acquired", "ttl", "-ttl"):
        rows = every_page(coordinator, limit=3, ordering=ordering)
        listed = identities(rows)
        assert len(listed) == len(set(listed)), f"{ordering}: listed twice: {listed}"
        assert sorted(listed) == truth, ordering
        assert_listed_in_order(rows, ordering)
        if ordering == "-acquired":
            assert sorted(listed) == sorted(identities(by_time))


def lapse(coordinator: Coordinator, admitted: Admitted) -> None:
    """Make the hold lapse as a dead holder's would: the lock key expires, the lease runs out."""
    client = coordinator.client
    hold = admitted.holds[0]
    if hold.claim.primitive == "lock":
        client.pexpire(lock.hold_key(hold.claim.key, coordinator.prefix), 1)
    else:
        seconds, micros = client.time()
        past = int(seconds) * 1000 + int(micros) // 1000 - 1
        leases = semaphore.leases_key(hold.claim.key, coordinator.prefix)
        client.zadd(leases, {admitted.holder.owner: past}, xx=True)
    time.sleep(0.003)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(operation, min_size=1, max_size=25))
def test_the_index_lists_exactly_the_live_holds(operations: list[tuple[Any, ...]]) -> None:
    prefix = new_key_prefix("idx")
    coordinator = Coordinator(client=get_client(), prefix=prefix)
    taken: list[Admitted] = []
    lapsed: set[tuple[str, str, str]] = set()  # holds that lapsed since the last listing
    try:
        for kind, first, second in operations:
            if kind in ("lock", "semaphore"):
                claim = (
                    LockClaim(first, ttl=30)
                    if kind == "lock"
                    else SemaphoreClaim(first, limit=2, ttl=30)
                )
                holder = Holder(owner=second, execution_id=f"x-{second}", step="s")
                admitted = coordinator.admit([claim], holder)
                if isinstance(admitted, Admitted):
                    taken.append(admitted)
            elif kind == "release" and taken:
                coordinator.release(taken.pop(first % len(taken)), "success")
            elif kind == "lapse" and taken:
                lapsed_one = taken[first % len(taken)]
                claim = lapsed_one.holds[0].claim
                owner = lapsed_one.holder.owner
                # only a hold still live: a lapsed lock's key may be another owner's by now
                if lease_ms(coordinator, claim.primitive, claim.key, owner) is not None:
                    lapse(coordinator, lapsed_one)
                    lapsed.add((claim.key, claim.primitive, owner))
            elif kind == "renew" and taken:
                renewed = taken[first % len(taken)]
                coordinator.extend(renewed.holds, renewed.holder.owner, lease_ms=second * 1000)
            elif kind == "force":
                coordinator.force_release(second, first)

            truth = sorted(identities(state.live_holds(client=coordinator.client, prefix=prefix)))
            # the scripts themselves keep the index: every live hold is in it, and the only
            # extra entries are holds that lapsed (no script ran for them) and await a reader
            entries = set(holds_index.all_entries(client=coordinator.client, prefix=prefix))
            live = {(k, p, o) for p, k, o in truth}
            assert live <= entries, f"missing from the index: {live - entries}"
            assert entries - live <= lapsed, f"stale in the index: {entries - live - lapsed}"
            # the by-expiry entry of a live hold is its lease (a renewal moved it)
            expiries = dict(holds_index.expiry_entries(client=coordinator.client, prefix=prefix))
            for entry in live:
                actual = lease_ms(coordinator, entry[1], entry[0], entry[2])
                assert actual is not None and abs(expiries[entry] - actual) <= 50, entry
            listed = identities(every_page(coordinator, limit=3))
            assert len(listed) == len(set(listed)), f"listed twice: {listed}"
            assert sorted(listed) == truth
            under_a = identities(every_page(coordinator, limit=2, key_prefix="a:"))
            assert sorted(under_a) == [t for t in truth if t[1].startswith("a:")]
            lapsed.clear()  # the full listing pruned them
            check_orderings(coordinator, truth)
            counts = holds_index.totals(client=coordinator.client, prefix=prefix)
            assert counts == {p: sum(1 for t in truth if t[0] == p) for p in ("lock", "semaphore")}
        # every entry still in the index after a full listing is a live hold
        remaining = holds_index.all_entries(client=coordinator.client, prefix=prefix)
        truth_set = {(k, p, o) for p, k, o in identities(state.live_holds(prefix=prefix))}
        assert set(remaining) == truth_set
    finally:
        delete_prefixed_keys(coordinator.client, prefix)


def test_paging_returns_each_steady_hold_once_while_others_come_and_go(redis_prefix: str) -> None:
    prefix = redis_prefix
    coordinator = Coordinator(client=get_client(), prefix=prefix)
    steady = {}
    for n in range(40):
        admitted = coordinator.admit([LockClaim(f"steady:{n}", ttl=60)], Holder(owner=f"s{n}"))
        assert isinstance(admitted, Admitted)
        steady[f"steady:{n}"] = admitted
    churn: list[Admitted] = []
    seen: list[tuple[str, str, str]] = []
    cursor = None
    pages = 0
    while True:
        page = holds_index.page(limit=6, cursor=cursor, client=coordinator.client, prefix=prefix)
        seen += identities(page.rows)
        pages += 1
        churn_between_pages(coordinator, churn, f"churn:{pages}", f"c{pages}")
        cursor = page.next_cursor
        if cursor is None:
            break
        assert pages < 100
    assert len(seen) == len(set(seen)), "a hold was listed twice"
    steady_seen = [s for s in seen if s[1].startswith("steady:")]
    assert sorted(steady_seen) == sorted(("lock", k, a.holder.owner) for k, a in steady.items())


def test_totals_come_from_the_index_and_an_exact_key_is_found_among_many(redis_prefix: str) -> None:
    prefix = redis_prefix
    coordinator = Coordinator(client=get_client(), prefix=prefix)
    for n in range(120):
        claim = LockClaim(f"k:{n:03d}", ttl=60) if n % 3 else SemaphoreClaim(f"k:{n:03d}", 5)
        assert isinstance(coordinator.admit([claim], Holder(owner=f"o{n}")), Admitted)
    first = holds_index.page(limit=10, client=coordinator.client, prefix=prefix)
    assert first.totals == {"lock": 80, "semaphore": 40}
    assert len(first.rows) == 10 and first.next_cursor is not None
    found = holds_index.page(limit=10, key="k:042", client=coordinator.client, prefix=prefix)
    assert identities(found.rows) == [("semaphore", "k:042", "o42")]
    assert found.next_cursor is None
    # k:01 matches k:010 ... k:019 only
    under = holds_index.page(limit=50, key_prefix="k:01", client=coordinator.client, prefix=prefix)
    assert [r["key"] for r in under.rows] == [f"k:{n:03d}" for n in range(10, 20)]


def test_an_exact_key_or_a_primitive_filter_reads_only_the_holds_it_can_return(
    redis_prefix: str, monkeypatch: Any
) -> None:
    """A listing reads each walked entry's hold state; an exact key walks only that key's own
    entries (not every longer key that starts with it) and a primitive filter reads no state
    of another primitive's entries: both cost what they return, not the index's size."""
    prefix = redis_prefix
    coordinator = Coordinator(client=get_client(), prefix=prefix)
    for n in range(300):
        assert isinstance(
            coordinator.admit([LockClaim(f"k:1{n}", ttl=60)], Holder(owner=f"o{n}")), Admitted
        )
    assert isinstance(coordinator.admit([LockClaim("k:1", ttl=60)], Holder(owner="o-1")), Admitted)
    assert isinstance(coordinator.admit([SemaphoreClaim("k:1", 5)], Holder(owner="o-2")), Admitted)
    read: list[int] = []
    states = holds_index._states

    def counted(client: Any, prefix: str, entries: list[Any]) -> Any:
        read.append(len(entries))
        return states(client, prefix, entries)

    monkeypatch.setattr(holds_index, "_states", counted)
    exact = holds_index.page(limit=10, key="k:1", client=coordinator.client, prefix=prefix)
    assert sorted(identities(exact.rows)) == [("lock", "k:1", "o-1"), ("semaphore", "k:1", "o-2")]
    assert sum(read) == 2, read
    read.clear()
    semaphores = holds_index.page(
        limit=10, primitive="semaphore", client=coordinator.client, prefix=prefix
    )
    assert identities(semaphores.rows) == [("semaphore", "k:1", "o-2")]
    assert sum(read) == 1, read


def test_an_entry_of_a_primitive_this_version_cannot_read_is_passed_over(redis_prefix: str) -> None:
    """The index is written by the scripts only, but a Redis shared with another version (a
    primitive added there) or edited by hand can hold entries this one has no module for: the
    listing and the pruning pass them over, like a malformed member, instead of failing the
    operator's page."""
    prefix = redis_prefix
    coordinator = Coordinator(client=get_client(), prefix=prefix)
    assert isinstance(
        coordinator.admit([LockClaim("k:known", ttl=60)], Holder(owner="o1")), Admitted
    )
    time_key, keys_key, ttl_key, _ = holds_index.index_keys(prefix)
    stranger = holds_index.member("k:stranger", "gizmo", "o2")
    client = coordinator.client
    client.zadd(time_key, {stranger: time.time()})
    client.zadd(keys_key, {stranger: 0})
    client.zadd(ttl_key, {stranger: time.time() * 1000 + 60_000})
    listed = holds_index.page(limit=10, client=client, prefix=prefix)
    assert identities(listed.rows) == [("lock", "k:known", "o1")]
    by_key = holds_index.page(limit=10, key_prefix="k:", client=client, prefix=prefix)
    assert identities(by_key.rows) == [("lock", "k:known", "o1")]
