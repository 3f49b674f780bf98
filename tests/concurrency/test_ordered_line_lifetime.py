"""How long an ordered line's keys live, in a real Redis (docs/coordination.md, "How long a line
lives").

A line's four keys (state, positions, holders, waiters) live ``ttl`` past its last activity. A
call sets their lifetimes only when the state's is not within ``ttl/64`` below that;
the four are always set together, so the state's stands for all. The property test plays random
sequences of every operation on a line — positions assigned, admitted, refused, released with
each kind of outcome, heartbeats, an operator's skip and reset, two declarations' ttls on one
line — with time passing in between (simulated: every lifetime moved back alike, as waiting
would), and after each one checks that:

* no key of the line is left without an expiry (a key made after the last setting of the
  lifetimes would live for ever);
* no key of the line ends before its state (whose lifetime the calls read);
* after a call that acted on the line, the line lives between ``ttl - ttl/64`` and ``ttl`` from
  now, that call's ``ttl`` (the last call's applies, as when every call set it).

The command counts show what the rule saves: a recently touched line's admission and release
send no ``PEXPIRE``; once its lifetime has fallen behind by more than the slack, one call sets
the four again. And a writer that sets the lifetimes its own way (an older version of the
library during a rolling deploy) cannot mislead it: the lifetime is read from the key.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor_app.coordination import ordered_lock
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    Admitted,
    Holder,
    OrderedLockClaim,
    OrderedPosition,
    Refused,
)
from reactor_app.coordination.redis import get_client
from reactor_app.testing.pytest_plugin import delete_prefixed_keys, new_key_prefix
from tests.concurrency.harness import pass_time_on, pexpires

KEY = "line"
#: two declarations of one line with different lifetimes (seconds)
TTLS = (600.0, 900.0)
#: what docs/coordination.md promises: the end moves only by more than this share of the ttl
SLACK = 64
#: ms of Redis time a check may take between two reads of it
EPSILON_MS = 100

operation = st.one_of(
    st.tuples(st.just("assign"), st.sampled_from(TTLS), st.just(0)),
    st.tuples(st.just("admit"), st.sampled_from(TTLS), st.integers(0, 10)),
    st.tuples(
        st.just("release"), st.sampled_from(["retry", "success", "failure"]), st.integers(0, 10)
    ),
    st.tuples(st.just("heartbeat"), st.sampled_from(TTLS), st.integers(0, 10)),
    st.tuples(st.just("skip"), st.sampled_from(TTLS), st.just(0)),
    st.tuples(st.just("reset"), st.sampled_from(TTLS), st.just(0)),
    # time passes: this many seconds (up to a sixth of the shorter ttl, several slacks)
    st.tuples(st.just("age"), st.just(0.0), st.integers(1, 100)),
)


def holder(name: str) -> Holder:
    return Holder(owner=name, execution_id=f"exec-{name}", step="work", reactor="tests.Line")


def lifetimes(client: Any, prefix: str) -> dict[str, int]:
    """PTTL (ms) of each existing key of the line (-1: no expiry)."""
    found = {}
    for name in ordered_lock.line_keys(KEY, prefix):
        left = client.pttl(name)
        if left != -2:
            found[name] = left
    return found


def age(client: Any, prefix: str, seconds: int) -> None:
    """What waiting ``seconds`` does to the line, without the wait: every lifetime moves back
    alike (a key whose life runs out is gone)."""
    pass_time_on(client, ordered_lock.line_keys(KEY, prefix), seconds * 1000)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(operation, min_size=1, max_size=30))
def test_a_line_never_loses_a_key_early_nor_keeps_one_for_ever(
    operations: list[tuple[str, Any, Any]],
) -> None:
    prefix = new_key_prefix("life")
    client = get_client()
    coordinator = Coordinator(client=client, prefix=prefix)
    state_key = ordered_lock.state_key(KEY, prefix)
    positions: list[tuple[OrderedPosition, float]] = []  # each with the ttl it was taken with
    admitted: list[tuple[Admitted, float]] = []
    try:
        for kind, first, second in operations:
            acted: float | None = None  # the ttl of a call that acted on the line
            epoch = client.hget(state_key, "epoch")
            if kind == "assign":
                position = coordinator.assign_position(KEY, holder(f"h{len(positions)}"), first)
                positions.append((position, first))
                acted = first
            elif kind == "admit" and positions:
                position, _ = positions[second % len(positions)]
                claim = OrderedLockClaim(KEY, position, ttl=first, poison_pill_timeout=3600)
                result = coordinator.admit([claim], holder(f"a{second}"))
                if isinstance(result, Admitted):
                    admitted.append((result, first))
                    acted = first
                elif not (isinstance(result, Refused) and result.detail.stale):
                    # a stale position's refusal does not touch the line; a wait or a strict
                    # line's stop (ChainFailed) does: the position was seen
                    acted = first
            elif kind == "release" and admitted:
                taken, ttl = admitted.pop(second % len(admitted))
                held = taken.holds[0].claim
                assert isinstance(held, OrderedLockClaim)
                hold_epoch = held.position.epoch
                coordinator.release(taken, first)
                if epoch is not None and int(epoch) == hold_epoch:
                    acted = ttl
            elif kind == "heartbeat" and positions:
                position, _ = positions[second % len(positions)]
                claim = OrderedLockClaim(KEY, position, ttl=first)
                if coordinator.heartbeat(claim):
                    acted = first
            elif kind == "skip":
                if ordered_lock.skip(KEY, first, client=client, prefix=prefix) is not None:
                    acted = first
            elif kind == "reset":
                ordered_lock.reset(KEY, first, client=client, prefix=prefix)
                acted = first
            elif kind == "age":
                age(client, prefix, second)

            found = lifetimes(client, prefix)
            assert all(left > 0 for left in found.values()), f"a key without expiry: {found}"
            line = dict(found)  # the waiters zset also keeps its own day (waiter_register)
            line.pop(ordered_lock.waiters_key(KEY, prefix), None)
            state_left = line.get(state_key)
            if state_left is not None:
                short = {n: left for n, left in line.items() if left < state_left - EPSILON_MS}
                assert not short, f"keys that end before the state ({state_left} ms): {short}"
            if acted is not None and line:
                ttl_ms = int(acted * 1000)
                floor = ttl_ms - ttl_ms // SLACK - EPSILON_MS
                assert all(floor <= left <= ttl_ms for left in line.values()), (kind, acted, line)
    finally:
        delete_prefixed_keys(client, prefix)


# -- what the rule saves ------------------------------------------------------------------------


def test_a_recently_touched_line_sets_no_lifetimes_until_its_end_falls_behind(
    private_redis: Any,
) -> None:
    client = private_redis
    coordinator = Coordinator(client=client, prefix="life")
    position = coordinator.assign_position(KEY, holder("h"), 900)
    claim = OrderedLockClaim(KEY, position, ttl=900)

    before = pexpires(client)
    for _ in range(3):  # an attempt that is admitted, then released to try again
        taken = coordinator.admit([claim], holder("h"))
        assert isinstance(taken, Admitted)
        coordinator.release(taken, "retry")
    assert pexpires(client) == before  # six calls, the line's end moved by milliseconds

    age(client, "life", 900 // SLACK + 1)  # more than the slack of 14 s passes
    before = pexpires(client)  # (the aging's own PEXPIREs counted out)
    taken = coordinator.admit([claim], holder("h"))
    assert isinstance(taken, Admitted)
    assert pexpires(client) == before + 4  # the four keys' lifetimes, once
    assert all(900_000 - 100 <= left <= 900_000 for left in lifetimes(client, "life").values())
    coordinator.release(taken, "success")
    assert pexpires(client) == before + 4


def test_a_key_an_admission_makes_again_gets_its_lifetime_on_a_recently_touched_line(
    redis_prefix: str,
) -> None:
    """The one key a call can make without setting lifetimes anyway: the positions zset, when
    the admission registers its position again and the zset had gone (its last registration
    completed out of turn). Made here directly: the line is touched, then the zset deleted."""
    client = get_client()
    coordinator = Coordinator(client=client, prefix=redis_prefix)
    position = coordinator.assign_position(KEY, holder("h"), 900)
    claim = OrderedLockClaim(KEY, position, ttl=900)
    taken = coordinator.admit([claim], holder("h"))
    assert isinstance(taken, Admitted)
    coordinator.release(taken, "retry")
    positions = ordered_lock.positions_key(KEY, redis_prefix)
    client.delete(positions)

    again = coordinator.admit([claim], holder("h"))  # well within the slack of the last touch
    assert isinstance(again, Admitted)
    assert 900_000 - 100 <= client.pttl(positions) <= 900_000


def test_a_lifetime_shortened_by_another_writer_is_set_again_at_the_next_call(
    redis_prefix: str,
) -> None:
    """The rule reads the state's lifetime from the key, so a writer that set it its own way —
    an older version of the library during a rolling deploy sets every key's lifetime to its
    own call's ``ttl`` — is seen at the next call, however recently this version set it."""
    client = get_client()
    coordinator = Coordinator(client=client, prefix=redis_prefix)
    position = coordinator.assign_position(KEY, holder("h"), 900)
    claim = OrderedLockClaim(KEY, position, ttl=900)
    for name in ordered_lock.line_keys(KEY, redis_prefix):
        client.pexpire(name, 60_000)  # the other writer: a declaration of 60 s

    taken = coordinator.admit([claim], holder("h"))
    assert isinstance(taken, Admitted)
    assert all(
        900_000 - 100 <= left <= 900_000 for left in lifetimes(client, redis_prefix).values()
    )
