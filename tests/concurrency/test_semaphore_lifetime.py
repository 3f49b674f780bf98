"""How long a semaphore's keys live, in a real Redis (docs/coordination.md, "How long a
semaphore's keys live").

A semaphore's leases (a zset) and holders (a hash) must live as long as its longest lease: a key
lost early loses the slots it holds (more holders than the limit), one kept for ever is a leak.
Every write of a lease keeps them so, and sets their lifetimes — a quarter of a lease longer than
needed — only when the leases' falls short of the lease it wrote. The property test plays random
sequences of admissions (new and re-entrant, two lease lengths), releases, renewals, an
operator's force-release and time passing (simulated: every lease, every lifetime moved back
alike, as waiting would), and after each checks that both keys have an expiry and outlive every
lease. The command counts show what it saves: an admission within the spare quarter of the last
setting sends no ``PEXPIRE``.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor_app.coordination import semaphore
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, SemaphoreClaim
from reactor_app.coordination.redis import get_client
from reactor_app.testing.pytest_plugin import delete_prefixed_keys, new_key_prefix
from tests.concurrency.harness import pass_time_on, pexpires

KEY = "pool"
OWNERS = ["o1", "o2", "o3", "o4"]
#: ms of Redis time between two reads of it
EPSILON_MS = 100

operation = st.one_of(
    st.tuples(st.just("admit"), st.sampled_from(OWNERS), st.sampled_from([30, 60])),
    st.tuples(st.just("release"), st.integers(0, 20), st.just(0)),
    st.tuples(st.just("renew"), st.integers(0, 20), st.sampled_from([0, 20, 90])),
    st.tuples(st.just("force"), st.just(""), st.just(0)),
    # time passes: this many seconds (around the leases' lengths and their spare quarters,
    # where a new lease ends just past what the last setting covered)
    st.tuples(st.just("age"), st.just(""), st.sampled_from([1, 5, 8, 14, 16, 18, 20, 29, 31, 45])),
)


def holder(name: str) -> Holder:
    return Holder(owner=name, execution_id=f"exec-{name}", step="work", reactor="tests.Pool")


def now_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def pool_keys(prefix: str) -> list[str]:
    return [semaphore.leases_key(KEY, prefix), semaphore.holders_key(KEY, prefix)]


def age(client: Any, prefix: str, seconds: int) -> None:
    """What waiting ``seconds`` does to the semaphore's keys, without the wait."""
    shift_ms = seconds * 1000
    leases = semaphore.leases_key(KEY, prefix)
    held = client.zrange(leases, 0, -1, withscores=True)
    if held:
        client.zadd(leases, {owner: score - shift_ms for owner, score in held}, xx=True)
    pass_time_on(client, pool_keys(prefix), shift_ms)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(operation, min_size=1, max_size=30))
def test_the_keys_outlive_every_lease_and_never_live_for_ever(
    operations: list[tuple[str, Any, int]],
) -> None:
    prefix = new_key_prefix("slife")
    client = get_client()
    coordinator = Coordinator(client=client, prefix=prefix)
    taken: list[Admitted] = []
    try:
        for kind, first, second in operations:
            if kind == "admit":
                claim = SemaphoreClaim(KEY, limit=3, ttl=second)
                result = coordinator.admit([claim], holder(first))
                if isinstance(result, Admitted):
                    taken.append(result)
            elif kind == "release" and taken:
                coordinator.release(taken.pop(first % len(taken)), "success")
            elif kind == "renew" and taken:
                renewed = taken[first % len(taken)]
                coordinator.extend(renewed.holds, renewed.holder.owner, lease_ms=second * 1000)
            elif kind == "force":
                coordinator.force_release("semaphore", KEY)
            elif kind == "age":
                age(client, prefix, second)

            now = now_ms(client)
            leases = client.zrange(semaphore.leases_key(KEY, prefix), 0, -1, withscores=True)
            longest = max((int(score) for _, score in leases), default=None)
            for name in pool_keys(prefix):
                left = client.pttl(name)
                assert left != -1, f"{name} has no expiry"
                if longest is not None and longest > now:
                    assert left != -2, f"{name} is gone while a lease lives"
                    assert now + left >= longest - EPSILON_MS, (
                        f"{name} ends {longest - now - left} ms before the longest lease"
                    )
    finally:
        delete_prefixed_keys(client, prefix)


# -- what it saves ------------------------------------------------------------------------------


def test_admissions_within_the_spare_quarter_set_no_lifetimes(private_redis: Any) -> None:
    client = private_redis
    coordinator = Coordinator(client=client, prefix="slife")
    claim = SemaphoreClaim(KEY, limit=10, ttl=60)
    first = coordinator.admit([claim], holder("a"))
    assert isinstance(first, Admitted)

    before = pexpires(client)
    for name in ("b", "c", "d"):
        assert isinstance(coordinator.admit([claim], holder(name)), Admitted)
    assert pexpires(client) == before  # the first admission's spare quarter covers these

    age(client, "slife", 16)  # past the spare quarter (15 s) of the 60 s lease
    before = pexpires(client)  # (the aging's own PEXPIREs counted out)
    assert isinstance(coordinator.admit([claim], holder("e")), Admitted)
    assert pexpires(client) == before + 2  # the leases' and the holders' lifetimes, once
    assert 75_000 - EPSILON_MS <= client.pttl(semaphore.leases_key(KEY, "slife")) <= 75_000
