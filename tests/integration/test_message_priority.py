"""Every message sent for an execution carries its priority, not only the first and a park's
requeue: a broker that orders by priority serves each later delivery as it served the first.

Before, the messages a delivery, the sweeper, a cancel or an in-process hand-off sent for an
execution read back from its row went without one. On the Redis transport a message without
a priority counts as the highest, so a low-priority execution that met a coordination outage,
found its claim taken, was swept or cancelled jumped ahead of everything queued. (The
requeues after a claim lost mid-pass and after a soft time limit spent in engine code were
fixed with the others and are tested here since.)

The messages are read back from a queue nobody consumes (``nobody_queue``); each way of
sending one is the product's own code run here on a real broker, Redis and database.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, timedelta
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.db.models import F
from django.test import override_settings
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor_app import Reactor, Step, Success, from_input, interrupt, step, with_lock
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.engine.claim import ExecutionClaim
from reactor_app.engine.dispatch import deliver, sweep
from reactor_app.engine.enqueueing import OUTAGES_HEADER, START_HEADER
from reactor_app.engine.executor import ExecutionRun
from reactor_app.engine.interrupt_delivery import time_out_interrupt
from reactor_app.engine.priority import celery_priority
from reactor_app.engine.time_slice import time_slice
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.integration.test_long_countdowns import taken

pytestmark = pytest.mark.django_db(transaction=True)

UNREACHABLE = "redis://127.0.0.1:1/0"


class Note(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success({"noted": args["n"]})


class Twice(Reactor):
    inputs = ("n", "day")
    first = step(Note, n=from_input("n"))
    second = step(Note, n=from_input("n"))


class TakenOver(Step):
    """Another delivery claims the row while this body runs (its claim generation moves)."""

    def run(self, args: dict[str, Any], context: Any) -> Any:
        Execution.objects.filter(pk=context.execution_id).update(
            claim_generation=F("claim_generation") + 1
        )
        return Success(None)


class ClaimedMidway(Reactor):
    inputs = ("n", "day")
    first = step(TakenOver)
    second = step(Note, n=from_input("n"))


class HandedOff(Reactor):
    """Its first step runs in the caller's process, the rest on a worker."""

    inputs = ("n", "day")
    background = "after:first"
    first = step(Note, n=from_input("n"))
    second = step(Note, n=from_input("n"))


class Approved(Reactor):
    """Waits for an approval (at most a second) between its two steps, on workers."""

    inputs = ("n", "day")
    background = True
    first = step(Note, n=from_input("n"))
    approval = interrupt(timeout=1)
    second = step(Note, n=from_input("n"))


def _interrupted(execution: Execution) -> None:
    """Deliver ``execution`` here up to its interrupt (it sends no message of its own)."""
    deliver(str(execution.id))
    assert Execution.objects.get(pk=execution.pk).status == ExecutionStatus.INTERRUPTED


def _resumed(execution: Execution, first: dict[str, Any]) -> dict[str, Any]:
    _interrupted(execution)
    Approved.resume(execution.id, step="approval", payload={"by": "ann"})
    return {}


def _interrupt_timed_out(execution: Execution, first: dict[str, Any]) -> dict[str, Any]:
    _interrupted(execution)
    time_out_interrupt(execution.id, timezone.now() + timedelta(seconds=5))
    return {}


def _outage_before_the_claim(execution: Execution, first: dict[str, Any]) -> dict[str, Any]:
    with override_settings(REACTOR_REDIS_URL=UNREACHABLE):
        report = deliver(str(execution.id), start=first.get(START_HEADER))
    assert report["outcome"] == "coordination_unavailable"
    return {OUTAGES_HEADER: 1, START_HEADER: first.get(START_HEADER)}


def _claimed_elsewhere(execution: Execution, first: dict[str, Any]) -> dict[str, Any]:
    other = ExecutionClaim(execution.id, "elsewhere")
    assert other.acquire(wait=0.0)
    try:
        assert deliver(str(execution.id))["outcome"] == "claimed_elsewhere"
    finally:
        other.release()
    return {}


def _swept(execution: Execution, first: dict[str, Any]) -> dict[str, Any]:
    long_ago = timezone.now() - timedelta(hours=1)
    Execution.objects.filter(pk=execution.pk).update(heartbeat_at=long_ago)
    assert str(execution.id) in sweep()
    return {}


def _cancelled_idle(execution: Execution, first: dict[str, Any]) -> dict[str, Any]:
    Execution.objects.get(pk=execution.pk).cancel("no longer needed")
    return {}


def _cancelled_while_claimed(execution: Execution, first: dict[str, Any]) -> dict[str, Any]:
    other = ExecutionClaim(execution.id, "elsewhere")
    assert other.acquire(wait=0.0)
    try:
        Execution.objects.get(pk=execution.pk).cancel("no longer needed")
    finally:
        other.release()
    return {}


