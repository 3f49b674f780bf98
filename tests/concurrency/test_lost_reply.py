"""A lost reply is retried safely: the call runs once, and the caller learns what it took.

Each test puts a ``FaultProxy`` between the coordination client and a real Redis, lets the next
script call run on the server and loses its reply (the client's connection ends with no answer),
then checks that the call the library made still returned what the script did — the holder
knows it holds — and that nothing was taken twice or left behind: a lock at one nesting level,
one semaphore slot, a rate-limit window charged once, an ordered position that does not block
its line until ``poison_pill_timeout``, a period bucket reserved by its caller.

Before retry-safe calls, each of these raised ``CoordinationUnavailable`` while the script's
effects stayed in Redis.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py

from reactor_app.coordination import leases, state
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    UNASSIGNED,
    Admitted,
    Holder,
    LockClaim,
    OrderedLockClaim,
    PeriodClaim,
    PeriodHit,
    RateLimitClaim,
    RateWindow,
    Refused,
    SemaphoreClaim,
)
from reactor_app.coordination.redis import get_client
from reactor_app.coordination.scripts import script_sources
from reactor_app.exceptions import CoordinationUnavailable
from reactor_app.testing.fault_proxy import FaultProxy, is_script_call
from reactor_app.testing.servers import StandaloneServer


@pytest.fixture(scope="module")
def server() -> Iterator[StandaloneServer]:
    with StandaloneServer() as started:
        # every script loaded up front: a lost reply is then the reply of the script's run,
        # never of a NOSCRIPT answer
        direct = redis_py.Redis(port=started.port)
        for source in script_sources().values():
            direct.script_load(source)
        yield started


@pytest.fixture
def proxy(server: StandaloneServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", server.port) as started:
        yield started


@pytest.fixture
def direct(server: StandaloneServer) -> Any:
    """A client straight to the server: what is really there, past the proxy."""
    return get_client(server.url)


@pytest.fixture
def coordinator(proxy: FaultProxy, redis_prefix: str) -> Coordinator:
    return Coordinator(client=get_client(f"redis://127.0.0.1:{proxy.port}/0"), prefix=redis_prefix)


def _lose_next(proxy: FaultProxy) -> None:
    proxy.lose_next_reply(matching=is_script_call)


def _was_lost(proxy: FaultProxy) -> None:
    assert proxy.lost == 1 and proxy.armed == 0, "the fault did not happen"


def test_a_lock_admission_whose_reply_is_lost_holds_once(
    coordinator: Coordinator, proxy: FaultProxy, direct: Any, redis_prefix: str
) -> None:
    holder = Holder(owner="lost-lock")
    _lose_next(proxy)
    admitted = coordinator.admit([LockClaim("acct:lost", ttl=30)], holder)
    _was_lost(proxy)
    assert isinstance(admitted, Admitted)
    held = state.lock_state("acct:lost", client=direct, prefix=redis_prefix)
    assert held.owner == "lost-lock" and held.count == 1  # one nesting level, not two
    assert held.token == admitted.holds[0].token
    released = coordinator.release(admitted, "success")
    assert released.freed == [("lock", "acct:lost")]
    assert not state.lock_state("acct:lost", client=direct, prefix=redis_prefix).held


def test_a_lock_release_whose_reply_is_lost_reports_the_key_freed(
    coordinator: Coordinator, proxy: FaultProxy, direct: Any, redis_prefix: str
) -> None:
    admitted = coordinator.admit([LockClaim("acct:gone", ttl=30)], Holder(owner="o"))
    assert isinstance(admitted, Admitted)
    _lose_next(proxy)
    released = coordinator.release(admitted, "success")
    _was_lost(proxy)
    # run again, the release would have found nothing to free ("not held")
    assert released.freed == [("lock", "acct:gone")] and released.not_held == []
    assert not state.lock_state("acct:gone", client=direct, prefix=redis_prefix).held


def test_a_semaphore_admission_whose_reply_is_lost_takes_one_slot(
    coordinator: Coordinator, proxy: FaultProxy, direct: Any, redis_prefix: str
) -> None:
    claim = SemaphoreClaim("pool:lost", limit=2, ttl=30)
    _lose_next(proxy)
    admitted = coordinator.admit([claim], Holder(owner="first"))
    _was_lost(proxy)
    assert isinstance(admitted, Admitted)
    taken = state.semaphore_state("pool:lost", 2, client=direct, prefix=redis_prefix)
    assert taken.held == 1 and [h.owner for h in taken.holders] == ["first"]
    assert taken.holders[0].count == 1
    second = coordinator.admit([claim], Holder(owner="second"))
    assert isinstance(second, Admitted)  # the other slot is free
    coordinator.release(admitted, "success")
    coordinator.release(second, "success")
    assert state.semaphore_state("pool:lost", 2, client=direct, prefix=redis_prefix).held == 0


def test_a_rate_limit_admission_whose_reply_is_lost_charges_the_window_once(
    coordinator: Coordinator, proxy: FaultProxy, direct: Any, redis_prefix: str
) -> None:
    claim = RateLimitClaim("api:lost", (RateWindow(60, 2, "minute"),))
    _lose_next(proxy)
    admitted = coordinator.admit([claim], Holder(owner="caller"))
    _was_lost(proxy)
    assert isinstance(admitted, Admitted)
    assert state.rate_limit_count("api:lost", 60, client=direct, prefix=redis_prefix) == 1
    # the window still has the second unit it was configured with
    assert isinstance(coordinator.admit([claim], Holder(owner="next")), Admitted)
    assert isinstance(coordinator.admit([claim], Holder(owner="third")), Refused)


def test_an_ordered_admission_whose_reply_is_lost_does_not_block_the_line(
    coordinator: Coordinator, proxy: FaultProxy
) -> None:
    claim = OrderedLockClaim("line:lost", UNASSIGNED, poison_pill_timeout=600)
    _lose_next(proxy)
    first = coordinator.admit([claim], Holder(owner="first"))
    _was_lost(proxy)
    # the position the lost call assigned is the caller's: it runs, and completes it
    assert isinstance(first, Admitted)
    assert first.assigned["line:lost"].nonce == 1
    coordinator.release(first, "success")
    # the next position is served at once, not after the poison-pill timeout of an orphan
    second = coordinator.admit([claim], Holder(owner="second"))
    assert isinstance(second, Admitted), second
    assert second.assigned["line:lost"].nonce == 2


def test_a_period_admission_whose_reply_is_lost_reserves_the_bucket_for_its_caller(
    coordinator: Coordinator, proxy: FaultProxy, direct: Any, redis_prefix: str
) -> None:
    claim = PeriodClaim("report:lost", "day", ttl=30)
    holder = Holder(owner="daily", execution_id="exec-1", step="report")
    _lose_next(proxy)
    admitted = coordinator.admit([claim], holder)
    _was_lost(proxy)
    assert isinstance(admitted, Admitted)
    reserved = state.period_reserved("report:lost", "day", client=direct, prefix=redis_prefix)
    assert reserved is not None and reserved["owner"] == "daily" and reserved["count"] == 1
    coordinator.release(admitted, "success")
    assert state.period_marked("report:lost", "day", client=direct, prefix=redis_prefix)
    again = coordinator.admit([claim], Holder(owner="later", execution_id="exec-2"))
    assert isinstance(again, PeriodHit)


def test_an_admission_of_several_claims_whose_reply_is_lost_takes_each_once(
    coordinator: Coordinator, proxy: FaultProxy, direct: Any, redis_prefix: str
) -> None:
    claims = [
        LockClaim("acct:both", ttl=30),
        RateLimitClaim("api:both", (RateWindow(60, 5, "minute"),)),
    ]
    _lose_next(proxy)
    admitted = coordinator.admit(claims, Holder(owner="both"))
    _was_lost(proxy)
    assert isinstance(admitted, Admitted) and len(admitted.holds) == 2
    assert state.lock_state("acct:both", client=direct, prefix=redis_prefix).count == 1
    assert state.rate_limit_count("api:both", 60, client=direct, prefix=redis_prefix) == 1
    released = coordinator.release(admitted, "success")
    assert released.freed == [("lock", "acct:both")]


def test_a_renewal_whose_reply_is_lost_reports_the_lease_renewed(
    coordinator: Coordinator, proxy: FaultProxy
) -> None:
    admitted = coordinator.admit([LockClaim("acct:renew", ttl=30)], Holder(owner="renewer"))
    assert isinstance(admitted, Admitted)
    _lose_next(proxy)
    renewed = leases.extend(coordinator, admitted.holds, "renewer")
    _was_lost(proxy)
    assert renewed.extended == admitted.holds and renewed.lost == []


def test_a_reply_lost_on_every_try_is_an_outage_with_the_work_done_once(
    coordinator: Coordinator, proxy: FaultProxy, direct: Any, redis_prefix: str
) -> None:
    """Past its retries the caller is told the store is unavailable, as before; the lock the
    first try took is there once (it lapses with its lease), not once per try."""
    proxy.lose_next_reply(matching=is_script_call, times=10)
    with pytest.raises(CoordinationUnavailable):
        coordinator.admit([LockClaim("acct:down", ttl=30)], Holder(owner="unlucky"))
    proxy.disarm()
    assert proxy.lost >= 2
    held = state.lock_state("acct:down", client=direct, prefix=redis_prefix)
    assert held.owner == "unlucky" and held.count == 1


@pytest.mark.parametrize("with_semaphore", [False, True], ids=["lock_release", "release"])
def test_a_release_held_back_by_a_flag_is_answered_so_again_after_a_lost_reply(
    coordinator: Coordinator,
    proxy: FaultProxy,
    direct: Any,
    redis_prefix: str,
    with_semaphore: bool,
) -> None:
    """The flag keys ride at the end of the release's keys, before the stored-reply key: the
    script still finds them, and the retry gets the same "flagged" answer."""
    claims: list[Any] = [LockClaim("acct:flag", ttl=30)]
    if with_semaphore:
        claims.append(SemaphoreClaim("pool:flag", limit=1, ttl=30))
    admitted = coordinator.admit(claims, Holder(owner="flagged"))
    assert isinstance(admitted, Admitted)
    flag = f"{redis_prefix}:test:cancel-flag"
    direct.set(flag, "cancel requested")
    _lose_next(proxy)
    held_back = coordinator.release(admitted, "success", unless=[flag])
    _was_lost(proxy)
    assert held_back.flagged == "cancel requested" and held_back.freed == []
    assert state.lock_state("acct:flag", client=direct, prefix=redis_prefix).held
    direct.delete(flag)
    assert ("lock", "acct:flag") in coordinator.release(admitted, "success").freed
