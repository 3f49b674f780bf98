"""Reactors of the Celery time-limit tests (tests/worker/test_time_limits.py), importable by
workers.

``Paced``: six steps, ``s0`` … ``s5``; step ``sN`` sleeps ``durations[N]`` seconds and writes
``enter:sN`` when its body starts and ``do:sN`` when it completes, to the order's ledger (a
Redis list the test owns, ``promise_reactors.ledger``). Its undo sleeps ``undo_seconds``, then
writes ``undo:sN``. The step named by ``fail_at`` returns a ``Failure`` after its sleep.
``PacedComposed``: ``a0`` (0.4 s), a composed ``PacedChild`` of four 0.4 s steps ``c0`` …
``c3``, then ``a1``, which fails when ``fail`` is true; each writes like ``Paced``.
``RetriedAtOnce``: one step with two attempts and no backoff, whose first attempt outlasts the
whole limit and whose second takes 0.1 s.
``PacedMap``: one in-process ``map_step`` whose element ``i`` sleeps ``durations[i]`` and writes
``do:i`` (its undo ``undo:i``), then a last step that fails when ``fail`` is true.
"""

from __future__ import annotations

import time
from typing import Any

from reactor_app import (
    Failure,
    Reactor,
    Retries,
    Step,
    Success,
    compose,
    element,
    from_input,
    map_step,
    step,
    value,
)
from tests.worker.promise_reactors import write

STEPS = 6


class Paced(Step):
    inputs = ("order", "index", "durations", "undo_seconds", "fail_at")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        name = f"s{args['index']}"
        write(args["order"], f"enter:{name}")
        time.sleep(args["durations"][args["index"]])
        if args["fail_at"] == name:
            return Failure(f"{name} fails", retryable=False)
        write(args["order"], f"do:{name}")
        return Success(name)

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        time.sleep(args["undo_seconds"])
        write(args["order"], f"undo:{result}")


def _paced(index: int) -> Any:
    return step(
        Paced,
        order=from_input("order"),
        index=value(index),
        durations=from_input("durations"),
        undo_seconds=from_input("undo_seconds"),
        fail_at=from_input("fail_at"),
    )


class PacedReactor(Reactor):
    inputs = ("order", "durations", "undo_seconds", "fail_at")

    s0 = _paced(0)
    s1 = _paced(1)
    s2 = _paced(2)
    s3 = _paced(3)
    s4 = _paced(4)
    s5 = _paced(5)


class PacedElement(Step):
    inputs = ("order", "index", "seconds")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        time.sleep(args["seconds"])
        write(args["order"], f"do:{args['index']}")
        return Success(args["index"])

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        write(args["order"], f"undo:{result}")


class Fails(Step):
    inputs = ("fail",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Failure("the last step fails", retryable=False) if args["fail"] else Success(None)


class PacedMapReactor(Reactor):
    inputs = ("order", "elements", "fail")

    each = map_step(
        PacedElement,
        over=from_input("elements"),
        order=from_input("order"),
        index=element("index"),
        seconds=element("seconds"),
    )
    last = step(Fails, fail=from_input("fail"))


class Named(Step):
    inputs = ("order", "name", "seconds", "fail")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        write(args["order"], f"enter:{args['name']}")
        time.sleep(args["seconds"])
        if args["fail"]:
            return Failure(f"{args['name']} fails", retryable=False)
        write(args["order"], f"do:{args['name']}")
        return Success(args["name"])

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        write(args["order"], f"undo:{result}")


def _named(name: str, seconds: float, fail: Any = None) -> Any:
    return step(
        Named,
        order=from_input("order"),
        name=value(name),
        seconds=value(seconds),
        fail=fail if fail is not None else value(False),
    )


class PacedChild(Reactor):
    inputs = ("order",)

    c0 = _named("c0", 0.4)
    c1 = _named("c1", 0.4)
    c2 = _named("c2", 0.4)
    c3 = _named("c3", 0.4)


class PacedComposed(Reactor):
    inputs = ("order", "fail")

    a0 = _named("a0", 0.4)
    inner = compose(PacedChild, order=from_input("order"))
    a1 = _named("a1", 0.1, fail=from_input("fail"))


class SlowFirstAttempt(Step):
    inputs = ("order",)
    retries = Retries(max_attempts=2, backoff="fixed", base_delay=0)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        write(args["order"], f"enter:{context.attempt}")
        time.sleep(3.0 if context.attempt == 1 else 0.1)
        write(args["order"], f"do:{context.attempt}")
        return Success(context.attempt)


class RetriedAtOnce(Reactor):
    inputs = ("order",)

    only = step(SlowFirstAttempt, order=from_input("order"))
