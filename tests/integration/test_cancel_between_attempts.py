"""A cancel that comes between two attempts of a step (docs/reactors-and-steps.md, "The promise
under cancel and retry"): the failed attempt is the step's final one. No further body starts,
the failed attempt is compensated once (it did not complete), the steps that completed are
undone, and the run ends ``cancelled``. In the caller's process; the worker's side (the retry
parked, then cancelled) is tests/worker/test_cancel_parked_unit.py."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from django.db import connection

from reactor_app import Failure, Reactor, Retries, Step, Success, from_input, step, with_lock
from reactor_app.engine.cancel import cancel_execution
from reactor_app.exceptions import StepFailed

pytestmark = pytest.mark.django_db(transaction=True)

#: what the bodies and hooks did, in order: (label, what, attempt or error type)
LOG: list[tuple[str, str, Any]] = []


def _cancel_from_thread(execution: str) -> None:
    try:
        cancel_execution(execution, "stop")
    finally:
        connection.close()  # this thread's own


class Earlier(Step):
    inputs = ("k",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        LOG.append(("earlier", "do", context.attempt))
        return Success("done")

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        LOG.append(("earlier", "undo", result))


class Failing(Step):
    """Attempt 1 asks for its run's cancel (at once, or ``cancel_after`` seconds later from
    another thread) and fails; a second attempt would succeed."""

    inputs = ("k", "cancel_after")
    retries = Retries(max_attempts=2, backoff="fixed", base_delay=1.5)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        LOG.append(("failing", "enter", context.attempt))
        if context.attempt == 1:
            execution = str(context.execution_id)
            if args["cancel_after"]:
                threading.Timer(args["cancel_after"], _cancel_from_thread, (execution,)).start()
            else:
                cancel_execution(execution, "stop")
            return Failure("the first attempt fails")
        return Success("second attempt")

    def compensate(self, error: BaseException, args: dict[str, Any], context: Any) -> None:
        LOG.append(("failing", "compensate", (type(error).__name__, str(error))))


@with_lock(lambda args: f"between-attempts:{args['k']}", ttl=30)
class LockedFailing(Failing):
    pass


def _reactor(unit: type[Step]) -> type[Reactor]:
    class Between(Reactor):
        inputs = ("k", "cancel_after")
        earlier = step(Earlier, k=from_input("k"))
        failing = step(unit, k=from_input("k"), cancel_after=from_input("cancel_after"))

    return Between


@pytest.mark.parametrize("unit", [Failing, LockedFailing], ids=["unlocked", "locked"])
def test_a_cancel_during_a_failing_attempt_makes_it_the_final_one(unit: type[Step]) -> None:
    """Seen right after the body (for a step holding a lock too, whose release reads the cancel
    only after a success): compensated while its holds are held, never retried."""
    LOG.clear()
    result = _reactor(unit).run(k=uuid.uuid4().hex, cancel_after=0)
    assert result.status == "cancelled", result.error
    assert LOG == [
        ("earlier", "do", 1),
        ("failing", "enter", 1),
        ("failing", "compensate", ("FailureReason", "the first attempt fails")),
        ("earlier", "undo", "done"),
    ]


@pytest.mark.parametrize("unit", [Failing, LockedFailing], ids=["unlocked", "locked"])
def test_a_cancel_during_the_backoff_starts_no_further_attempt(unit: type[Step]) -> None:
    """The cancel comes 0.3 s into a 1.5 s backoff: the retry is not started; the failed
    attempt is compensated (under its re-taken lock) with a ``StepFailed`` that says why it
    failed, then the completed step is undone."""
    LOG.clear()
    result = _reactor(unit).run(k=uuid.uuid4().hex, cancel_after=0.3)
    assert result.status == "cancelled", result.error
    assert [entry[:2] for entry in LOG] == [
        ("earlier", "do"),
        ("failing", "enter"),
        ("failing", "compensate"),
        ("earlier", "undo"),
    ]
    assert LOG[1][2] == 1  # attempt 1 only
    kind, message = LOG[2][2]
    # a stall of 0.3 s right after the body would let the check after it see the cancel: then
    # the compensate receives the body's own failure, as in the test above
    assert kind in (StepFailed.__name__, "FailureReason"), kind
    assert "the first attempt fails" in message
