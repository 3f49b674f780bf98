"""The renewal thread is woken only for a renewal due before it would look on its own.

Real Redis (the suite's), the process's real renewal thread (``coordination.renewal``). With
nothing due, the thread sleeps at most ``IDLE_LOOK`` and looks at its heap again, so an
admission whose first renewal is due later than that does not wake it. Woken for every
admission, as before, it found each short call already over when it ran: a futex wake and a
context switch on every locked call's path, for nothing (docs/benchmarks.md, "The renewal
thread's wake-ups"). Checked here: a run of locked ``Step.call``s wakes it not once, and a
hold whose first renewal falls after the thread's idle look is still renewed on time, past
its lease, without a wake — the thread's own look finds it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from reactor_app import Step, Success, with_lock
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.coordination.renewal import IDLE_LOOK, Renewal, RenewalScheduler, scheduler
from reactor_app.testing import assert_locked

# the calls' step runs and events are written behind them, by the writer thread
pytestmark = pytest.mark.django_db(transaction=True)


@with_lock(lambda args: f"wakes:{args['n']}", ttl=60)
class Locked(Step):
    inputs = ("n",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(args["n"])


@pytest.fixture
def wakes() -> Iterator[list[float]]:
    """The times the renewal thread is notified, once it sleeps with nothing to renew."""
    runner = scheduler()
    _started_and_idle(runner)
    woken: list[float] = []
    original = runner._wake.notify

    def counting(*args: Any, **kwargs: Any) -> None:
        woken.append(time.monotonic())
        original(*args, **kwargs)

    runner._wake.notify = counting  # type: ignore[method-assign]
    try:
        yield woken
    finally:
        del runner._wake.notify


def _started_and_idle(runner: RenewalScheduler) -> None:
    """The thread runs (a first renewal starts it) and nothing renews: it sleeps its idle
    look (what an earlier test left renewing has ended by then)."""
    coordinator = Coordinator()
    admitted = coordinator.admit([LockClaim(f"wakes:start:{uuid.uuid4()}", ttl=60)], Holder("s"))
    assert isinstance(admitted, Admitted)
    Renewal(admitted, coordinator=coordinator).start().stop()
    coordinator.release(admitted, "success")
    deadline = time.monotonic() + 10
    while runner.renewing() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not runner.renewing(), runner.renewing()
    time.sleep(IDLE_LOOK + 0.2)  # it has looked once more and sleeps with nothing due


def test_locked_calls_do_not_wake_the_renewal_thread(wakes: list[float]) -> None:
    for n in range(30):
        assert Locked.call(n=n).value == n
    assert wakes == []


def test_a_renewal_due_after_the_idle_look_is_made_on_time_without_a_wake(
    wakes: list[float],
) -> None:
    # first renewal due half a look after the thread's own next look at the latest (it counts
    # from when the admission was sent); held past the lease
    lease = IDLE_LOOK * 4.5
    key = f"wakes:late:{uuid.uuid4()}"
    coordinator = Coordinator()
    admitted = coordinator.admit([LockClaim(key, ttl=lease)], Holder("late"))
    assert isinstance(admitted, Admitted)
    extended: list[int] = []
    renewal = Renewal(
        admitted, coordinator=coordinator, on_extended=lambda _, ms: extended.append(ms)
    ).start()
    try:
        time.sleep(lease + IDLE_LOOK)
        assert renewal.lost is None, renewal.lost
        assert_locked(key, by_owner="late")  # lapsed long ago unless renewed
        assert len(extended) >= 2, extended
    finally:
        renewal.stop()
        coordinator.release(admitted, "success")
    assert wakes == []
