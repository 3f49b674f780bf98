"""``reactor_app.testing``: state readers and assertions, against the real coordination Redis.

Every assertion is checked both ways — it passes on the state it describes, and when it fails
its message describes the state actually found (holder, step, execution, count, lease, token).
Holds are taken with the coordination layer's own ``Coordinator``, in the test's key space.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    Admitted,
    Holder,
    LockClaim,
    OrderedLockClaim,
    PeriodClaim,
    RateLimitClaim,
    RateWindow,
    SemaphoreClaim,
)
from reactor_app.testing import (
    LockState,
    SemaphoreHolder,
    assert_held_by_step,
    assert_locked,
    assert_not_locked,
    assert_ordered_lock,
    assert_period_marked,
    assert_period_not_marked,
    assert_rate_limit_count,
    assert_semaphore_count,
    assert_token_greater,
    coordination_state,
)

CHARGE = Holder(owner="exec-a", execution_id="exec-a", step="charge", reactor="shop.Payment")
REFUND = Holder(owner="exec-b", execution_id="exec-b", step="refund", reactor="shop.Payment")
REACTOR = Holder(owner="exec-c", execution_id="exec-c", step=None, reactor="shop.Nightly")
CALL = Holder(owner="call:42", execution_id=None, step="ChargeStep", reactor="")


@pytest.fixture
def coordinator(reactor_redis: Any) -> Iterator[Coordinator]:
    yield Coordinator()


def take(coordinator: Coordinator, claim: Any, holder: Holder) -> Admitted:
    admitted = coordinator.admit([claim], holder)
    assert isinstance(admitted, Admitted), admitted
    return admitted


def failure(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(AssertionError) as info:
        call(*args, **kwargs)
    return str(info.value)


# -- coordination_state ----------------------------------------------------------------------


def test_state_follows_the_current_key_space(
    coordinator: Coordinator, reactor_key_space: str, settings: Any
) -> None:
    state = coordination_state()
    take(coordinator, LockClaim("acct:1", ttl=30), CHARGE)

    lock = state.lock("acct:1")
    assert (lock.held, lock.owner, lock.step, lock.execution, lock.count) == (
        True,
        "exec-a",
        "charge",
        "exec-a",
        1,
    )
    assert lock.ttl is not None and 25 < lock.ttl <= 30
    assert lock.token is not None and lock.token == lock.last_token  # the latest token issued
    # the same object reads another key space once the prefix changes (it is a lens)
    settings.REACTOR_KEY_PREFIX = f"{reactor_key_space}-other"
    assert not state.lock("acct:1").held
    # ... or a fixed one when given
    assert coordination_state(prefix=reactor_key_space).lock("acct:1").held


def test_state_reads_every_primitive(coordinator: Coordinator) -> None:
    state = coordination_state()
    take(coordinator, SemaphoreClaim("pool:1", limit=3), CHARGE)
    take(coordinator, RateLimitClaim("sms:1", (RateWindow(60.0, 5, "minute"),)), CHARGE)
    marked = take(coordinator, PeriodClaim("report:1", "hour"), CHARGE)
    coordinator.release(marked, "success")
    position = coordinator.assign_position("line:1", CHARGE)
    take(coordinator, OrderedLockClaim("line:1", position), CHARGE)

    semaphore = state.semaphore("pool:1", limit=3)
    assert (semaphore.held, semaphore.available) == (1, 2)
    assert [(h.owner, h.step) for h in semaphore.holders] == [("exec-a", "charge")]
    assert state.rate_limit("sms:1", "minute") == 1
    assert state.rate_limit("sms:1", 60) == 1
    assert state.period_marked("report:1", "hour") is True
    assert state.period_marked_by("report:1", "hour") == "exec-a"
    assert state.period_marked("report:1", "day") is False
    line = state.ordered_lock("line:1")
    assert (line.next, line.last_completed, line.in_flight, line.first_failed) == (2, 0, 1, None)
    assert {(h["primitive"], h["key"], h["step"]) for h in state.holds()} == {
        ("semaphore", "pool:1", "charge"),
    }


# -- locks -----------------------------------------------------------------------------------


def test_assert_locked_passes_and_returns_the_state(coordinator: Coordinator) -> None:
    take(coordinator, LockClaim("acct:1", ttl=30), CHARGE)
    state = assert_locked("acct:1")
    assert isinstance(state, LockState) and state.step == "charge"
    assert_locked("acct:1", by_step="charge")
    assert_locked("acct:1", by_execution="exec-a")
    assert_locked("acct:1", by_step="charge", by_execution="exec-a", by_owner="exec-a")


def test_assert_locked_on_a_free_key_says_it_is_free(coordinator: Coordinator) -> None:
    assert failure(assert_locked, "acct:1", by_step="charge") == (
        "expected acct:1 locked by step 'charge', but it is free "
        "(no fencing token was ever issued for it)"
    )
    taken = take(coordinator, LockClaim("acct:1"), CHARGE)
    coordinator.release(taken, "success")
    assert failure(assert_locked, "acct:1") == (
        f"expected acct:1 locked, but it is free (last fencing token {taken.holds[0].token})"
    )


def test_assert_locked_by_another_step_names_the_holder(coordinator: Coordinator) -> None:
    take(coordinator, LockClaim("acct:1", ttl=12.5), REFUND)
    message = failure(assert_locked, "acct:1", by_step="charge")
    assert re.fullmatch(
        r"expected acct:1 locked by step 'charge', but it is held by step 'refund' of "
        r"execution exec-b \(count 1, ttl 1[12]\.\ds, token \d+\)",
        message,
    ), message


def test_assert_locked_by_another_execution(coordinator: Coordinator) -> None:
    take(coordinator, LockClaim("acct:1"), CHARGE)
    take(coordinator, LockClaim("acct:1"), CHARGE)  # re-entered: count 2
    message = failure(assert_locked, "acct:1", by_step="charge", by_execution="exec-z")
    assert message.startswith(
        "expected acct:1 locked by step 'charge' and by execution exec-z, but it is held by "
        "step 'charge' of execution exec-a (count 2, ttl "
    ), message


def test_lock_descriptions_of_reactor_level_and_direct_call_holders(
    coordinator: Coordinator,
) -> None:
    take(coordinator, LockClaim("nightly"), REACTOR)
    message = failure(assert_locked, "nightly", by_step="export")
    assert message.startswith(
        "expected nightly locked by step 'export', but it is held at reactor level by "
        "execution exec-c (count 1, ttl "
    ), message
    take(coordinator, LockClaim("acct:9"), CALL)
    message = failure(assert_not_locked, "acct:9")
    assert message.startswith(
        "expected acct:9 to be free, but it is held by step 'ChargeStep' for owner call:42 "
        "(count 1, ttl "
    ), message


def test_assert_not_locked(coordinator: Coordinator) -> None:
    assert not assert_not_locked("acct:1").held
    held = take(coordinator, LockClaim("acct:1", ttl=30), CHARGE)
    message = failure(assert_not_locked, "acct:1")
    assert re.fullmatch(
        r"expected acct:1 to be free, but it is held by step 'charge' of execution exec-a "
        r"\(count 1, ttl (29|30)\.\ds, token \d+\)",
        message,
    ), message
    coordinator.release(held, "success")
    assert_not_locked("acct:1")


def test_assert_token_greater(coordinator: Coordinator) -> None:
    assert failure(assert_token_greater, "acct:1", 0) == (
        "expected a fencing token of acct:1 greater than 0, but no token was ever issued for "
        "acct:1 (it is free (no fencing token was ever issued for it))"
    )
    first = take(coordinator, LockClaim("acct:1"), CHARGE)
    token = first.token_for("acct:1")
    assert token is not None
    message = failure(assert_token_greater, "acct:1", token)
    assert message.startswith(
        f"expected a fencing token of acct:1 greater than {token}, but the latest token is "
        f"{token} (it is held by step 'charge' of execution exec-a (count 1, ttl "
    ), message
    coordinator.release(first, "success")
    second = take(coordinator, LockClaim("acct:1"), REFUND)
    coordinator.release(second, "success")
    # held or not, a fresh acquisition since is what counts
    assert assert_token_greater("acct:1", token) == second.token_for("acct:1")


# -- semaphores, rate limits, periods --------------------------------------------------------


def test_assert_semaphore_count(coordinator: Coordinator) -> None:
    message = failure(assert_semaphore_count, "pool:1", held=1)
    assert message == "expected semaphore pool:1 to have 1 holder, but it has none"
    take(coordinator, SemaphoreClaim("pool:1", limit=2, ttl=20), CHARGE)
    take(coordinator, SemaphoreClaim("pool:1", limit=2, ttl=20), CHARGE)  # one slot per owner
    state = assert_semaphore_count("pool:1", held=1, limit=2)
    assert state.available == 1
    take(coordinator, SemaphoreClaim("pool:1", limit=2, ttl=20), REACTOR)
    message = failure(assert_semaphore_count, "pool:1", held=1)
    assert re.fullmatch(
        r"expected semaphore pool:1 to have 1 holder, but it has 2: "
        r"step 'charge' of execution exec-a \(count 2, ttl (19|20)\.\ds\); "
        r"at reactor level by execution exec-c \(count 1, ttl (19|20)\.\ds\)",
        message,
    ), message


def test_assert_rate_limit_count(coordinator: Coordinator) -> None:
    claim = RateLimitClaim("sms:1", (RateWindow(60.0, 5, "minute"),))
    assert_rate_limit_count("sms:1", "minute", 0)
    take(coordinator, claim, CHARGE)
    take(coordinator, claim, REFUND)
    assert assert_rate_limit_count("sms:1", "minute", 2) == 2
    assert failure(assert_rate_limit_count, "sms:1", "minute", 3) == (
        "expected 3 admissions of rate limit sms:1 in its current minute window, but it counts 2"
    )
    assert failure(assert_rate_limit_count, "sms:1", 60, 1) == (
        "expected 1 admission of rate limit sms:1 in its current 60s window, but it counts 2"
    )


def test_assert_period_marked_and_not_marked(coordinator: Coordinator) -> None:
    assert_period_not_marked("report:1", "hour")
    assert failure(assert_period_marked, "report:1", "hour") == (
        "expected the current hour bucket of report:1 to be marked, but it is not marked"
    )
    coordinator.release(take(coordinator, PeriodClaim("report:1", "hour"), CHARGE), "success")
    assert assert_period_marked("report:1", "hour") == "exec-a"
    assert_period_marked("report:1", "hour", by="exec-a")
    assert failure(assert_period_marked, "report:1", "hour", by="exec-b") == (
        "expected the current hour bucket of report:1 to be marked by exec-b, "
        "but it is marked by exec-a"
    )
    assert failure(assert_period_not_marked, "report:1", "hour") == (
        "expected the current hour bucket of report:1 not to be marked, but it is marked by exec-a"
    )
    assert_period_not_marked("report:1", "day")  # another bucket size, another window


# -- ordered locks ---------------------------------------------------------------------------


def test_assert_ordered_lock(coordinator: Coordinator) -> None:
    first = coordinator.assign_position("line:1", CHARGE)
    second = coordinator.assign_position("line:1", REFUND)
    head = take(coordinator, OrderedLockClaim("line:1", first), CHARGE)
    assert_ordered_lock("line:1", last_completed=0, in_flight=1, first_failed=None, next=3)
    message = failure(assert_ordered_lock, "line:1", last_completed=1, first_failed=None)
    assert message == (
        "expected ordered lock line:1 with last_completed=1, first_failed=None, but it has "
        "last_completed=0, first_failed=None (next 3, head 1, in flight 1, "
        "positions registered: 1, 2)"
    )
    coordinator.release(head, "failure")  # strict: the line stops here
    state = assert_ordered_lock("line:1", last_completed=1, first_failed=1)
    assert state.head == second.nonce
    message = failure(assert_ordered_lock, "line:1", first_failed=None)
    assert message.startswith(
        "expected ordered lock line:1 with first_failed=None, but it has first_failed=1 ("
    ), message
    with pytest.raises(TypeError):
        assert_ordered_lock("line:1")


# -- step attribution ------------------------------------------------------------------------


def test_assert_held_by_step_finds_lock_or_semaphore_holds(coordinator: Coordinator) -> None:
    take(coordinator, LockClaim("acct:1"), CHARGE)
    found = assert_held_by_step("acct:1", "charge")
    assert isinstance(found, LockState) and found.execution == "exec-a"
    assert_held_by_step("acct:1", "charge", primitive="lock", execution="exec-a")

    take(coordinator, SemaphoreClaim("pool:1", limit=2), REACTOR)
    take(coordinator, SemaphoreClaim("pool:1", limit=2), REFUND)
    holder = assert_held_by_step("pool:1", "refund", primitive="semaphore")
    assert isinstance(holder, SemaphoreHolder) and holder.execution == "exec-b"


def test_assert_held_by_step_describes_the_holds_it_found(coordinator: Coordinator) -> None:
    assert failure(assert_held_by_step, "acct:1", "charge") == (
        "expected a hold on acct:1 attributed to step 'charge', but nothing holds it "
        "(no lock, no live semaphore lease)"
    )
    assert failure(assert_held_by_step, "acct:1", "charge", primitive="lock") == (
        "expected a lock on acct:1 attributed to step 'charge', but its lock is free"
    )
    # the same key held at reactor level is not a step-attributed hold
    take(coordinator, LockClaim("acct:1"), REACTOR)
    message = failure(assert_held_by_step, "acct:1", "charge")
    assert message.startswith(
        "expected a hold on acct:1 attributed to step 'charge', but it is held only by: "
        "lock held at reactor level by execution exec-c (count 1, ttl "
    ), message

    take(coordinator, SemaphoreClaim("pool:1", limit=2), CHARGE)
    message = failure(assert_held_by_step, "pool:1", "charge", execution="exec-b")
    assert message.startswith(
        "expected a hold on pool:1 attributed to step 'charge' of execution exec-b, but it is "
        "held only by: semaphore lease of step 'charge' of execution exec-a (count 1, ttl "
    ), message
    assert failure(assert_held_by_step, "pool:1", "charge", primitive="lock") == (
        "expected a lock on pool:1 attributed to step 'charge', but its lock is free"
    )
    with pytest.raises(ValueError):
        assert_held_by_step("pool:1", "charge", primitive="rate_limit")


# -- the plugin's fixtures -------------------------------------------------------------------


def test_reactor_redis_is_the_coordination_redis(reactor_redis: Any) -> None:
    from reactor_app.coordination.redis import get_client

    assert reactor_redis.ping()
    assert reactor_redis is get_client()


def test_key_space_is_the_configured_prefix_and_fresh(reactor_key_space: str) -> None:
    from django.conf import settings

    assert reactor_key_space == settings.REACTOR_KEY_PREFIX
    assert coordination_state().holds() == []
