"""How long a sliding rate limit's keys live, in a real Redis (docs/coordination.md, "How long a
window's keys live").

A window's zset of admissions and its running total live a window past their newest member. An
admission that sets the two lifetimes sets them a quarter of a window longer than that; the
admissions after it set them again only once the zset's lifetime no longer covers a window from
now. What must never happen is a member lost before it leaves its window (its charge
forgotten: the limit exceeded) or a key kept for ever. The property test plays random sequences
of weighted admissions, refusals (the limit full, and a second limit in the same admission
refusing after this one passed its check), give-backs and time passing (simulated: every
member's admission time and every lifetime moved back alike, as waiting would), and after each
checks that every key has an expiry and that each window's zset outlives its newest member's
window.

The command counts show what it saves: a limit admitted again within the spare quarter of its
shortest window sends no ``PEXPIRE``. And a writer that sets the lifetimes its own way (an older
version of the library during a rolling deploy) cannot mislead it: the lifetime is read from the
zset.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor_app.coordination import rate_limit
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, RateLimitClaim
from reactor_app.coordination.redis import get_client
from reactor_app.testing.pytest_plugin import delete_prefixed_keys, new_key_prefix
from tests.concurrency.harness import pass_time_on, pexpires

KEY = "api"
#: the limit under test, and a second one admitted with it that refuses often
WINDOWS = rate_limit.windows_from(limits={10: 6, 60: 20})
OTHER = rate_limit.windows_from(limits={30: 2})
#: ms of Redis time between two reads of it
EPSILON_MS = 100

operation = st.one_of(
    st.tuples(st.just("admit"), st.sampled_from([1, 1, 2, 3])),
    st.tuples(st.just("admit_both"), st.sampled_from([1, 2])),
    st.tuples(st.just("give_back"), st.integers(0, 20)),
    # time passes: this many seconds (around the windows' lengths and their spare quarters,
    # where an admission's window ends just past what the last setting covered)
    st.tuples(st.just("age"), st.sampled_from([1, 2, 3, 5, 8, 11, 13, 16, 31, 45, 61, 80])),
)


def holder(name: str) -> Holder:
    return Holder(owner=name, execution_id=f"exec-{name}", step="work", reactor="tests.Limit")


def now_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def limit_keys(user_key: str, prefix: str) -> list[str]:
    claim = RateLimitClaim(user_key, WINDOWS if user_key == KEY else OTHER)
    return rate_limit.admit_keys(claim, prefix)


def age(client: Any, prefix: str, seconds: int) -> None:
    """What waiting ``seconds`` does to the limits' keys, without the wait."""
    shift_ms = seconds * 1000
    for user_key, windows in ((KEY, WINDOWS), ("other", OTHER)):
        for window in windows:
            name = rate_limit.window_key(user_key, window.seconds, prefix=prefix)
            members = client.zrange(name, 0, -1, withscores=True)
            if members:
                client.zadd(name, {m: s - shift_ms * 1000 for m, s in members}, xx=True)
        pass_time_on(client, limit_keys(user_key, prefix), shift_ms)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(operation, min_size=1, max_size=30))
