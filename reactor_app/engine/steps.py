"""One step of the plan, by its kind (3b-3d of the executor's main loop), and a step run alone.

``run_spec``: ``where`` (false → skipped), arguments resolved, then by kind — an interrupt
(``engine.interrupts``), a map (``engine.mapping``), an async child or a composed one
(``engine.children``), or a plain step through ``run_unit`` (the runner: retries, step gate,
compensation; a park counted against the contention ceiling). ``execute_async_step`` is the
body of an ``async_step`` task: one unit, its holds owned by the child execution.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.utils import timezone

from reactor_app.dsl.kinds import (
    AsyncReactorSpec,
    AsyncStepSpec,
    ComposeSpec,
    InterruptSpec,
    MapSpec,
)
from reactor_app.dsl.step import StepSpec
from reactor_app.engine.cancelled import end_cancelled
from reactor_app.engine.children import dispatch_child, run_child
from reactor_app.engine.gate import ParkRequested
from reactor_app.engine.hand_off_guard import guard_dispatcher_keys
from reactor_app.engine.inputs import check_kept_arguments
from reactor_app.engine.interrupts import run_interrupt
from reactor_app.engine.mapping import run_map
from reactor_app.engine.outcomes import PassEnd, RunEnd, UnitStatus
from reactor_app.engine.runner import (
    StepOutcome,
    UnitRunner,
    evaluate_where,
    resolve_arguments,
    validate_arguments,
)
from reactor_app.engine.settling import compensate_pending
from reactor_app.engine.time_slice import stops_delivery
from reactor_app.engine.worker import note_park
from reactor_app.exceptions import (
    ArgumentResolutionError,
    CoordinationError,
    InputValidationError,
    StepFailed,
)
from reactor_app.status import EngineEvent, ExecutionStatus, StepRunKind
from reactor_app.tracking import StepRecorder, emit_engine

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun


def run_spec(run: ExecutionRun, spec: StepSpec) -> StepOutcome:
    try:
        if not evaluate_where(spec, run.inputs, run.state.results):
            StepRecorder(run.execution, spec.name, StepRunKind.RUN, 1).finished(
                EngineEvent.STEP_SKIPPED, reason="where"
            )
            return StepOutcome(UnitStatus.SKIPPED, reason="where")
    except Exception as exc:
        if stops_delivery(run.root.time_slice, exc):
            # the task's soft limit, not the predicate's failure: the delivery ends as a
            # killed one would, and the next one evaluates it again (engine.time_slice)
            raise
        return StepOutcome(
            UnitStatus.FAILED,
            error=StepFailed(
                f"where= of step {spec.name!r} of {run.reactor_path} raised "
                f"{type(exc).__name__}: {exc}",
                reactor=run.reactor_path,
                step=spec.name,
                cause=exc,
            ),
        )
    if isinstance(spec, InterruptSpec):
        return run_interrupt(run, spec)
    if isinstance(spec, MapSpec):
        return run_map(run, spec)
    try:
        args = resolve_arguments(spec, run.scope(), run.reactor_path)
    except ArgumentResolutionError as error:
        return StepOutcome(UnitStatus.FAILED, error=error)
    if isinstance(spec, (AsyncStepSpec, AsyncReactorSpec)):
        return dispatch_child(run, spec, args)
    if isinstance(spec, ComposeSpec):
        if not spec.arguments:
            # No arguments: the child receives the reactor inputs it declares.
            args = {name: args[name] for name in spec.target.inputs if name in args}
        return run_child(run, spec.target, args, label=spec.name)
    step_class = spec.step_class()
    assert step_class is not None
    return run_unit(run, spec, step_class, args, spec.name)


def run_unit(
    run: ExecutionRun, spec: StepSpec, step_class: Any, args: dict[str, Any], label: str
) -> StepOutcome:
    try:
        validate_arguments(step_class, args, run.reactor_path, label)
        _check_kept_arguments(step_class, args, run.reactor_path, label)
    except InputValidationError as error:
        return StepOutcome(UnitStatus.FAILED, error=error)
    try:
        # keys known only now (from results, per element) may be held by the execution
        # that handed this one off: waiting for them would wait for ourselves
        guard_dispatcher_keys(run, spec, args, label)
    except CoordinationError as refused:
        StepRecorder(run.execution, label, StepRunKind.RUN, 1).finished(
            EngineEvent.STEP_FAILED, error=refused.as_dict(), body_started=False
        )
        return StepOutcome(UnitStatus.FAILED, error=refused)
    runner = UnitRunner(
        run,
        step_class,
        spec,
        args,
        label=label,
        owner=run.owner,
        held_keys=run.held_keys,
        position_slot=label,
    )
    outcome = runner.execute(park=run.park_on_contention)
    if outcome.status == UnitStatus.PARKED and outcome.retry_in is not None:
        # a failure retry's backoff or a coordination outage: a requeue, not contention
        run.root.requeue_in = outcome.retry_in
        return outcome
    if outcome.status == UnitStatus.PARKED and outcome.park is not None:
        ceiling = note_park(run, label, outcome.park)
        if ceiling is not None:
            outcome.park.gate.abandon_position()  # the line must not wait for this one
            StepRecorder(run.execution, label, StepRunKind.RUN, 1).finished(
                EngineEvent.STEP_FAILED, error=ceiling.as_dict(), body_started=False
            )
            return StepOutcome(UnitStatus.FAILED, error=ceiling)
        _record_park(run, label, outcome.park)
    return outcome


def _record_park(run: ExecutionRun, label: str, park: ParkRequested | None) -> None:
    StepRecorder(run.execution, label, StepRunKind.RUN, 1).parked(
        primitive=park.refused.claim.primitive if park else None,
        key=park.refused.claim.key if park else None,
    )


def execute_async_step(run: ExecutionRun) -> RunEnd:
    """The body of an ``async_step`` task: one unit, holds owned by this execution's id.

    Also one element of a parallel ``map_step`` (``engine.mapping``): the marker then names
    the element's label (``<step>[<index>]``) and the execution's inputs are its arguments.
    """
    marker = run.state.origin.dispatch
    assert marker is not None  # a child delivery (engine.children.start_worker_child)
    name = marker["step"]
    label = marker.get("label") or name
    spec = run.reactor.steps[name]
    step_class = spec.step_class()
    assert step_class is not None
    cancel = run.cancel_requested()
    if cancel is not None:
        # its tree was cancelled before this child started (or between two of its passes):
        # it never starts its body; what it kept across a park is let go
        return end_cancelled(run, cancel, gate_held=False)
    resuming = run.execution.started_at is not None
    run.persist(
        status=ExecutionStatus.RUNNING,
        started_at=run.execution.started_at or timezone.now(),
        current_step=label,
    )
    emit_engine(
        EngineEvent.EXECUTION_RESUMED if resuming else EngineEvent.EXECUTION_STARTED,
        run.execution,
    )
    outcome = run_unit(run, spec, step_class, dict(run.inputs), label)
    if outcome.status in (UnitStatus.COMPLETED, UnitStatus.SKIPPED):
        run.state.ending.skipped = outcome.status == UnitStatus.SKIPPED
        if outcome.record is not None:
            run.state.ending.completed_at = outcome.record.at
        return RunEnd(PassEnd.SUCCEEDED, value=outcome.value)
    if outcome.status == UnitStatus.HALTED:
        return RunEnd(PassEnd.HALTED, reason=outcome.reason)
    if outcome.status == UnitStatus.PARKED:
        return RunEnd(PassEnd.PARKED, park=outcome.park)
    # the unit's last attempt failed while a retry was due (a cancel came first, or the
    # retry was refused): compensated here, as a composed run's rollback would
    failures = list(outcome.rollback_failures) + compensate_pending(run)
    if run.stopped_by_cancel(outcome.error):
        return RunEnd(PassEnd.CANCELLED, error=outcome.error, rollback_failures=failures)
    return RunEnd(PassEnd.FAILED, error=outcome.error, rollback_failures=failures)


def _check_kept_arguments(
    step_class: Any, args: dict[str, Any], reactor_path: str, label: str
) -> None:
    """``InputNotSerializable`` before the body runs when the step's arguments could not come
    back as the same values, and the step has an undo or a compensate hook, which receives
    them from the rollback log — read back from the row in a later pass (after a park, an
    interrupt, a redelivery). There a value the codec cannot hold was only its ``repr``: the
    undo of a step given ``value({"a"})`` received the text ``"{'a'}"``. Checked in every
    mode, as results are (``runner.storable``), so a workflow behaves the same in both; a step
    without hooks keeps no arguments and takes any."""
    if step_class.has_undo() or step_class.has_compensate():
        check_kept_arguments(args, reactor_path, label, kept_for="for its undo or compensation")
