"""The order of a key's line of waiters: priority, fair turns (``fair_by``), hand-off grants.

Real Redis — the suite's server and the 3-master cluster (``redis_topology``) — through the
Coordinator's own calls, as a worker's gate makes them: waiters register by being refused
with a waiter id, each release grants the freed lock or semaphore slot to the head of the
line (``Released.woken``), and the granted waiter is admitted. The order is read from what
Redis granted, never from timing. The properties are generated (Hypothesis): any mix of
priorities is drained highest first, FIFO within one; any interleaving of fair groups is
drained turn by turn, FIFO within a group.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor_app.coordination import semaphore
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    WAITING_PREFIX,
    Admitted,
    Claim,
    Holder,
    LockClaim,
    Refused,
    SemaphoreClaim,
)
from reactor_app.coordination.redis import get_client

PROPERTY = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.fixture
def coordinator(redis_topology: str, redis_prefix: str) -> Coordinator:
    return Coordinator(prefix=redis_prefix)


def _fresh_key(name: str) -> str:
    return f"{name}:{uuid.uuid4().hex[:8]}"


def _register(
    coordinator: Coordinator, claims: Sequence[Claim], waiter: str, priority: int = 0
) -> None:
    """``waiter`` joins the line: refused, registered in the same atomic admission."""
    answer = coordinator.admit(claims, Holder(owner=waiter, priority=priority), waiter_id=waiter)
    assert isinstance(answer, Refused), answer


def _drain(
    coordinator: Coordinator, claims: Sequence[Claim], holding: list[Admitted], fair: bool = False
) -> list[str]:
    """Release the holds one by one; each release grants the head waiter, which is admitted
    (and later released in turn). Returns the waiters in the order Redis granted them."""
    granted: list[str] = []
    while holding:
        released = coordinator.release(holding.pop(0), "success")
        for waiter in released.woken:
            granted.append(waiter)
            if fair:
                # someone not in the line asking now is refused: the slot is granted
                other = coordinator.admit(claims, Holder(owner=f"newcomer-{waiter}"))
                assert isinstance(other, Refused), other
                assert (other.blocker or {}).get("granted_to") == waiter
            answer = coordinator.admit(
                [_as_waiter(claim, waiter) for claim in claims],
                Holder(owner=waiter),
                waiter_id=waiter,
            )
            assert isinstance(answer, Admitted), (waiter, answer)
            holding.append(answer)
    return granted


def _as_waiter(claim: Claim, waiter: str) -> Claim:
    """The claim as ``waiter`` sends it (a fair semaphore's group is part of its claim)."""
    if isinstance(claim, SemaphoreClaim) and claim.fair is not None:
        return SemaphoreClaim(claim.key, limit=claim.limit, ttl=claim.ttl, fair=_group(waiter))
    return claim


def _group(waiter: str) -> str:
    return waiter.split("-")[0]


def _hold(coordinator: Coordinator, claims: Sequence[Claim], count: int) -> list[Admitted]:
    holds = []
    for index in range(count):
        answer = coordinator.admit(claims, Holder(owner=f"holder{index}"))
        assert isinstance(answer, Admitted), answer
        holds.append(answer)
    return holds


# -- priority ----------------------------------------------------------------------------------


@pytest.mark.parametrize("primitive", ["lock", "semaphore"])
def test_a_higher_priority_waiter_is_granted_first(
    coordinator: Coordinator, primitive: str
) -> None:
    key = _fresh_key("prio")
    claims: list[Claim] = (
        [LockClaim(key, ttl=30)] if primitive == "lock" else [SemaphoreClaim(key, limit=1)]
    )
    holding = _hold(coordinator, claims, 1)
    for waiter, priority in [("low1", 0), ("low2", 0), ("high", 50), ("mid", 10)]:
        _register(coordinator, claims, waiter, priority)

    assert _drain(coordinator, claims, holding) == ["high", "mid", "low1", "low2"]


def test_a_lock_granted_to_a_waiter_is_refused_naming_it(coordinator: Coordinator) -> None:
    key = _fresh_key("granted")
    claims: list[Claim] = [LockClaim(key, ttl=30)]
    holding = _hold(coordinator, claims, 1)
    _register(coordinator, claims, "next")
    assert list(coordinator.release(holding[0], "success")) == ["next"]
    refused = coordinator.admit(claims, Holder(owner="newcomer"))
    assert isinstance(refused, Refused)
    error = coordinator.refusal_error(refused, "r", "s")
    assert "held by nobody: it is handed to waiter next, ahead in its line" in error.message


@PROPERTY
@given(priorities=st.lists(st.sampled_from([-5, 0, 0, 1, 3]), min_size=1, max_size=12))
def test_any_mix_of_priorities_is_granted_highest_first_fifo_within_one(
    coordinator: Coordinator, priorities: list[int]
) -> None:
    """Registered within a few ms of each other — far inside one priority step (10 s) — the
    line is sorted by priority, then by arrival, through the single-lock fast path."""
    key = _fresh_key("prio-prop")
    claims: list[Claim] = [LockClaim(key, ttl=30)]
    holding = _hold(coordinator, claims, 1)
    waiters = [f"w{index:02d}-p{priority}" for index, priority in enumerate(priorities)]
    # ids in reverse arrival order: a tie broken by the id, not the arrival, would show
    waiters = [f"{99 - index:02d}{name}" for index, name in enumerate(waiters)]
    for waiter, priority in zip(waiters, priorities, strict=True):
        _register(coordinator, claims, waiter, priority)

    expected = [w for _, _, w in sorted(zip([-p for p in priorities], itertools.count(), waiters))]
    assert _drain(coordinator, claims, holding) == expected


def test_a_priority_is_a_bounded_head_start_of_ten_seconds_a_level(
    coordinator: Coordinator,
) -> None:
    """The anti-starvation bound, read where Redis keeps it: a waiter's place is its
    registration time (server clock) less 10 s per priority level, so a higher priority
    passes only waiters that came less than that before it."""
    key = _fresh_key("prio-bound")
    claims: list[Claim] = [SemaphoreClaim(key, limit=1)]
    _hold(coordinator, claims, 1)
    client = get_client()
    before = client.time()
    _register(coordinator, claims, "plain", 0)
    _register(coordinator, claims, "urgent", 3)
    after = client.time()
    line = semaphore.waiters_key(key, coordinator.prefix)
    low, high = (before[0] * 1000 + before[1] / 1000), (after[0] * 1000 + after[1] / 1000)
    plain, urgent = client.zscore(line, "plain"), client.zscore(line, "urgent")
    assert low <= plain <= high
    assert low - 30_000 <= urgent <= high - 30_000


def test_a_waiter_keeps_its_priority_place_across_its_two_forms(
    coordinator: Coordinator,
) -> None:
    """A worker delivery waits in-process as ``wait:<id>`` and parks as ``<id>``: one entry,
    whose place (with its priority) the other form keeps."""
    key = _fresh_key("prio-forms")
    claims: list[Claim] = [LockClaim(key, ttl=30)]
    holding = _hold(coordinator, claims, 1)
    _register(coordinator, claims, "early", 0)
    _register(coordinator, claims, f"{WAITING_PREFIX}late", 5)
    _register(coordinator, claims, "late", 5)  # parks: the same waiter, same place
    assert coordinator.waiters(claims[0]) == ["late", "early"]
    assert _drain(coordinator, claims, holding) == ["late", "early"]


# -- semaphore hand-off --------------------------------------------------------------------------


def test_a_granted_semaphore_slot_is_kept_for_its_waiter_and_handed_on_when_it_leaves(
    coordinator: Coordinator,
) -> None:
    key = _fresh_key("handoff")
    claims: list[Claim] = [SemaphoreClaim(key, limit=2)]
    holding = _hold(coordinator, claims, 2)
    for waiter in ("first", "second", "third"):
        _register(coordinator, claims, waiter)
    assert list(coordinator.release(holding.pop(0), "success")) == ["first"]

    # one slot free, granted to "first": a newcomer is refused, naming it
    newcomer = coordinator.admit(claims, Holder(owner="newcomer"))
    assert isinstance(newcomer, Refused)
    assert (newcomer.blocker or {}).get("granted_to") == "first"
    error = coordinator.refusal_error(newcomer, "r", "s")
    assert f"the free slot of semaphore {key!r} is handed to waiter first" in error.message
    # "first" gives up instead: the slot goes on to "second" at once
    assert coordinator.unregister_waiter(claims[0], "first") == ["second"]
    assert coordinator.waiters(claims[0]) == ["third"]
    taken = coordinator.admit(claims, Holder(owner="second"), waiter_id="second")
    assert isinstance(taken, Admitted), taken
    holding.append(taken)
    assert _drain(coordinator, claims, holding) == ["third"]


def test_a_forced_release_of_a_slot_keeps_the_other_grants_and_hands_its_slot_on(
    coordinator: Coordinator,
) -> None:
    """Found in review: an operator's force-release of one semaphore slot dropped every live
    grant of the line (the slot a release had just handed to "first" among them) and popped
    the next waiter without a grant, so a newcomer could take both free slots ahead of the
    line. Now the other grants stay and the forced slot is handed on like a released one."""
    key = _fresh_key("forced")
    claims: list[Claim] = [SemaphoreClaim(key, limit=2)]
    holding = _hold(coordinator, claims, 2)
    for waiter in ("first", "second", "third"):
        _register(coordinator, claims, waiter)
    assert coordinator.release(holding.pop(0), "success").woken == ["first"]

    forced = coordinator.force_release("semaphore", key, owner="holder1")
    assert forced.released == ["holder1"] and forced.woken == ["second"]
    newcomer = coordinator.admit(claims, Holder(owner="newcomer"))
    assert isinstance(newcomer, Refused), newcomer  # both free slots are granted
    for waiter in ("first", "second"):
        answer = coordinator.admit(claims, Holder(owner=waiter), waiter_id=waiter)
        assert isinstance(answer, Admitted), (waiter, answer)
    assert coordinator.waiters(claims[0]) == ["third"]


# -- fair sharing --------------------------------------------------------------------------------


def test_a_small_tenant_behind_a_large_backlog_is_served_by_turns(
    coordinator: Coordinator,
) -> None:
    """The issue's case at the admission script: tenant ``a`` queues 200, tenant ``b`` 5
    behind them, limit 2 — ``b``'s 5 are granted among the first 10, not after ``a``'s 200."""
    key = _fresh_key("fair")
    claims: list[Claim] = [SemaphoreClaim(key, limit=2, fair="holders")]
    holding = _hold(coordinator, claims, 2)
    for index in range(200):
        _register(coordinator, [_as_waiter(claims[0], f"a-{index:03d}")], f"a-{index:03d}")
    for index in range(5):
        _register(coordinator, [_as_waiter(claims[0], f"b-{index:03d}")], f"b-{index:03d}")

    granted = _drain(coordinator, claims, holding, fair=True)
    assert len(granted) == 205
    last_b = max(position for position, waiter in enumerate(granted) if waiter.startswith("b"))
    assert last_b < 10, granted[:12]
    # FIFO within each tenant
    for tenant in ("a", "b"):
        mine = [w for w in granted if w.startswith(tenant)]
        assert mine == sorted(mine)


@PROPERTY
@given(groups=st.lists(st.sampled_from("abcd"), min_size=1, max_size=24))
def test_any_interleaving_of_groups_is_granted_turn_by_turn(
    coordinator: Coordinator, groups: list[str]
) -> None:
    """Registered while the slot is held, the k-th waiter of each group has turn k: the line
    is granted turn by turn (every group's k-th before any group's k+1-th), FIFO within a
    group, however the groups arrived."""
    key = _fresh_key("fair-prop")
    claims: list[Claim] = [SemaphoreClaim(key, limit=1, fair="holders")]
    holding = _hold(coordinator, claims, 1)
    counts: dict[str, int] = {}
    turns: dict[str, int] = {}
    for group in groups:
        waiter = f"{group}-{counts.get(group, 0):03d}"
        turns[waiter] = counts.get(group, 0)
        counts[group] = counts.get(group, 0) + 1
        _register(coordinator, [_as_waiter(claims[0], waiter)], waiter)

    granted = _drain(coordinator, claims, holding, fair=True)
    assert sorted(granted) == sorted(turns)
    assert [turns[w] for w in granted] == sorted(turns[w] for w in granted)
    for group in counts:
        mine = [w for w in granted if _group(w) == group]
        assert mine == sorted(mine)


def test_a_group_arriving_later_starts_at_the_current_turn(coordinator: Coordinator) -> None:
    """Turns are counted from the head of the line: a group that arrives after ten turns were
    served is not owed those turns — it takes the next one, then alternates."""
    key = _fresh_key("fair-late")
    claims: list[Claim] = [SemaphoreClaim(key, limit=1, fair="holders")]
    holding = _hold(coordinator, claims, 1)
    for index in range(20):
        _register(coordinator, [_as_waiter(claims[0], f"a-{index:03d}")], f"a-{index:03d}")
    granted: list[str] = []
    for _ in range(10):  # serve ten of a's turns
        released = coordinator.release(holding.pop(0), "success")
        waiter = released.woken[0]
        granted.append(waiter)
        answer = coordinator.admit(
            [_as_waiter(claims[0], waiter)], Holder(owner=waiter), waiter_id=waiter
        )
        assert isinstance(answer, Admitted)
        holding.append(answer)
    for index in range(3):
        _register(coordinator, [_as_waiter(claims[0], f"b-{index:03d}")], f"b-{index:03d}")
    granted += _drain(coordinator, claims, holding, fair=True)

    assert granted[:10] == [f"a-{index:03d}" for index in range(10)]
    # b's three alternate with a's next turns instead of waiting behind the other ten
    positions = [granted.index(f"b-{index:03d}") for index in range(3)]
    assert positions[-1] <= 10 + 6, granted


def test_fair_waiters_behind_a_plain_waiter_are_served_first_turn_by_turn(
    coordinator: Coordinator,
) -> None:
    """A key declared fair in one place and not in another (docs/coordination.md): the fair
    waiters are served first, turn by turn, even when a plain waiter (an arrival time, not a
    turn) is already at the head of the line. Found in review: the plain waiter's time was
    read as the head's turn, so the fair waiters were given arrival-time scores and queued
    behind (or tied with) it."""
    key = _fresh_key("fair-mixed")
    plain: list[Claim] = [SemaphoreClaim(key, limit=1)]
    holding = _hold(coordinator, plain, 1)
    _register(coordinator, plain, "plain-000")
    fair = SemaphoreClaim(key, limit=1, fair="holders")
    for waiter in ("a-000", "a-001", "b-000"):
        _register(coordinator, [_as_waiter(fair, waiter)], waiter)

    granted = _drain(coordinator, [fair], holding, fair=True)
    assert granted == ["a-000", "b-000", "a-001", "plain-000"]


# -- in-process waiters (threads waiting on the wake messages) ---------------------------------


def _wait_in_threads(
    coordinator: Coordinator, line_of: Claim, asks: list[tuple[str, Claim, int]]
) -> tuple[list[threading.Thread], list[str], list[BaseException]]:
    """One thread per ask ``(label, claim, priority)``, each waiting in-process
    (``admit_waiting``: subscribed, woken by the release naming it) and, once admitted,
    recording its label and releasing. Started one by one, each once the previous one is in
    the line, so the line's arrival order is the list's."""
    order: list[str] = []
    errors: list[BaseException] = []
    guard = threading.Lock()

    def wait_then_record(label: str, claim: Claim, priority: int) -> None:
        try:
            answer = coordinator.admit_waiting([claim], Holder(owner=label, priority=priority), 30)
            assert isinstance(answer, Admitted), answer
            with guard:
                order.append(label)
            coordinator.release(answer, "success")
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = []
    for count, (label, claim, priority) in enumerate(asks, start=1):
        thread = threading.Thread(target=wait_then_record, args=(label, claim, priority))
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 10
        while len(coordinator.waiters(line_of)) < count:
            assert time.monotonic() < deadline, f"{label} never joined the line"
            time.sleep(0.005)
    return threads, order, errors


def test_in_process_waiters_of_a_fair_semaphore_are_admitted_turn_by_turn(
    coordinator: Coordinator,
) -> None:
    key = _fresh_key("fair-inproc")
    pool = SemaphoreClaim(key, limit=1, fair="holders")
    holding = _hold(coordinator, [pool], 1)
    labels = ["a-000", "a-001", "a-002", "a-003", "b-000", "b-001"]
    threads, order, errors = _wait_in_threads(
        coordinator, pool, [(label, _as_waiter(pool, label), 0) for label in labels]
    )
    coordinator.release(holding[0], "success")
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    turns = {label: int(label.split("-")[1]) for label in labels}
    assert sorted(order) == sorted(labels)
    assert [turns[label] for label in order] == sorted(turns.values()), order


def test_in_process_waiters_of_a_lock_are_admitted_by_priority(
    coordinator: Coordinator,
) -> None:
    key = _fresh_key("prio-inproc")
    lock = LockClaim(key, ttl=30)
    holding = _hold(coordinator, [lock], 1)
    asks = [("low-0", 0), ("low-1", 0), ("high-0", 5), ("low-2", 0), ("high-1", 5)]
    threads, order, errors = _wait_in_threads(
        coordinator, lock, [(label, lock, priority) for label, priority in asks]
    )
    coordinator.release(holding[0], "success")
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    assert order == ["high-0", "high-1", "low-0", "low-1", "low-2"]
