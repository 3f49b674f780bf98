"""Debounced reactors run by the worker tests (``with_debounce``), importable by the workers,
and ``starts_at_once``, the burst of simultaneous starts the tests make of them."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import close_old_connections

from reactor_app import Reactor, Step, Success, from_input, step, with_debounce
from reactor_app.models import Execution
from tests.worker.reactors import record


class RecordRun(Step):
    inputs = ("account_id", "version")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record(
            "debounced",
            account_id=args["account_id"],
            version=args["version"],
            execution=context.execution_id,
            pid=os.getpid(),
            at=time.time_ns(),
        )
        return Success({"account_id": args["account_id"], "version": args["version"]})


@with_debounce(lambda args: f"recompute:{args['account_id']}", seconds=1.0)
class Recompute(Reactor):
    inputs = ("account_id", "version")

    recompute = step(RecordRun, account_id=from_input("account_id"), version=from_input("version"))
    returns = "recompute"


@with_debounce(lambda args: f"capped:{args['account_id']}", seconds=1.0, max_wait=1.0)
class CappedRecompute(Reactor):
    inputs = ("account_id", "version")

    recompute = step(RecordRun, account_id=from_input("account_id"), version=from_input("version"))
    returns = "recompute"


class PlainRecompute(Reactor):
    """Not debounced by declaration: ``run_async(debounce=...)`` debounces one call."""

    inputs = ("account_id", "version")

    recompute = step(RecordRun, account_id=from_input("account_id"), version=from_input("version"))
    returns = "recompute"


@with_debounce(lambda args: f"recompute:{args['account']}", seconds=1.0)
class KeyedOnMissingInput(Reactor):
    """A key function with a misspelt input name: the start fails at the call."""

    inputs = ("account_id", "version")

    recompute = step(RecordRun, account_id=from_input("account_id"), version=from_input("version"))


def starts_at_once(
    burst: str, seconds: float, *, count: int = 6, prepare: Callable[[], None] | None = None
) -> list[Execution]:
    """``count`` ``PlainRecompute.run_async`` calls of one burst (versions 0 to count - 1) from
    as many threads released together, each settling on its own commit as from separate web
    processes; ``prepare`` runs first in each thread (on its own database connection)."""
    started: list[Execution] = []
    barrier = threading.Barrier(count)

    def start(version: int) -> None:
        try:
            if prepare is not None:
                prepare()
            barrier.wait()
            started.append(
                PlainRecompute.run_async(account_id=5, version=version, debounce=(burst, seconds))
            )
        finally:
            close_old_connections()

    threads = [threading.Thread(target=start, args=(version,)) for version in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(started) == count
    return started
