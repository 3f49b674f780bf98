"""Celery's soft time limit in the caller's process: an error like any other.

A worker delivery is sliced by its task's time limit (``engine.time_slice``,
tests/worker/test_time_limits.py). ``Reactor.run()`` called inside a Celery task of the
caller's own is not: nothing resumes a run left where it stopped, so ``SoftTimeLimitExceeded``
raised by a body fails that step — the completed steps undone, the row ended ``failed`` — and
the engine's own stop for lack of time never escapes to the caller.
"""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app import Reactor, Step, Success, from_input, step, value
from reactor_app.engine.time_slice import SoftTimeLimitExceeded
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus

pytestmark = pytest.mark.django_db(transaction=True)

_effects: list[str] = []


class Effect(Step):
    inputs = ("name", "cut_at")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        if args["cut_at"] == args["name"]:
            raise SoftTimeLimitExceeded()
        _effects.append(f"do:{args['name']}")
        return Success(args["name"])

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        _effects.append(f"undo:{result}")


class ThreeEffects(Reactor):
    inputs = ("cut_at",)

    first = step(Effect, name=value("first"), cut_at=from_input("cut_at"))
    second = step(Effect, name=value("second"), cut_at=from_input("cut_at"))
    third = step(Effect, name=value("third"), cut_at=from_input("cut_at"))


@pytest.mark.parametrize("cut_at", ["first", "second", "third"])
def test_a_body_cut_off_by_a_soft_time_limit_in_process_fails_its_step(cut_at: str) -> None:
    _effects.clear()
    result = ThreeEffects.run(cut_at=cut_at)
    assert not result.ok
    assert "SoftTimeLimitExceeded" in str(result.error), result.error
    names = ["first", "second", "third"]
    done = names[: names.index(cut_at)]
    assert _effects == [f"do:{n}" for n in done] + [f"undo:{n}" for n in reversed(done)]
    row = Execution.objects.get(pk=result.execution_id)
    assert row.status == ExecutionStatus.FAILED, row.status
