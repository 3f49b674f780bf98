"""A raised semaphore limit serves the line first, in its order (one Redis server and a
3-master cluster): the waiters at the head — waiting in other processes, or parked — are the
ones admitted into the new slots, within 1 s, respecting priority and fair turns; not
whichever asks first (``semaphore_fill`` in ``lua/_semaphore.lua``). Admission order is
recorded in Redis by the admitted processes themselves."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import pytest
from django.db import connections

from reactor_app.coordination import live_limits
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, Refused, SemaphoreClaim
from reactor_app.coordination.keys import current_prefix
from reactor_app.coordination.redis import get_client
from reactor_app.operator import limits

pytestmark = pytest.mark.django_db(transaction=True)

#: the promise (docs/coordination.md, "Live limits")
WITHIN_NS = 1_000_000_000
KEY = "line"
WAITERS = 5


@pytest.fixture(autouse=True)
def named(settings: Any, reactor_redis: Any) -> None:
    settings.REACTOR_LIMITS = {"live": {"limit": 1}}
    live_limits.forget_copy()


def _claim(fair: str | None = None) -> SemaphoreClaim:
    return SemaphoreClaim(KEY, limit=1, limit_name="live", fair=fair)


def _admitted_key() -> str:
    return f"{current_prefix()}:test:admitted"


def _waiter(name: str, priority: int, fair: str | None, go: Any) -> None:
    """In another process: wait for a slot (in-process, as a synchronous caller does), say
    when admitted (RPUSH name and time), hold the slot until ``go``, release."""
    coordinator = Coordinator()
    answer = coordinator.admit_waiting(
        [_claim(fair)], Holder(owner=name, priority=priority), 30, waiter_id=f"wait:{name}"
    )
    client = get_client()
    if not isinstance(answer, Admitted):
        client.rpush(_admitted_key(), f"{name} refused")
        return
    client.rpush(_admitted_key(), f"{name} {time.time_ns()}")
    go.wait(30)
    coordinator.release(answer, "success")


def _admitted() -> list[tuple[str, int]]:
    found = []
    for entry in get_client().lrange(_admitted_key(), 0, -1):
        name, at = (entry.decode() if isinstance(entry, bytes) else entry).split()
        assert at != "refused", f"{name} was never admitted"
        found.append((name, int(at)))
    return found


def _until(check: Any, message: str, seconds: float = 30) -> Any:
    deadline = time.monotonic() + seconds
    while not (found := check()):
        assert time.monotonic() < deadline, message
        time.sleep(0.01)
    return found


@pytest.mark.parametrize(
    ("priorities", "groups", "newcomer"),
    [
        # first come, first served; a newcomer asks at once, before any waiter's retry
        ([0] * WAITERS, [None] * WAITERS, True),
        ([0, 0, 0, 5, 5], [None] * WAITERS, False),  # the later two jump the line
        ([0] * WAITERS, ["a", "a", "a", "b", "b"], False),  # round-robin: a, b, a, b, a
    ],
    ids=["fifo", "priority", "fair_by"],
)
def test_a_raised_limit_admits_the_head_of_the_line_in_order(
    redis_topology: str, priorities: list[int], groups: list[str | None], newcomer: bool
) -> None:
    """Found in review: raised from 1 to 3, the two new slots went to the first callers to
    ask after the copies refreshed — any waiter whose 0.1 s retry came first, or a newcomer —
    not to the two at the head of the line. Whoever asks first now grants them to the line's
    head (a newcomer; else a waiter's retry), and they are woken by name."""
    coordinator = Coordinator()
    held = coordinator.admit([_claim()], Holder(owner="holder"))
    assert isinstance(held, Admitted)
    context = multiprocessing.get_context("fork")
    go = context.Event()
    connections.close_all()
    children = []
    try:
        for n in range(WAITERS):  # one at a time: each is in the line before the next comes
            child = context.Process(
                target=_waiter, args=(f"w{n}", priorities[n], groups[n], go), daemon=True
            )
            child.start()
            children.append(child)
            _until(
                lambda n=n: f"wait:w{n}" in coordinator.waiters(_claim()),
                f"w{n} never queued",
            )
        line = [w.removeprefix("wait:") for w in coordinator.waiters(_claim())]
        assert sorted(line) == [f"w{n}" for n in range(WAITERS)]
        if len(set(priorities)) > 1:
            assert line[:2] == ["w3", "w4"], line  # the priority is the line's order
        if groups[0] is not None:
            assert [groups[int(w[1:])] for w in line][:4] == ["a", "b", "a", "b"], line

        # raised one slot at a time, each goes to the next in line (two slots at once are
        # granted at one instant: which of the two processes is admitted first is their race)
        for raised, expected in ((2, 1), (3, 2)):
            raised_at = time.time_ns()
            limits.set_override("semaphore", "live", str(raised), by="ops", reason="capacity")
            if newcomer:  # arriving with the raise, it is not served before the line
                answer = coordinator.admit([_claim()], Holder(owner="newcomer"))
                assert isinstance(answer, Refused), answer
            found = _until(
                lambda expected=expected: len(found := _admitted()) >= expected and found,
                f"the limit raised to {raised} admitted fewer than {expected} waiters",
            )
            assert [name for name, _ in found] == line[:expected], (found, line)
            at = found[-1][1]
            took_ms = (at - raised_at) / 1e6
            print(f"\n{redis_topology}: raise to {raised} -> head admitted {took_ms:.0f} ms")
            assert at - raised_at < WITHIN_NS
        time.sleep(0.3)  # nobody else: the three slots are the holder's and the two heads'
        assert len(_admitted()) == 2, _admitted()
    finally:
        go.set()
        coordinator.release(held, "success")
        for child in children:
            child.join(30)
    assert sorted(name for name, _ in _admitted()) == sorted(line)  # the rest in turn


def test_a_parked_waiter_at_the_head_is_granted_its_slot_and_reported(
    redis_topology: str,
) -> None:
    """A parked execution has no process waiting: the admission that serves the line grants
    it a slot and names it in ``woken``, so its caller re-enqueues it (``engine.gate``)."""
    coordinator = Coordinator()
    held = coordinator.admit([_claim()], Holder(owner="holder"))
    assert isinstance(held, Admitted)
    parked = coordinator.admit([_claim()], Holder(owner="parked"), waiter_id="exec-1")
    assert isinstance(parked, Refused)
    later = coordinator.admit([_claim()], Holder(owner="later"), waiter_id="exec-2")
    assert isinstance(later, Refused)
    assert coordinator.waiters(_claim()) == ["exec-1", "exec-2"]

    limits.set_override("semaphore", "live", "2", by="ops")
    live_limits.forget_copy()
    # exec-2 asks first: the one free slot is exec-1's, granted and reported
    again = coordinator.admit([_claim()], Holder(owner="later"), waiter_id="exec-2")
    assert isinstance(again, Refused) and again.woken == ["exec-1"], again
    assert isinstance(coordinator.admit([_claim()], Holder(owner="x")), Refused)
    mine = coordinator.admit([_claim()], Holder(owner="parked"), waiter_id="exec-1")
    assert isinstance(mine, Admitted), mine

    # raised again with exec-2 alone in the line: its own admission takes the slot, and a
    # slot left over after the line goes to a newcomer
    limits.set_override("semaphore", "live", "4", by="ops")
    live_limits.forget_copy()
    turn = coordinator.admit([_claim()], Holder(owner="later"), waiter_id="exec-2")
    assert isinstance(turn, Admitted) and turn.woken == [], turn
    assert coordinator.waiters(_claim()) == []
    assert isinstance(coordinator.admit([_claim()], Holder(owner="newcomer")), Admitted)
    for answer in (held, mine, turn):
        coordinator.release(answer, "success")


def test_a_raise_wakes_the_parked_heads_of_the_line_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waking every parked execution on a raise crowded the workers with deliveries that
    could only park again, ahead of the heads' own (the line decides who gets the slots):
    raised by n, the parked among the first n of the line are woken, head first; one parked
    but in no line (its registration lost) is woken too, to ask again."""
    from reactor_app.models import ContentionState, Execution
    from reactor_app.status import ExecutionStatus

    sent: list[str] = []
    monkeypatch.setattr(
        limits, "enqueue_quietly", lambda execution_id, **_: sent.append(execution_id)
    )
    coordinator = Coordinator()
    held = coordinator.admit([_claim()], Holder(owner="holder"))
    assert isinstance(held, Admitted)
    parked = []
    for n in range(5):
        # a reactor this process cannot load counts as using the limit (limits.parked_on)
        execution = Execution.objects.start(
            reactor="tests.nowhere.Pooled", inputs={}, status=ExecutionStatus.PARKED
        )
        ContentionState.objects.create(
            execution=execution, step="", primitive="semaphore", key=KEY, attempts=1
        )
        parked.append(str(execution.pk))
        if n < 4:  # the last one's registration was lost
            answer = coordinator.admit([_claim()], Holder(owner=f"p{n}"), waiter_id=parked[-1])
            assert isinstance(answer, Refused)
    line = coordinator.waiters(_claim())
    assert line == parked[:4]
    assert limits.set_override("semaphore", "live", "3", by="ops")["woken"] == [
        *line[:2],
        parked[4],
    ]
    assert sent == [*line[:2], parked[4]]
    coordinator.release(held, "success")


def test_releases_and_granted_waiters_hand_on_every_slot_a_raise_freed(
    redis_topology: str,
) -> None:
    """A release of a named limit grants the line every slot free under the limit as it is
    now, not one; a granted waiter coming in after a raise passes the spare slots on."""
    coordinator = Coordinator()
    held = coordinator.admit([_claim()], Holder(owner="holder"))
    assert isinstance(held, Admitted)
    for waiter in ("A", "B", "C", "D"):
        answer = coordinator.admit([_claim()], Holder(owner=waiter), waiter_id=waiter)
        assert isinstance(answer, Refused)
    assert coordinator.release(held, "success").woken == ["A"]  # settings: 1

    limits.set_override("semaphore", "live", "3", by="ops")
    live_limits.forget_copy()
    a = coordinator.admit([_claim()], Holder(owner="A"), waiter_id="A")
    assert isinstance(a, Admitted) and a.woken == ["B", "C"], a

    limits.set_override("semaphore", "live", "5", by="ops")
    live_limits.forget_copy()
    assert coordinator.release(a, "success").woken == ["D"]  # 5 - 0 held - B's, C's grants
    for waiter in ("B", "C", "D"):
        answer = coordinator.admit([_claim()], Holder(owner=waiter), waiter_id=waiter)
        assert isinstance(answer, Admitted), (waiter, answer)
        coordinator.release(answer, "success")
