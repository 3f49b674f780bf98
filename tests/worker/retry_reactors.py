"""Reactors of the retry-from-step tests (issue 17, item 2), importable by worker processes.

``RetryableReactor``: ``reserve`` (returns a fresh id each time it runs; no undo, so a retry
may reuse it) → ``charge`` (a step
lock on ``charge:<key>``; fails while the Redis switch ``fail:<key>`` is set) → ``notify``
(reads both results), under a reactor-level lock ``order:<key>``. Every body records its run
(and the arguments it got) in Redis, so a test sees which steps ran in which execution.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from reactor_app import Reactor, Step, Success, from_input, from_result, step, with_lock
from reactor_app.coordination.redis import get_client
from tests.worker.reactors import record, trace_key


def failing(key: Any) -> bool:
    return bool(get_client().exists(trace_key(f"fail:{key}")))


def set_failing(key: Any, on: bool) -> None:
    if on:
        get_client().set(trace_key(f"fail:{key}"), "1")
    else:
        get_client().delete(trace_key(f"fail:{key}"))


class ReserveStep(Step):
    """No undo (a hold that expires on its own): its effect stands after a rollback, so a
    retry may reuse its result (one whose undo ran, it never reuses)."""

    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        reservation = uuid.uuid4().hex
        record(
            "ran",
            step="reserve",
            execution=context.execution_id,
            pid=os.getpid(),
            value=reservation,
        )
        return Success(reservation)


@with_lock(lambda args: f"charge:{args['key']}", ttl=30)
class ChargeStep(Step):
    inputs = ("key", "reservation")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record(
            "ran",
            step="charge",
            execution=context.execution_id,
            pid=os.getpid(),
            reservation=args["reservation"],
            token=context.fencing_token(),
        )
        if failing(args["key"]):
            raise RuntimeError("card declined")
        return Success(f"charged:{args['reservation']}")

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        record("undone", step="charge", execution=context.execution_id, value=result)


class NotifyStep(Step):
    inputs = ("reservation", "charge")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record("ran", step="notify", execution=context.execution_id, pid=os.getpid(), **args)
        return Success("sent")


@with_lock(lambda inputs: f"order:{inputs['key']}", ttl=30)
class RetryableReactor(Reactor):
    inputs = ("key",)

    reserve = step(ReserveStep, key=from_input("key"))
    charge = step(ChargeStep, key=from_input("key"), reservation=from_result("reserve"))
    notify = step(NotifyStep, reservation=from_result("reserve"), charge=from_result("charge"))

    returns = "charge"


@with_lock(lambda inputs: f"order:{inputs['key']}", ttl=30)
class BackgroundRetryableReactor(Reactor):
    """The same, always on a worker: its retry is enqueued, not run in the caller."""

    background = True
    inputs = ("key",)

    reserve = step(ReserveStep, key=from_input("key"))
    charge = step(ChargeStep, key=from_input("key"), reservation=from_result("reserve"))
    notify = step(NotifyStep, reservation=from_result("reserve"), charge=from_result("charge"))

    returns = "charge"


@with_lock(lambda inputs: f"order:{inputs['key']}", ttl=30)
class AfterReserveReactor(Reactor):
    """``reserve`` in the caller, the rest on a worker."""

    background = "after:reserve"
    inputs = ("key",)

    reserve = step(ReserveStep, key=from_input("key"))
    charge = step(ChargeStep, key=from_input("key"), reservation=from_result("reserve"))
    notify = step(NotifyStep, reservation=from_result("reserve"), charge=from_result("charge"))

    returns = "charge"
