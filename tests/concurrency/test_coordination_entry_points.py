"""Where step coordination is taken (DESIGN §2.2), with real Redis and real parallelism.

* each retry attempt takes and releases the step's lock: another execution enters between
  two attempts, and every attempt gets a fresh fencing token;
* each ``map_step`` iteration is coordinated separately, on its own element's key: two
  executions mapping over the same elements never overlap on one element, while different
  elements run side by side;
* coordination comes after ``where`` and after argument validation: a suppressed step or a
  step whose arguments fail validation takes no hold (no event, and a key held elsewhere with
  ``wait=0`` does not turn it into a contention failure);
* ``@with_lock`` placed above or below ``@step`` on an inline step is the same declaration:
  enforced forward (bodies on one key never overlap) and re-taken by the undo.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from reactor_app import (
    Reactor,
    Retries,
    Step,
    Success,
    element,
    from_input,
    from_result,
    map_step,
    step,
    with_lock,
)
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Holder, LockClaim, Refused
from reactor_app.exceptions import ArgumentResolutionError, InputValidationError
from reactor_app.models import CoordinationEvent, StepRun
from reactor_app.testing import assert_locked, assert_not_locked, coordination_state
from tests.concurrency.harness import (
    held_elsewhere,
    max_concurrency,
    now_ns,
    overlaps,
    run_in_processes,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _events(key: str, execution_id: str | None = None) -> list[str]:
    rows = CoordinationEvent.objects.filter(key=key)
    if execution_id is not None:
        rows = rows.filter(execution_id=execution_id)
    return list(rows.order_by("at", "id").values_list("kind", flat=True))


# -- retries: take and release per attempt -------------------------------------------------


def test_each_retry_attempt_takes_and_releases_the_lock() -> None:
    """In-process, the backoff between two attempts holds nothing: a contending execution
    enters between them, and each attempt is a fresh acquisition with a newer token."""
    attempts: list[dict[str, Any]] = []
    contender: list[dict[str, Any]] = []
    first_attempt_done = threading.Event()

    @with_lock(lambda a: f"acct:{a['account_id']}", ttl=30, wait=10)
    class Flaky(Step):
        inputs = ("account_id",)
        retries = Retries(max_attempts=2, backoff="fixed", base_delay=1.0)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            start = now_ns()
            state = coordination_state().lock("acct:31")
            time.sleep(0.05)
            attempts.append(
                {
                    "attempt": context.attempt,
                    "start": start,
                    "end": now_ns(),
                    "token": context.fencing_token(),
                    "owner": state.owner,
                }
            )
            if context.attempt == 1:
                first_attempt_done.set()
                raise RuntimeError("transient")
            return Success("charged")

    class FlakyReactor(Reactor):
        inputs = ("account_id",)
        charge = step(Flaky, account_id=from_input("account_id"))

    class ContenderReactor(Reactor):
        inputs = ("account_id",)

        @step(account_id=from_input("account_id"))
        @with_lock(lambda a: f"acct:{a['account_id']}", ttl=30, wait=10)
        def charge(self, args: dict[str, Any], context: Any) -> Any:
            start = now_ns()
            time.sleep(0.05)
            contender.append({"start": start, "end": now_ns(), "token": context.fencing_token()})
            return Success("contender")

    boxes: dict[str, Any] = {}

    def run(name: str, reactor: type[Reactor], gate: threading.Event | None) -> None:
        from django.db import connection

        try:
            if gate is not None:
                assert gate.wait(10)
            boxes[name] = reactor.run(account_id=31)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=run, args=("flaky", FlakyReactor, None)),
        threading.Thread(target=run, args=("contender", ContenderReactor, first_attempt_done)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert boxes["flaky"].ok, boxes["flaky"].error
    assert boxes["contender"].ok, boxes["contender"].error
    first, second = attempts
    (other,) = contender
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert first["owner"] == second["owner"] == boxes["flaky"].execution_id
    # the contender ran inside the backoff, between the two attempts
    assert first["end"] <= other["start"] and other["end"] <= second["start"]
    # every attempt is a fresh acquisition: tokens increase in time order
    assert first["token"] < other["token"] < second["token"]
    assert _events("acct:31", boxes["flaky"].execution_id) == [
        "acquired",
        "released",
        "acquired",
        "released",
    ]
    assert_not_locked("acct:31")


# -- map_step: each iteration on its own element's key -------------------------------------

MAP_TRACE: list[tuple[str, str, int, int]] = []  # (element key, execution, start_ns, end_ns)


@with_lock(lambda a: f"item:{a['item']}", ttl=30, wait=60)
class ItemStep(Step):
    inputs = ("item",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        key = f"item:{args['item']}"
        state = coordination_state()
        mine = state.lock(key)
        # only this element's key is held by this execution, by this iteration
        others = [
            other
            for other in ("item:1", "item:2", "item:3", "item:4")
            if other != key and state.lock(other).owner == context.execution_id
        ]
        start = now_ns()
        time.sleep(0.02)
        MAP_TRACE.append((key, context.execution_id, start, now_ns()))
        return Success(
            {"step": mine.step, "owner": mine.owner, "others": others, "item": args["item"]}
        )


class MapReactor(Reactor):
    inputs = ("items",)
    charge = map_step(ItemStep, over=from_input("items"), item=element())


def _map_worker(rotation: int, runs: int) -> tuple[list[Any], list[Any]]:
    MAP_TRACE.clear()
    items = [1, 2, 3, 4]
    items = items[rotation:] + items[:rotation]
    values = []
    for _ in range(runs):
        result = MapReactor.run(items=items)
        assert result.ok, result.error
        values.append((result.execution_id, items, result.value["charge"]))
    return list(MAP_TRACE), values


def test_each_map_iteration_is_coordinated_on_its_own_element() -> None:
    # two processes map in the same order (they meet on every element), two start half-way
    outputs = run_in_processes(_map_worker, [(0, 8), (0, 8), (2, 8), (2, 8)])
    trace = [entry for chunk, _ in outputs for entry in chunk]
    assert len(trace) == 4 * 8 * 4
    for key in ("item:1", "item:2", "item:3", "item:4"):
        same_key = [(execution, start, end) for k, execution, start, end in trace if k == key]
        assert len(same_key) == 32
        assert overlaps(same_key) == [], key  # one element: never two executions at once
    # different elements did run side by side (the map is not one lock for the whole step)
    assert max_concurrency([(k, start, end) for k, _, start, end in trace]) >= 2
    for _, values in outputs:
        for execution_id, items, per_element in values:
            for index, (item, seen) in enumerate(zip(items, per_element, strict=True)):
                assert seen["item"] == item
                assert (seen["step"], seen["owner"]) == (f"charge[{index}]", execution_id)
                assert seen["others"] == []
    for key in ("item:1", "item:2", "item:3", "item:4"):
        assert_not_locked(key)


def test_a_map_iteration_that_fails_releases_only_its_key_and_undoes_the_others() -> None:
    """Iterations already done are undone each under its own element's key."""
    undone: list[tuple[int, Any]] = []

    @with_lock(lambda a: f"item:{a['item']}", ttl=30, wait=0)
    class Charge(Step):
        inputs = ("item",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            if args["item"] == 3:
                raise RuntimeError("element 3 failed")
            return Success(args["item"])

        def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
            state = coordination_state()
            held = [k for k in ("item:1", "item:2", "item:3") if state.lock(k).held]
            undone.append((args["item"], (held, state.lock(f"item:{args['item']}").step)))

    class R(Reactor):
        inputs = ("items",)
        charge = map_step(Charge, over=from_input("items"), item=element())

    result = R.run(items=[1, 2, 3])
    assert not result.ok and result.rollback_failures == []
    # newest first; during each undo only that element's key is held, by that iteration
    assert undone == [(2, (["item:2"], "charge[1]")), (1, (["item:1"], "charge[0]"))]
    for item in (1, 2, 3):
        assert_not_locked(f"item:{item}")


# -- where and validation come before coordination -----------------------------------------


def test_a_where_suppressed_step_takes_no_hold() -> None:
    ran: list[str] = []

    class R(Reactor):
        inputs = ("account_id", "enabled")

        @step(account_id=from_input("account_id"), where=lambda inputs, results: inputs["enabled"])
        @with_lock(lambda a: f"acct:{a['account_id']}", ttl=30, wait=0)
        def charge(self, args: dict[str, Any], context: Any) -> Any:
            ran.append("charge")
            return Success("charged")

    # The key is held elsewhere and the step would not wait: any attempt to take it would
    # fail the run with a LockAcquisitionError.
    with held_elsewhere("acct:41", ttl=30):
        result = R.run(account_id=41, enabled=False)
    assert result.ok, result.error
    assert ran == []
    assert _events("acct:41", result.execution_id) == []
    run = StepRun.objects.get(execution_id=result.execution_id, step="charge")
    assert (run.status, run.detail["reason"]) == ("skipped", "where")

    # Control: the same step, enabled, does take the key.
    enabled = R.run(account_id=41, enabled=True)
    assert enabled.ok and ran == ["charge"]
    assert _events("acct:41", enabled.execution_id) == ["acquired", "released"]


def test_a_step_whose_arguments_fail_validation_takes_no_hold() -> None:
    ran: list[str] = []

    @with_lock(lambda a: f"acct:{a['account_id']}", ttl=30, wait=0)
    class Charge(Step):
        inputs = ("account_id", "amount")  # amount is never given

        def run(self, args: dict[str, Any], context: Any) -> Any:
            ran.append("charge")
            return Success("charged")

    class Invalid(Reactor):
        inputs = ("account_id",)
        charge = step(Charge, account_id=from_input("account_id"))

    class Unresolvable(Reactor):
        inputs = ("account",)
        charge = step(
            Charge, account_id=from_input("account", "id"), amount=from_input("account", "amt")
        )

    with held_elsewhere("acct:42", ttl=30):
        invalid = Invalid.run(account_id=42)
        unresolvable = Unresolvable.run(account={"id": 42})
    # validation failed first: not a LockAcquisitionError on the held key
    assert isinstance(invalid.error, InputValidationError), invalid.error
    assert invalid.error.field_errors == {"amount": "required"}
    assert isinstance(unresolvable.error, ArgumentResolutionError), unresolvable.error
    assert ran == []
    # nothing was attempted on the key: no acquisition, no acquisition failure
    assert _events("acct:42") == []

    # and with the key free, it is never taken either
    assert not Invalid.run(account_id=43).ok
    assert _events("acct:43") == []
    assert_not_locked("acct:43")


# -- decorator order on an inline step -----------------------------------------------------

INLINE_TRACE: list[tuple[str, int, int]] = []


def _inline_reactor(order: str, key_prefix: str) -> type[Reactor]:
    def key(a: dict[str, Any]) -> str:
        return f"{key_prefix}:{a['account_id']}"

    def body(self: Any, args: dict[str, Any], context: Any) -> Any:
        start = now_ns()
        time.sleep(0.01)
        INLINE_TRACE.append((context.execution_id, start, now_ns()))
        return Success(context.fencing_token())

    arguments = {"account_id": from_input("account_id")}
    if order == "lock_above_step":
        charge = with_lock(key, ttl=30, wait=30)(step(**arguments)(body))
    else:
        charge = step(**arguments)(with_lock(key, ttl=30, wait=30)(body))

    charge_spec = charge

    class Inline(Reactor):
        inputs = ("account_id",)
        charge = charge_spec

    return Inline


def _inline_worker(order: str, runs: int) -> list[tuple[str, int, int]]:
    INLINE_TRACE.clear()
    reactor = _inline_reactor(order, "inline")
    for _ in range(runs):
        result = reactor.run(account_id=1)
        assert result.ok, result.error
    return list(INLINE_TRACE)


@pytest.mark.parametrize("order", ["lock_above_step", "lock_below_step"])
def test_with_lock_on_an_inline_step_in_either_order_is_enforced_forward(order: str) -> None:
    reactor = _inline_reactor(order, "inline")
    assert reactor.steps["charge"].declares_coordination()
    assert reactor.steps["charge"].lock_config.ttl == 30
    traces = run_in_processes(_inline_worker, [(order, 20)] * 3)
    intervals = [entry for chunk in traces for entry in chunk]
    assert len(intervals) == 60
    assert overlaps(intervals) == []
    assert_not_locked("inline:1")


@pytest.mark.parametrize("order", ["lock_above_step", "lock_below_step"])
def test_with_lock_on_an_inline_step_in_either_order_is_re_taken_by_undo(order: str) -> None:
    seen: dict[str, Any] = {}

    def key(a: dict[str, Any]) -> str:
        return f"acct:{a['account_id']}"

    def body(self: Any, args: dict[str, Any], context: Any) -> Any:
        return Success("charged")

    def undo(self: Any, result: Any, args: dict[str, Any], context: Any) -> None:
        seen["locked"] = assert_locked(
            "acct:44", by_step="charge", by_execution=context.execution_id
        )
        seen["intruder"] = Coordinator().admit(
            [LockClaim(key="acct:44", ttl=5)], Holder(owner="intruder")
        )

    arguments = {"account_id": from_input("account_id")}
    if order == "lock_above_step":
        charge_spec = with_lock(key, ttl=30, wait=0)(step(**arguments)(body))
    else:
        charge_spec = step(**arguments)(with_lock(key, ttl=30, wait=0)(body))
    charge_spec.undo(undo)

    class R(Reactor):
        inputs = ("account_id",)
        charge = charge_spec

        @step(after=from_result("charge"))
        def boom(self, args: dict[str, Any], context: Any) -> Any:
            raise RuntimeError("later step failed")

    result = R.run(account_id=44)
    assert not result.ok and result.rollback_failures == []
    assert seen["locked"].owner == result.execution_id
    assert isinstance(seen["intruder"], Refused)
    assert_not_locked("acct:44")
