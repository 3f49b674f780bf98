"""Reactors of ``test_worker_coordination.py``, importable by the worker processes.

Bodies record into Redis lists under the current key prefix (``tests.worker.reactors.timed``):
enter/exit times, the pid, and what the coordination state said from inside the body.
"""

from __future__ import annotations

from typing import Any

from reactor_app import Reactor, Retries, Step, Success, from_input, step, with_lock
from reactor_app.testing import coordination_state
from tests.worker.reactors import timed


def background_key(values: dict[str, Any]) -> str:
    return f"bg:{values['key']}"


# --------------------------------------------------------------------------------------------
# background = True: the whole run is handed to a worker, which takes the coordination


class FreeStep(Step):
    """Declares nothing: runs concurrently across worker processes."""

    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        timed("bg_free", context, 0.25)
        return Success("free")


@with_lock(background_key, ttl=30)
class BackgroundLockedStep(Step):
    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        state = coordination_state().lock(background_key(args))
        timed(
            "bg_locked",
            context,
            0.1,
            owner=state.owner,
            step=state.step,
            token=context.fencing_token(),
        )
        return Success("locked")


class BackgroundLockedReactor(Reactor):
    """``background = True`` with a step-level lock after an unlocked step."""

    inputs = ("key",)
    background = True

    free = step(FreeStep, key=from_input("key"))
    locked = step(BackgroundLockedStep, key=from_input("key"))


class RunSpanStep(Step):
    """One of the two steps of an exclusive run; records who holds the reactor's key."""

    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        state = coordination_state().lock(f"bg-run:{args['key']}")
        timed("bg_run", context, 0.1, owner=state.owner, step=state.step)
        return Success("ok")


@with_lock(lambda inputs: f"bg-run:{inputs['key']}", ttl=30)
class BackgroundExclusiveReactor(Reactor):
    """``background = True`` with a reactor-level lock: whole runs are exclusive per key."""

    inputs = ("key",)
    background = True

    first = step(RunSpanStep, key=from_input("key"))
    second = step(RunSpanStep, key=from_input("key"))


# --------------------------------------------------------------------------------------------
# a failure retry on a worker: the step's lock is free between attempts


def gap_key(args: dict[str, Any]) -> str:
    return f"gap:{args['key']}"


@with_lock(gap_key, ttl=30)
class GapFlakyStep(Step):
    inputs = ("key",)
    retries = Retries(max_attempts=2, backoff="fixed", base_delay=2.0)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        timed("gap_attempt", context, 0.05, attempt=context.attempt, token=context.fencing_token())
        if context.attempt == 1:
            raise RuntimeError("the first attempt fails")
        return Success("charged")


class GapFlakyReactor(Reactor):
    inputs = ("key",)

    charge = step(GapFlakyStep, key=from_input("key"))


@with_lock(gap_key, ttl=30)
class GapContenderStep(Step):
    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        timed("gap_contender", context, 0.05, token=context.fencing_token())
        return Success("contender")


class GapContenderReactor(Reactor):
    inputs = ("key",)

    charge = step(GapContenderStep, key=from_input("key"))
