"""Reactors of the cancel worker tests (tests/worker/test_cancel.py), importable by workers.

Every body and every undo records into the test's Redis trace lists (``records``), with the
fencing token of the lock it ran under, so a test can tell which steps ran, which were undone,
and whether an undo ran under its lock.
"""

from __future__ import annotations

import time
from typing import Any

from reactor_app import (
    Reactor,
    Step,
    Success,
    compose,
    element,
    from_input,
    interrupt,
    map_step,
    step,
    with_lock,
    with_ordered_lock,
)
from reactor_app.testing import coordination_state
from tests.worker.reactors import record


def lock_owner(key: str) -> str | None:
    """Who holds ``key`` in Redis right now (not what the step believes)."""
    return coordination_state().lock(key).owner


def account_key(args: dict[str, Any]) -> str:
    return f"cancel-acct:{args['key']}"


def side_key(args: dict[str, Any]) -> str:
    return f"cancel-side:{args['key']}"


def workflow_key(inputs: dict[str, Any]) -> str:
    return f"cancel-flow:{inputs['key']}"


@with_lock(account_key, ttl=30)
class Charge(Step):
    """A completed step whose undo must run under its own lock."""

    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        token = context.fencing_token(account_key(args))
        record("charge", execution=context.execution_id, token=token)
        return Success({"charged": args["key"]})

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> Any:
        record(
            "undo:charge",
            execution=context.execution_id,
            token=context.fencing_token(account_key(args)),
            holder=lock_owner(account_key(args)),
            at=time.time_ns(),
        )


class Work(Step):
    """A long body that calls ``context.checkpoint()`` every 50 ms for ``seconds``."""

    inputs = ("seconds",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record("enter:work", execution=context.execution_id, at=time.time_ns())
        deadline = time.monotonic() + float(args["seconds"])
        while time.monotonic() < deadline:
            time.sleep(0.05)
            context.checkpoint()
        record("work", execution=context.execution_id)
        return Success("worked")

    def compensate(self, error: BaseException, args: dict[str, Any], context: Any) -> Any:
        record("compensate:work", execution=context.execution_id, error=type(error).__name__)


@with_lock(side_key, ttl=30)
class Gated(Step):
    """A step whose lock a test holds, so that the execution parks here."""

    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record("gated", execution=context.execution_id)
        return Success("gated")


class After(Step):
    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record("after", execution=context.execution_id)
        return Success("after")


@with_lock(workflow_key, ttl=30)
class CancellableReactor(Reactor):
    """An exclusive workflow: charge (locked) → work (checkpoints) → gated (locked) → after."""

    inputs = ("key", "seconds")

    charge = step(Charge, key=from_input("key"))
    work = step(Work, seconds=from_input("seconds"))
    gated = step(Gated, key=from_input("key"))
    after = step(After, key=from_input("key"))


@with_ordered_lock(lambda inputs: f"cancel-line:{inputs['key']}", poison_pill_timeout=60)
class InLineReactor(Reactor):
    """Runs in enqueue order per key; a position is taken when the run is enqueued."""

    inputs = ("key",)

    after = step(After, key=from_input("key"))


class ApprovalReactor(Reactor):
    """Charges, then waits for an approval (an interrupt)."""

    inputs = ("key",)

    charge = step(Charge, key=from_input("key"))
    approval = interrupt()
    after = step(After, key=from_input("key"))


def item_key(args: dict[str, Any]) -> str:
    return f"cancel-item:{args['key']}:{args['item']}"


@with_lock(item_key, ttl=30)
class MapItem(Step):
    """One element of a sequential map, locked on the element (a test holds one to park it)."""

    inputs = ("key", "item")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record("map-item", execution=context.execution_id, item=args["item"])
        return Success(args["item"])

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> Any:
        record(
            "undo:map-item",
            execution=context.execution_id,
            item=args["item"],
            holder=lock_owner(item_key(args)),
            at=time.time_ns(),
        )


class SequentialMapReactor(Reactor):
    """Charges, then one ``MapItem`` per item of ``items``, one after another."""

    inputs = ("key", "items")

    charge = step(Charge, key=from_input("key"))
    items = map_step(MapItem, over=from_input("items"), key=from_input("key"), item=element())


def work_key(args: dict[str, Any]) -> str:
    return f"cancel-work:{args['work']}"


@with_lock(work_key, ttl=30)
class LockedWork(Step):
    """A long body inside a step lock, checking for a cancel every 50 ms."""

    inputs = ("work", "seconds")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        token = context.fencing_token(work_key(args))
        record("enter:locked_work", execution=context.execution_id, token=token)
        deadline = time.monotonic() + float(args["seconds"])
        while time.monotonic() < deadline:
            time.sleep(0.05)
            context.checkpoint()
        return Success("worked")

    def compensate(self, error: BaseException, args: dict[str, Any], context: Any) -> Any:
        # still inside the step's lock: the gate is left after the compensation
        record(
            "compensate:locked_work",
            execution=context.execution_id,
            error=type(error).__name__,
            token=context.fencing_token(work_key(args)),
            holder=lock_owner(work_key(args)),
        )


class LockedWorkReactor(Reactor):
    """charge (locked) → locked_work (a step lock shared by ``work``) → after."""

    inputs = ("key", "work", "seconds")

    charge = step(Charge, key=from_input("key"))
    locked_work = step(LockedWork, work=from_input("work"), seconds=from_input("seconds"))
    after = step(After, key=from_input("key"))


class ChildWork(Reactor):
    """A composed child: charge (locked) → work (checkpoints)."""

    inputs = ("key", "seconds")

    charge = step(Charge, key=from_input("key"))
    work = step(Work, seconds=from_input("seconds"))


@with_lock(lambda inputs: f"cancel-parent:{inputs['key']}", ttl=30)
class ParentReactor(Reactor):
    """charge → a composed child doing the long work → after; exclusive per key."""

    inputs = ("key", "child_key", "seconds")

    charge = step(Charge, key=from_input("key"))
    child = compose(ChildWork, key=from_input("child_key"), seconds=from_input("seconds"))
    after = step(After, key=from_input("key"))