def _claim_lost(execution: Execution, first: dict[str, Any]) -> dict[str, Any]:
    """Another delivery claims the row during the first body: this one stops at its checkpoint
    and looks again once a claim would have lapsed."""
    assert deliver(str(execution.id), start=first.get(START_HEADER))["outcome"] == "claim_lost"
    return {}


def _time_up_in_engine_code(execution: Execution, first: dict[str, Any]) -> dict[str, Any]:
    """The task's soft limit runs out between a body and its checkpoint (engine code)."""

    def spent(self: ExecutionRun, **fields: Any) -> None:
        ExecutionRun.checkpoint = original  # type: ignore[method-assign]
        raise SoftTimeLimitExceeded()  # once, as Celery's signal handler raises it

    original = ExecutionRun.checkpoint
    ExecutionRun.checkpoint = spent  # type: ignore[method-assign]
    try:
        # the worker task's clock: a soft limit of a minute (its share is far off)
        clock = time_slice(hard=None, soft=60)
        report = deliver(str(execution.id), start=first.get(START_HEADER), clock=clock)
    finally:
        ExecutionRun.checkpoint = original  # type: ignore[method-assign]
    assert report["outcome"] == "time_up", report
    # ended as a killed delivery would: nothing failed, the next delivery takes over
    assert Execution.objects.get(pk=execution.pk).status == ExecutionStatus.RUNNING
    return {}


Sender = Callable[[Execution, dict[str, Any]], dict[str, Any]]

#: each way a message is sent for an execution after its first, with the reactor it needs
SENDERS: dict[str, tuple[type[Reactor], Sender]] = {
    "outage before the claim": (Twice, _outage_before_the_claim),
    "claimed elsewhere": (Twice, _claimed_elsewhere),
    "claim lost mid-pass": (ClaimedMidway, _claim_lost),
    "soft limit spent in engine code": (Twice, _time_up_in_engine_code),
    "swept": (Twice, _swept),
    "cancelled while idle": (Twice, _cancelled_idle),
    "cancelled while claimed": (Twice, _cancelled_while_claimed),
    "resumed on a worker": (Approved, _resumed),
    "interrupt timed out": (Approved, _interrupt_timed_out),
}
#: 0 too: the default priority sends none, before and after
PRIORITIES = st.integers(min_value=-100, max_value=100)


@pytest.mark.parametrize("sender", sorted(SENDERS))
@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(priority=PRIORITIES)
def test_every_message_sent_for_an_execution_carries_its_priority(
    nobody_queue: str, priority: int, sender: str
) -> None:
    taken(nobody_queue)  # an earlier example's messages (a failing one's)
    reactor, send = SENDERS[sender]
    execution = reactor.run_async(n=1, day=date(2026, 1, 1), priority=priority)
    (first,) = taken(nobody_queue)
    if priority:  # (the default sends none: the broker shows its own default)
        assert first["priority"] == celery_priority(priority)
    kept = send(execution, first)
    (again,) = taken(nobody_queue)
    assert again["priority"] == first["priority"], sender
    for header, value in kept.items():
        assert again.get(header) == value, header


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(priority=PRIORITIES.filter(bool))
def test_an_in_process_run_hands_its_priority_on_to_the_worker_message(
    nobody_queue: str, priority: int
) -> None:
    result = HandedOff.run(n=2, day=date(2026, 1, 1), priority=priority)
    assert result.status == "handed_off"
    (message,) = taken(nobody_queue)
    assert message["priority"] == celery_priority(priority)


@with_lock(lambda inputs: f"message-priority:{inputs['n']}", ttl=30)
class Locked(Reactor):
    inputs = ("n", "day")
    only = step(Note, n=from_input("n"))


def test_an_outage_keeps_the_requeue_token_of_the_park_it_delays(
    nobody_queue: str, settings: Any
) -> None:
    """A park's countdown requeue that meets an outage is sent again with that park's token:
    without it, once the execution had parked again, the message would not be recognised as
    stale and would take the claim for one more contention attempt."""
    settings.REACTOR_WORKER_WAIT = 0
    held = Coordinator().admit([LockClaim("message-priority:9")], Holder(owner="test"))
    assert isinstance(held, Admitted)
    try:
        execution = Locked.run_async(n=9, day=date(2026, 1, 1))
        taken(nobody_queue)
        deliver(str(execution.id))  # refused: parks, and its countdown requeue is sent
        assert Execution.objects.get(pk=execution.pk).status == ExecutionStatus.PARKED
        (parked,) = taken(nobody_queue)
        token = parked["kwargs"].get("requeue_token")
        assert token
        with override_settings(REACTOR_REDIS_URL=UNREACHABLE):
            report = deliver(str(execution.id), requeue_token=token)
        assert report["outcome"] == "coordination_unavailable"
        assert [m["kwargs"].get("requeue_token") for m in taken(nobody_queue)] == [token]
    finally:
        Coordinator().release(held, "success")
