"""Reactors of the saga-promise tests (tests/worker/test_promise.py), importable by workers.

``PlaceOrder``: ``reserve`` (undo: unreserve) → ``charge`` (undo only: refund, as the README's
``ChargeStep``) → ``email``. Every body, undo and compensate appends to one ledger per order
(a Redis list the test owns, ``ledger(order)``), so a test reads the exact sequence of effects.
A body named in the order's ``land`` input stops at its start until the test says go (the
moment a test cancels "during the body"); with ``stop_at_checkpoint`` it then calls
``context.checkpoint()`` (the body does not complete), else it completes.
"""

from __future__ import annotations

import time
from typing import Any

from reactor_app import (
    Reactor,
    Step,
    Success,
    async_step,
    element,
    from_input,
    from_result,
    map_step,
    step,
    value,
    with_lock,
)
from reactor_app.coordination.redis import get_client
from tests.worker.reactors import trace_key

#: how long a landed body waits for the test's go before it goes on anyway
GO_TIMEOUT = 20.0


def ledger_key(order: str) -> str:
    return trace_key(f"ledger:{order}")


def write(order: str, entry: str) -> None:
    get_client().rpush(ledger_key(order), entry)


def ledger(order: str) -> list[str]:
    return [str(item) for item in get_client().lrange(ledger_key(order), 0, -1)]


def go(order: str) -> None:
    get_client().set(trace_key(f"go:{order}"), "1", ex=120)


def wait_for_go(order: str) -> None:
    deadline = time.monotonic() + GO_TIMEOUT
    while not get_client().exists(trace_key(f"go:{order}")):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no go for {order}")
        time.sleep(0.01)


class Effect(Step):
    """One effect of an order: ``name`` is written as done, undone or compensated."""

    inputs = ("order", "name", "land", "stop_at_checkpoint")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        order, name = args["order"], args["name"]
        if args["land"] == name:
            write(order, f"enter:{name}:{context.execution_id}")
            wait_for_go(order)
            if args["stop_at_checkpoint"]:
                context.checkpoint()
        write(order, f"do:{name}")
        return Success(f"{name}-done")

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        write(args["order"], f"undo:{args['name']}:{result}")

    def compensate(self, error: BaseException, args: dict[str, Any], context: Any) -> None:
        write(args["order"], f"compensate:{args['name']}")


class ChargeOnly(Effect):
    """The README's charge: an undo (refund), no compensate."""

    compensate = Step.compensate  # type: ignore[assignment]


@with_lock(lambda args: f"promise-card:{args['order']}", ttl=30)
class LockedCharge(ChargeOnly):
    """The same charge under a step lock: the cancel is read by the lock's release."""


def _effect(cls: type[Step], name: str) -> Any:
    return step(
        cls,
        order=from_input("order"),
        name=value(name),
        land=from_input("land"),
        stop_at_checkpoint=from_input("stop_at_checkpoint"),
    )


class PlaceOrder(Reactor):
    inputs = ("order", "land", "stop_at_checkpoint")

    reserve = _effect(Effect, "reserve")
    charge = _effect(ChargeOnly, "charge")
    email = _effect(Effect, "email")


class PlaceOrderLocked(Reactor):
    inputs = ("order", "land", "stop_at_checkpoint")

    reserve = _effect(Effect, "reserve")
    charge = _effect(LockedCharge, "charge")
    email = _effect(Effect, "email")


class BackgroundPlaceOrder(PlaceOrder):
    background = True


class BackgroundPlaceOrderLocked(PlaceOrderLocked):
    background = True


# ---- retry after a rollback ---------------------------------------------------------------


def failing(order: str) -> bool:
    return bool(get_client().exists(trace_key(f"fail:{order}")))


def set_failing(order: str, on: bool) -> None:
    if on:
        get_client().set(trace_key(f"fail:{order}"), "1", ex=120)
    else:
        get_client().delete(trace_key(f"fail:{order}"))


class Quote(Step):
    """A read with no effect to undo: its result may be reused by a retry."""

    inputs = ("order",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        write(args["order"], "do:quote")
        return Success(f"quote-{context.execution_id}")


class Reserve(Step):
    inputs = ("order", "quote")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        write(args["order"], f"do:reserve:{context.execution_id}")
        return Success(f"reservation-{context.execution_id}")

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        write(args["order"], f"undo:reserve:{result}")


class Charge(Step):
    inputs = ("order", "reservation")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        write(args["order"], f"do:charge:{args['reservation']}")
        return Success(f"charge-of-{args['reservation']}")

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        write(args["order"], f"undo:charge:{result}")


class Email(Step):
    inputs = ("order", "charge")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        if failing(args["order"]):
            write(args["order"], "fail:email")
            raise RuntimeError("mail server down")
        write(args["order"], f"do:email:paid:{args['charge']}")
        return Success("sent")


class PayOrder(Reactor):
    """quote (no undo) → reserve (undo) → charge (undo) → email (may fail)."""

    inputs = ("order",)

    quote = step(Quote, order=from_input("order"))
    reserve = step(Reserve, order=from_input("order"), quote=from_result("quote"))
    charge = step(Charge, order=from_input("order"), reservation=from_result("reserve"))
    email = step(Email, order=from_input("order"), charge=from_result("charge"))


class BackgroundPayOrder(PayOrder):
    background = True


# ---- a parked parallel map -----------------------------------------------------------------


class Ship(Step):
    """One element of a parallel map: writes its start, then (elements 0 and 1 only)
    waits for the test's go, so the others queue behind them on a worker of concurrency 2."""

    inputs = ("order", "item")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        order = args["order"]
        write(order, f"enter:ship:{args['item']}")
        if args["item"] < 2:
            wait_for_go(order)
        write(order, f"do:ship:{args['item']}")
        return Success(args["item"])

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        write(args["order"], f"undo:ship:{args['item']}")


class ShipAll(Reactor):
    background = True
    inputs = ("order", "items")

    ship = map_step(
        Ship, over=from_input("items"), parallel=True, order=from_input("order"), item=element()
    )


class ShipEach(Reactor):
    """Three ``async_step`` children: 0 and 1 wait for the test's go (both worker slots busy),
    2 queues behind them; the parent parks awaiting them."""

    background = True
    inputs = ("order",)

    first = async_step(Ship, order=from_input("order"), item=value(0))
    second = async_step(Ship, order=from_input("order"), item=value(1))
    third = async_step(Ship, order=from_input("order"), item=value(2))
