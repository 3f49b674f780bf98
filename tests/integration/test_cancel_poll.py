"""How often a running execution reads its cancel flag (``REACTOR_CANCEL_POLL``).

The flag is a Redis key read at step boundaries and ``checkpoint()``; reading it at every one
would cost each uncoordinated step a round trip, so a run reads it at most every
``REACTOR_CANCEL_POLL`` seconds. These tests count the reads of a real Redis client and check
that a request written by "another process" (the flag set in Redis directly, as
``request_cancel`` does elsewhere) still stops the run within that bound.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from reactor_app import Reactor, Step, Success, step, value, with_lock
from reactor_app.coordination.lock import hold_key
from reactor_app.coordination.redis import get_client
from reactor_app.engine import cancel_flag
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.renewing import KEPT_LEASE

pytestmark = pytest.mark.django_db(transaction=True)


class Noop(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(None)


class TenNoops(Reactor):
    s0 = step(Noop)
    s1 = step(Noop)
    s2 = step(Noop)
    s3 = step(Noop)
    s4 = step(Noop)
    s5 = step(Noop)
    s6 = step(Noop)
    s7 = step(Noop)
    s8 = step(Noop)
    s9 = step(Noop)


#: monotonic time the flag was raised, and each step's start (read by the test)
marks: dict[str, Any] = {}


class Tick(Step):
    """10 ms of work; the third tick raises the cancel flag the way another process would."""

    inputs = ("n",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        marks.setdefault("ticks", []).append(time.monotonic())
        if args["n"] == 2:
            request = {"reason": "from elsewhere", "by": "test", "at": "now"}
            get_client().set(cancel_flag._key(context.execution_id), json.dumps(request), ex=60)
            marks["raised"] = time.monotonic()
        time.sleep(0.01)
        return Success(None)


#: sixty 10 ms steps, the flag raised in the third
SixtyTicks = type("SixtyTicks", (Reactor,), {f"t{n}": step(Tick, n=value(n)) for n in range(60)})


@pytest.fixture
def flag_reads() -> Iterator[list[str]]:
    """Every cancel-flag read of the coordination client, by key."""
    client = get_client()
    reads: list[str] = []
    original = client.get

    def counting(name: str, *args: Any, **kwargs: Any) -> Any:
        if ":cancel:" in str(name):
            reads.append(str(name))
        return original(name, *args, **kwargs)

    client.get = counting
    try:
        yield reads
    finally:
        del client.get


def test_step_boundaries_read_the_flag_at_most_every_cancel_poll(flag_reads: list[str]) -> None:
    with override_settings(REACTOR_CANCEL_POLL=60):
        assert TenNoops.run().ok
    # none: a run created by this very call counts its flag as read clear at creation (nobody
    # can name it before its row exists), and every later boundary is within the interval
    assert flag_reads == []
    flag_reads.clear()
    with override_settings(REACTOR_CANCEL_POLL=0):
        assert TenNoops.run().ok
    # every boundary and every checkpoint after a body
    assert len(flag_reads) >= 20


def test_a_request_from_elsewhere_stops_the_run_within_the_poll_interval() -> None:
    marks.clear()
    with override_settings(REACTOR_CANCEL_POLL=0.1):
        result = SixtyTicks.run()
    assert not result.ok
    execution = Execution.objects.get(pk=result.execution_id)
    assert execution.status == ExecutionStatus.CANCELLED
    after = [t for t in marks["ticks"] if t > marks["raised"]]
    # steps of at least 10 ms started after the request: at most one poll interval's worth
    # (0.1 s), plus the one whose boundary reads the flag. Counted, not timed: a stall of the
    # machine lowers the count, where it would stretch the time. A run that never read the
    # flag again would run the other 57
    assert len(after) <= 0.1 / 0.01 + 2, len(after)
    assert len(marks["ticks"]) < 60


def test_a_failed_read_rests_the_poll_only_while_the_settings_stay() -> None:
    """After a failed read the poll rests (an outage must not cost every step a connection
    attempt) — but only under the settings it failed with: once they change, another Redis may
    be configured, and a request there is read at once (no test or deployment inherits the
    rest of an earlier configuration)."""
    execution_id = "rest-check"
    request = {"reason": "seen", "by": "test", "at": "now"}
    get_client().set(cancel_flag._key(execution_id), json.dumps(request), ex=60)
    try:
        with override_settings(REACTOR_REDIS_URL="redis://127.0.0.1:1/0"):
            assert cancel_flag.cancel_request(execution_id) is None  # unreachable: now resting
        assert cancel_flag.cancel_request(execution_id) == request
    finally:
        get_client().delete(cancel_flag._key(execution_id))


@with_lock(lambda args: "cancel-fold:acct", ttl=30, wait=5)
class CancelledMidBody(Step):
    """Raises its execution's cancel flag during its body, as another process would, and
    records what its undo (and a compensate, which must not run: the body completed) sees."""

    def run(self, args: dict[str, Any], context: Any) -> Any:
        request = {"reason": "mid-body", "by": "test", "at": "now"}
        get_client().set(cancel_flag._key(context.execution_id), json.dumps(request), ex=60)
        return Success("done")

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> Any:
        marks.setdefault("undone", []).append(result)
        marks["held_while_undoing"] = bool(get_client().exists(hold_key("cancel-fold:acct")))

    def compensate(self, error: BaseException, args: dict[str, Any], context: Any) -> Any:
        marks["compensated"] = type(error).__name__


class After(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        marks["after_ran"] = True
        return Success(None)


class FoldedCancel(Reactor):
    charge = step(CancelledMidBody)
    notify = step(After)


def test_a_cancel_during_a_held_body_is_read_by_its_release_and_undone_under_the_hold() -> None:
    """The check after a locked body rides on the release (one round trip, no read of its
    own): even a poll interval longer than the whole run cannot let a cancel raised during
    the body through — the body completed, so the step is undone (once, not compensated)
    while the lock is still held, and the run ends cancelled before its next step. (With the
    read left to the poll, this run succeeded: its flag was last read at creation, well
    within the minute.)"""
    marks.clear()
    with override_settings(REACTOR_CANCEL_POLL=60):
        result = FoldedCancel.run()
    assert not result.ok
    execution = Execution.objects.get(pk=result.execution_id)
    assert execution.status == ExecutionStatus.CANCELLED
    assert marks.get("undone") == ["done"]
    assert "compensated" not in marks
    assert marks.get("held_while_undoing") is True
    assert "after_ran" not in marks
    assert not get_client().exists(hold_key("cancel-fold:acct"))  # released after undoing


@with_lock(lambda args: "cancel-fold:long", ttl=KEPT_LEASE, wait=5)
class LongCancelledMidBody(Step):
    """A body and an undo each longer than the lock's lease: only renewal keeps it."""

    def run(self, args: dict[str, Any], context: Any) -> Any:
        request = {"reason": "mid-body", "by": "test", "at": "now"}
        get_client().set(cancel_flag._key(context.execution_id), json.dumps(request), ex=60)
        time.sleep(KEPT_LEASE + 0.5)
        return Success("done")

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> Any:
        time.sleep(KEPT_LEASE + 0.5)
        marks["held_after_long_undo"] = bool(get_client().exists(hold_key("cancel-fold:long")))
        try:
            context.checkpoint()
        except Exception as exc:
            marks["checkpoint"] = type(exc).__name__


class LongFoldedCancel(Reactor):
    charge = step(LongCancelledMidBody)


def test_a_release_held_back_by_a_cancel_keeps_renewing_the_holds() -> None:
    """The renewal stops before the release is tried and starts again when a cancel holds
    the release back, counting from the last renewal — not from the admission, whose lease
    ran out long ago (that would report the lock lost and let it lapse mid-undo)."""
    marks.clear()
    with override_settings(REACTOR_CANCEL_POLL=60):
        result = LongFoldedCancel.run()
    execution = Execution.objects.get(pk=result.execution_id)
    assert execution.status == ExecutionStatus.CANCELLED
    assert marks.get("held_after_long_undo") is True
    assert "checkpoint" not in marks or marks["checkpoint"] == "ExecutionCancelled"
    assert not get_client().exists(hold_key("cancel-fold:long"))
