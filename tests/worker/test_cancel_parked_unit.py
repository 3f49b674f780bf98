"""A worker execution parked inside a unit, then cancelled: what the unit left must still be
rolled back (docs/reactors-and-steps.md, "The promise under cancel and retry").

* a sequential ``map_step`` parked part-way (an element waits for a lock): the elements that
  completed are undone, even when no earlier step completed (the map enters the rollback log
  only once it completes);
* a step parked for its retry's backoff: its failed attempt is the final one now — it is
  compensated once, under its re-taken lock;
* a retry that ends otherwise (skipped: its period bucket was marked meanwhile) leaves its
  failed attempt as any retried one — a later failure of the run does not compensate it.

Deliveries run in this process (``deliver`` is the task body); what they enqueue goes to a
queue nobody reads; the delivery a cancel sends is the test's to make.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from reactor_app import (
    Failure,
    Reactor,
    Retries,
    Step,
    Success,
    element,
    from_input,
    map_step,
    step,
    with_lock,
    with_period,
)
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.engine.dispatch import deliver
from reactor_app.status import ExecutionStatus

pytestmark = pytest.mark.django_db(transaction=True)

LOG: list[tuple[str, str, Any]] = []


def _item_key(args: dict[str, Any]) -> str:
    return f"parked-unit:{args['run']}:{args['item']}"


@with_lock(_item_key, ttl=30)
class PerItem(Step):
    inputs = ("run", "item")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        LOG.append((f"item{args['item']}", "do", context.attempt))
        return Success(args["item"])

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        LOG.append((f"item{args['item']}", "undo", result))


class Skippable(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        LOG.append(("first", "do", context.attempt))
        return Success("first")

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        LOG.append(("first", "undo", result))


class MapReactor(Reactor):
    inputs = ("run", "items", "skip_first")
    first = step(Skippable, where=lambda inputs, results: not inputs["skip_first"])
    each = map_step(PerItem, over=from_input("items"), run=from_input("run"), item=element())


@with_lock(lambda args: f"parked-unit:{args['run']}:retry", ttl=30)
class FailsOnce(Step):
    inputs = ("run",)
    # the backoff is long: the execution stays parked until the test cancels it
    retries = Retries(max_attempts=2, backoff="fixed", base_delay=60)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        LOG.append(("fails_once", "enter", context.attempt))
        if context.attempt == 1:
            return Failure("the first attempt fails")
        return Success("second")

    def compensate(self, error: BaseException, args: dict[str, Any], context: Any) -> None:
        # a fencing token: the compensation runs under the step's re-taken lock
        token = context.fencing_token()
        LOG.append(("fails_once", "compensate", (type(error).__name__, str(error), token)))


class RetryReactor(Reactor):
    inputs = ("run",)
    first = step(Skippable)
    fails_once = step(FailsOnce, run=from_input("run"))


@pytest.fixture(autouse=True)
def in_process(settings: Any) -> Iterator[None]:
    settings.REACTOR_CELERY_QUEUE = f"reactor-nobody-{uuid.uuid4().hex[:8]}"
    settings.REACTOR_WORKER_WAIT = 0  # contention parks at once
    LOG.clear()
    yield


def _cancel_parked(execution: Any) -> None:
    """Cancel the parked execution: the canceller hands it to a worker, whose delivery (made
    here) ends it ``cancelled``."""
    execution.cancel("stop", by="test")
    deliver(str(execution.id))
    execution.refresh_from_db()
    assert execution.status == ExecutionStatus.CANCELLED


@pytest.mark.parametrize("skip_first", [True, False], ids=["map-only", "after-a-step"])
def test_a_map_parked_part_way_then_cancelled_undoes_its_completed_elements(
    skip_first: bool,
) -> None:
    run = uuid.uuid4().hex
    coordinator = Coordinator()
    blocker = coordinator.admit([LockClaim(f"parked-unit:{run}:1")], Holder(owner="blocker"))
    assert isinstance(blocker, Admitted)
    try:
        execution = MapReactor.run_async(run=run, items=[0, 1, 2], skip_first=skip_first)
        assert deliver(str(execution.id))["outcome"] == "parked"  # element 1 waits
        _cancel_parked(execution)
    finally:
        coordinator.release(blocker, "success")
    expected = [("item0", "do", 1), ("item0", "undo", 0)]
    if not skip_first:
        expected = [("first", "do", 1), *expected, ("first", "undo", "first")]
    assert expected == LOG


def test_a_step_parked_for_its_retry_then_cancelled_is_compensated_once() -> None:
    run = uuid.uuid4().hex
    execution = RetryReactor.run_async(run=run)
    assert deliver(str(execution.id))["outcome"] == "parked"  # the backoff, as a requeue
    _cancel_parked(execution)
    assert [entry[:2] for entry in LOG] == [
        ("first", "do"),
        ("fails_once", "enter"),
        ("fails_once", "compensate"),
        ("first", "undo"),
    ]
    kind, message, token = LOG[2][2]
    assert kind == "StepFailed"
    assert "the first attempt fails" in message
    assert token is not None
    # the compensation re-took the step's lock and gave it back
    probe = Coordinator().admit([LockClaim(f"parked-unit:{run}:retry")], Holder(owner="probe"))
    assert isinstance(probe, Admitted)
    Coordinator().release(probe, "success")


def test_a_pending_failure_of_a_step_the_reactor_no_longer_has_is_reported() -> None:
    """A deploy removed the step while its retry was parked: nothing to compensate with, and
    the execution's ``rollback_failures`` says so instead of passing over it."""
    execution = RetryReactor.run_async(run=uuid.uuid4().hex)
    assert deliver(str(execution.id))["outcome"] == "parked"
    execution.refresh_from_db()
    execution.context["pending_failures"]["fails_once"]["step"] = "removed_since"
    execution.save(update_fields=["context"])
    _cancel_parked(execution)
    assert [entry[:2] for entry in LOG] == [
        ("first", "do"),
        ("fails_once", "enter"),
        ("first", "undo"),
    ]
    assert {"step": "fails_once", "kind": "compensate", "reason": "unknown_step"} in (
        execution.rollback_failures
    )


@with_period(lambda args: f"parked-unit:{args['run']}:period", every="day")
class DailyFailsOnce(FailsOnce):
    pass


class Last(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        LOG.append(("last", "enter", context.attempt))
        return Failure("the run fails here")


class PeriodReactor(Reactor):
    inputs = ("run",)
    daily = step(DailyFailsOnce, run=from_input("run"))
    last = step(Last)


def test_a_retry_skipped_by_its_period_leaves_its_failed_attempt_alone() -> None:
    run = uuid.uuid4().hex
    execution = PeriodReactor.run_async(run=run)
    assert deliver(str(execution.id))["outcome"] == "parked"  # attempt 1 failed: the backoff
    # meanwhile the day's work is done elsewhere: its bucket is marked
    declaration = PeriodReactor.steps["daily"].declarations.by_primitive["period"]
    key = declaration.compute_key({"run": run}, reactor="elsewhere", step="daily")
    marker = Coordinator()
    marked = marker.admit([declaration.claim(key)], Holder(owner="elsewhere"))
    assert isinstance(marked, Admitted)
    marker.release(marked, "success")
    LOG.clear()
    deliver(str(execution.id))
    execution.refresh_from_db()
    assert execution.status == ExecutionStatus.FAILED  # at ``last``
    assert LOG == [("last", "enter", 1)]  # the skipped step is neither run nor compensated
