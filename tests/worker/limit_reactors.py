"""Reactors of the live-limit worker tests (tests/worker/test_worker_live_limits.py), importable by
the worker processes: one step inside a semaphore of the named limit ``live_pool``."""

from __future__ import annotations

from typing import Any

from reactor_app import Reactor, Step, Success, from_input, step, with_semaphore
from tests.worker.reactors import timed


@with_semaphore(lambda args: "live-pool", limit="live_pool")
class PooledStep(Step):
    inputs = ("hold",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        timed("pooled", context, float(args["hold"]))
        return Success("done")


class PooledReactor(Reactor):
    inputs = ("hold",)

    work = step(PooledStep, hold=from_input("hold"))