def test_a_window_keeps_every_member_until_it_leaves_and_no_key_for_ever(
    operations: list[tuple[str, int]],
) -> None:
    prefix = new_key_prefix("rlife")
    client = get_client()
    coordinator = Coordinator(client=client, prefix=prefix)
    taken: list[Admitted] = []
    try:
        for kind, value in operations:
            if kind in ("admit", "admit_both"):
                claims = [RateLimitClaim(KEY, WINDOWS, cost=value)]
                if kind == "admit_both":  # the other limit is checked after this one
                    claims.append(RateLimitClaim("other", OTHER))
                result = coordinator.admit(claims, holder(f"h{len(taken)}"))
                if isinstance(result, Admitted):
                    taken.append(result)
            elif kind == "give_back" and taken:
                coordinator.release(taken.pop(value % len(taken)), "give_back")
            elif kind == "age":
                age(client, prefix, value)

            now = now_ms(client)
            for user_key, windows in ((KEY, WINDOWS), ("other", OTHER)):
                for name in limit_keys(user_key, prefix):
                    assert client.pttl(name) != -1, f"{name} has no expiry"
                for window in windows:
                    name = rate_limit.window_key(user_key, window.seconds, prefix=prefix)
                    newest = client.zrange(name, -1, -1, withscores=True)
                    if not newest:
                        continue
                    leaves_ms = int(newest[0][1]) // 1000 + int(window.seconds * 1000)
                    left = client.pttl(name)
                    assert now + left >= leaves_ms - EPSILON_MS, (
                        f"{name} ends {leaves_ms - now - left} ms before its newest member "
                        "leaves the window"
                    )
    finally:
        delete_prefixed_keys(client, prefix)


# -- what it saves ------------------------------------------------------------------------------


def test_admissions_within_the_spare_quarter_set_no_lifetimes(private_redis: Any) -> None:
    client = private_redis
    coordinator = Coordinator(client=client, prefix="rlife")
    claim = RateLimitClaim(KEY, WINDOWS)
    first = coordinator.admit([claim], holder("a"))
    assert isinstance(first, Admitted)

    before = pexpires(client)
    for name in ("b", "c", "d"):
        assert isinstance(coordinator.admit([claim], holder(name)), Admitted)
    assert pexpires(client) == before  # the first admission's spare covers these

    age(client, "rlife", 3)  # past the spare quarter (2.5 s) of the 10 s window
    before = pexpires(client)  # (the aging's own PEXPIREs counted out)
    assert isinstance(coordinator.admit([claim], holder("e")), Admitted)
    # the 10 s window's zset and total, then the sequence (the longest window's lifetime);
    # the 60 s window's end still covers it, and the shown limits outlive 60 s already
    assert pexpires(client) == before + 3
    left = client.pttl(rate_limit.window_key(KEY, 10, prefix="rlife"))
    assert 12_500 - EPSILON_MS <= left <= 12_501


def test_a_lifetime_shortened_by_another_writer_is_set_again_at_the_next_admission(
    redis_prefix: str,
) -> None:
    """An older version of the library sets a window's keys to one window from its own
    admission; the next admission of this version reads the zset's lifetime and covers its own
    member, however recently it set the lifetimes itself."""
    client = get_client()
    coordinator = Coordinator(client=client, prefix=redis_prefix)
    claim = RateLimitClaim(KEY, WINDOWS)
    assert isinstance(coordinator.admit([claim], holder("a")), Admitted)
    window = rate_limit.window_key(KEY, 10, prefix=redis_prefix)
    client.pexpire(window, 4_000)  # the other writer's admission, 6 s ago
    client.pexpire(rate_limit.cost_key(KEY, 10, redis_prefix), 4_000)

    assert isinstance(coordinator.admit([claim], holder("b")), Admitted)
    assert client.pttl(window) >= 10_000  # outlives the member just admitted


def test_a_running_total_made_again_gets_a_lifetime_while_the_window_is_covered(
    redis_prefix: str,
) -> None:
    """The total can go while its zset lives (evicted under memory pressure, deleted by hand):
    the next admission rebuilds it from the members, and the hash its write makes gets a
    lifetime although the zset's still covers the window."""
    client = get_client()
    coordinator = Coordinator(client=client, prefix=redis_prefix)
    claim = RateLimitClaim(KEY, WINDOWS)
    assert isinstance(coordinator.admit([claim], holder("a")), Admitted)
    total = rate_limit.cost_key(KEY, 10, redis_prefix)
    client.delete(total)

    assert isinstance(coordinator.admit([claim], holder("b")), Admitted)
    assert client.hget(total, "n") == "2"  # rebuilt from the members, this one's charge in it
    assert 10_000 <= client.pttl(total) <= 12_501
