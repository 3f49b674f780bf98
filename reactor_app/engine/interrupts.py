"""Interrupts, the executor's half: an ``interrupt(...)`` step of a running execution.

The step's result is the payload ``Reactor.resume(...)`` supplied (``engine.dispatch`` stores
it under the row lock). Without one the step records the pause — its correlation id and
deadline in ``state.interrupts`` — and the execution ends the pass ``interrupted``
(holds released, re-taken on resume). A timed-out interrupt (marked by the sweeper) fails the
step, so the execution rolls back. A composed child cannot pause the execution it belongs to.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from django.utils import timezone

from reactor_app.dsl.kinds import InterruptSpec
from reactor_app.engine.outcomes import UnitStatus
from reactor_app.engine.runner import StepOutcome
from reactor_app.exceptions import StepFailed
from reactor_app.models import Execution
from reactor_app.status import EngineEvent, StepRunKind
from reactor_app.storable import text_problem
from reactor_app.tracking import StepRecorder

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun


def run_interrupt(run: ExecutionRun, spec: InterruptSpec) -> StepOutcome:
    """The resume payload is the step's result; without one the execution pauses here."""
    entries = run.state.reached_interrupts()
    entry = entries.get(spec.name)
    recorder = StepRecorder(run.execution, spec.name, StepRunKind.RUN, 1)
    if run.parent is not None:
        return StepOutcome(
            UnitStatus.FAILED,
            error=StepFailed(
                f"interrupt {spec.name!r} of {run.reactor_path} is inside a composed reactor, "
                "which cannot pause the execution it belongs to: run the child with "
                "async_reactor(...) (its own execution, resumable by id) or move the interrupt "
                "to the outer reactor",
                reactor=run.reactor_path,
                step=spec.name,
            ),
        )
    if entry and "payload" in entry:
        recorder.finished(EngineEvent.STEP_SUCCEEDED, resumed=True)
        return StepOutcome(UnitStatus.COMPLETED, value=entry["payload"])
    if entry and entry.get("timed_out"):
        error = StepFailed(
            f"interrupt {spec.name!r} of {run.reactor_path} was not resumed within {spec.timeout}s",
            reactor=run.reactor_path,
            step=spec.name,
        )
        recorder.finished(EngineEvent.STEP_FAILED, error=error.as_dict())
        return StepOutcome(UnitStatus.FAILED, error=error)
    try:
        correlation_id = spec.compute_correlation_id(run.inputs)
    except Exception as exc:
        return StepOutcome(
            UnitStatus.FAILED,
            error=StepFailed(
                f"the correlation_id function of interrupt {spec.name!r} of "
                f"{run.reactor_path} "
                f"raised {type(exc).__name__}: {exc}",
                reactor=run.reactor_path,
                step=spec.name,
                cause=exc,
            ),
        )
    problem = _correlation_problem(correlation_id)
    if problem is not None:
        # the row's column holds it: refused before the pause, not by the database at it
        return StepOutcome(
            UnitStatus.FAILED,
            error=StepFailed(
                f"the correlation_id function of interrupt {spec.name!r} of "
                f"{run.reactor_path} returned an id that {problem}",
                reactor=run.reactor_path,
                step=spec.name,
            ),
        )
    now = timezone.now()
    entries[spec.name] = {
        "since": now.isoformat(),
        "correlation_id": correlation_id,
        "deadline": (now + timedelta(seconds=spec.timeout)).isoformat() if spec.timeout else None,
    }
    run.execution.correlation_id = correlation_id
    return StepOutcome(UnitStatus.INTERRUPTED, reason=spec.name)


def _correlation_problem(correlation_id: str) -> str | None:
    """Why ``Execution.correlation_id`` cannot hold ``correlation_id``, or None. Before, the
    pause's write failed with a database error (``DataError``) out of ``Reactor.run``."""
    problem = text_problem(correlation_id)
    if problem is not None:
        return f"has {problem}, which the database cannot store"
    longest = Execution._meta.get_field("correlation_id").max_length or len(correlation_id)
    if len(correlation_id) > longest:
        return f"is {len(correlation_id)} characters long, more than the {longest} stored"
    return None
