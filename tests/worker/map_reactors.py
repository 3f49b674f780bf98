"""Reactors of the parallel map worker tests (tests/worker/test_parallel_map.py).

Every element body records its enter/exit interval (``timed``) and every undo records what it
undid, into the test's Redis trace lists, so a test can measure overlap and the undo order.
"""

from __future__ import annotations

import os
import time
from typing import Any

from reactor_app import (
    Reactor,
    Step,
    Success,
    compose,
    element,
    from_input,
    map_step,
    step,
    with_lock,
    with_semaphore,
)
from tests.worker.reactors import record, timed

#: the semaphore bounding the elements of ``BoundedMapReactor``
BOUND_KEY = "map-bound"


class PrepareStep(Step):
    """A step before the map: undone when the map fails."""

    inputs = ("fail_on",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record("prepare", execution=context.execution_id)
        return Success("prepared")

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        record("undone", item="prepare", at=time.time_ns(), execution=context.execution_id)


class ElementStep(Step):
    """One element: sleeps ``hold`` seconds (recorded), fails when ``item == fail_on``."""

    inputs = ("item", "hold", "fail_on")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        timed("element", context, args["hold"], item=args["item"])
        if args["item"] == args["fail_on"]:
            raise ValueError(f"element {args['item']} fails")
        return Success({"item": args["item"], "pid": os.getpid()})

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        record("undone", item=args["item"], at=time.time_ns(), execution=context.execution_id)


def _element_map() -> Any:
    return map_step(
        ElementStep,
        over=from_input("items"),
        parallel=True,
        item=element("n"),
        hold=element("hold"),
        fail_on=from_input("fail_on"),
    )


class ParallelMapReactor(Reactor):
    """``prepare``, then one ``ElementStep`` per item of ``items`` (``{"n", "hold"}``) in
    parallel; the value is the elements' results in element order."""

    inputs = ("items", "fail_on")

    prepare = step(PrepareStep, fail_on=from_input("fail_on"))
    mapped = _element_map()

    returns = "mapped"


class BoundedMapReactor(Reactor):
    """The elements share one semaphore of 2: at most two run at once."""

    inputs = ("items", "fail_on")

    mapped = with_semaphore(lambda args: BOUND_KEY, limit=2)(_element_map())

    returns = "mapped"


class LockedMapReactor(Reactor):
    """Each element locks its own item: equal items run one at a time, others side by side."""

    inputs = ("items", "fail_on")

    mapped = with_lock(lambda args: f"map-item:{args['item']}", ttl=30)(_element_map())

    returns = "mapped"


class ComposesParallelMap(Reactor):
    """A parallel map inside a composed child: the elements wake the root, whose delivery
    continues the child and joins them."""

    inputs = ("items", "fail_on")

    inner = compose(ParallelMapReactor, items=from_input("items"), fail_on=from_input("fail_on"))

    returns = "inner"


@with_lock(lambda args: "map-guard", ttl=30)
class GuardedMapReactor(Reactor):
    """Holds ``map-guard`` at reactor level and maps a step locking the same key in parallel:
    the elements could never take it from their dispatcher (the hand-off guard refuses)."""

    inputs = ("items", "fail_on")

    mapped = with_lock(lambda args: "map-guard", ttl=30)(_element_map())
