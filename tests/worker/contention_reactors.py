"""Reactors for the ``on_contention`` tests, importable by the worker processes.

One key per test (``args["key"]``). ``Holding`` takes the key with a queueing lock and keeps it
until the test pushes ``release:<key>`` (or its execution is cancelled: the body checkpoints);
the others meet it with each strategy. Bodies and undos record into Redis lists (``record``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from reactor_app import Reactor, Step, Success, from_input, step, with_lock, with_semaphore
from reactor_app.coordination.redis import get_client
from tests.worker.reactors import record, trace_key


def lock_key(args: dict[str, Any]) -> str:
    return f"strategy:{args['key']}"


class Audit(Step):
    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record("audit", key=args["key"], execution=context.execution_id)
        return Success("audited")

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        record("audit-undo", key=args["key"], execution=context.execution_id)


@with_lock(lock_key, ttl=30)
class Hold(Step):
    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        start = time.time_ns()
        record("hold-enter", key=args["key"], execution=context.execution_id, at=start)
        client = get_client()
        try:
            for _ in range(600):  # at most 60 s
                context.checkpoint()  # a cancel stops the body here
                if client.lpop(trace_key(f"release:{args['key']}")):
                    break
                time.sleep(0.1)
        finally:
            record(
                "hold",
                key=args["key"],
                execution=context.execution_id,
                start=start,
                end=time.time_ns(),
                pid=os.getpid(),
            )
        return Success("held")


class Holding(Reactor):
    inputs = ("key",)

    audit = step(Audit, key=from_input("key"))
    hold = step(Hold, key=from_input("key"))


def _body(name: str) -> type[Step]:
    class Body(Step):
        inputs = ("key",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            start = time.time_ns()
            time.sleep(0.05)
            record(
                name,
                key=args["key"],
                execution=context.execution_id,
                start=start,
                end=time.time_ns(),
            )
            return Success(name)

    Body.__name__ = Body.__qualname__ = f"{name.title().replace('-', '')}Body"
    return Body


SkipBody = with_lock(lock_key, ttl=30, on_contention="skip")(_body("skip-body"))
NewestBody = with_lock(lock_key, ttl=30, on_contention="cancel_newest")(_body("newest-body"))
ReplacingBody = with_lock(lock_key, ttl=30, on_contention="cancel_in_progress")(
    _body("replacing-body")
)
After = _body("after")


class SkipNewcomer(Reactor):
    inputs = ("key",)

    audit = step(Audit, key=from_input("key"))
    body = step(SkipBody, key=from_input("key"))
    after = step(After, key=from_input("key"))


class CancelNewest(Reactor):
    inputs = ("key",)

    audit = step(Audit, key=from_input("key"))
    body = step(NewestBody, key=from_input("key"))
    after = step(After, key=from_input("key"))


class CancelInProgress(Reactor):
    inputs = ("key",)

    body = step(ReplacingBody, key=from_input("key"))


@with_semaphore(lambda args: f"strategy-slots:{args['key']}", limit=1, on_contention="skip")
class SlotBody(Step):
    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record("slot-body", key=args["key"])
        return Success("slot")
