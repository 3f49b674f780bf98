"""Debounced reactors run by the worker tests (``with_debounce``), importable by the workers."""

from __future__ import annotations

import os
import time
from typing import Any

from reactor_app import Reactor, Step, Success, from_input, step, with_debounce
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
