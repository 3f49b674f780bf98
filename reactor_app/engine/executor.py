"""The executor: runs a reactor's plan for one execution.

Main loop of ``ExecutionRun.execute`` (one execution; a composed child runs the same loop with
the root's owner and held-key registry)::

    1. Mark the execution running (or resuming) and emit ``execution_started``.
    2. Enter the reactor-level gate with the reactor's inputs: the ordered-lock position is
       assigned now; a marked period bucket or a failed strict chain halts the run (nothing
       runs); contention waits then fails (synchronous) or parks (worker).
    3. For each step of the plan from the checkpoint ``state.next_index``:
         a. ``where`` false → record the step skipped, move on (no arguments, no holds).
         b. resolve and validate arguments (failure → step failed, nothing held).
         c. run it by kind: a step through the runner (retries, step gate, compensation),
            ``compose`` as a child execution of this loop, ``map_step`` once per element.
         d. completed → store the result, append to the rollback log, checkpoint.
            skipped   → store the value (never undone), checkpoint.
            halted    → stop cleanly: no rollback.
            parked    → persist, give back the step's holds (keep ordered positions), return.
            failed    → undo the rollback log newest first, collect rollback failures, fail.
    4. The value is the ``returns`` step's result, else a dict of every result.
    5. In ``finally``: release the reactor-level gate (outcome decides period mark / cursor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from reactor_app.dsl.arguments import PathError, Scope
from reactor_app.dsl.kinds import ComposeSpec, MapSpec
from reactor_app.dsl.step import StepSpec
from reactor_app.engine.context import CompletedStep, ExecutionState, HeldKeys, to_json
from reactor_app.engine.gate import Gate, GateScope, ParkRequested, Skip
from reactor_app.engine.result import Result
from reactor_app.engine.rollback import roll_back, undo_record
from reactor_app.engine.runner import (
    StepOutcome,
    UnitRunner,
    evaluate_where,
    resolve_arguments,
    validate_arguments,
)
from reactor_app.exceptions import (
    ArgumentResolutionError,
    CoordinationError,
    InputValidationError,
    ReactorError,
    StepFailed,
)
from reactor_app.models import Execution
from reactor_app.status import EngineEvent, ExecutionStatus, StepRunKind
from reactor_app.tracking import StepRecorder, emit_engine

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor


@dataclass
class RunEnd:
    """How one pass of the main loop ended."""

    status: str
    value: Any = None
    error: ReactorError | None = None
    reason: str | None = None
    park: ParkRequested | None = None
    rollback_failures: list[dict[str, Any]] = field(default_factory=list)


class ExecutionRun:
    """The in-memory side of one execution while the engine works on it."""

    def __init__(
        self,
        reactor: type[Reactor],
        execution: Execution,
        inputs: dict[str, Any],
        *,
        parent: ExecutionRun | None = None,
        mode: str = "sync",
    ) -> None:
        self.reactor = reactor
        self.execution = execution
        self.inputs = inputs
        self.parent = parent
        self.root: ExecutionRun = parent.root if parent else self
        self.held_keys: HeldKeys = parent.held_keys if parent else HeldKeys()
        self.state = ExecutionState.from_json(execution.context)
        self.mode = mode
        self.instance = reactor()
        self.gates: list[Gate] = list(parent.gates) if parent else []
        self.children: dict[str, ExecutionRun] = {}

    # -- identities -----------------------------------------------------------------------

    @property
    def execution_id(self) -> str:
        return str(self.execution.id)

    @property
    def owner(self) -> str:
        """Holds are owned by the root execution: the basis of re-entrancy."""
        return self.root.execution_id

    @property
    def reactor_path(self) -> str:
        return self.reactor.path()

    @property
    def park_on_contention(self) -> bool:
        return self.mode == "worker"

    # -- persistence ----------------------------------------------------------------------

    def persist(self, **fields: Any) -> None:
        self.execution.context = self.state.to_json()
        self.execution.heartbeat_at = timezone.now()
        for name, value in fields.items():
            setattr(self.execution, name, value)
        self.execution.save(
            update_fields=["context", "heartbeat_at", "updated_at", *fields.keys()]
        )

    def child_run(self, execution_id: str) -> ExecutionRun | None:
        if execution_id in self.children:
            return self.children[execution_id]
        from reactor_app.dsl.registry import lookup

        try:
            execution = Execution.objects.get(pk=execution_id)
        except Execution.DoesNotExist:
            return None
        child = ExecutionRun(
            lookup(execution.reactor), execution, execution.inputs, parent=self, mode=self.mode
        )
        self.children[execution_id] = child
        return child

    # -- the main loop --------------------------------------------------------------------

    def execute(self) -> RunEnd:
        resuming = self.execution.status in (ExecutionStatus.PARKED, ExecutionStatus.INTERRUPTED)
        now = timezone.now()
        self.persist(status=ExecutionStatus.RUNNING, started_at=self.execution.started_at or now)
        emit_engine(
            EngineEvent.EXECUTION_RESUMED if resuming else EngineEvent.EXECUTION_STARTED,
            self.execution,
        )
        gate: Gate | None = None
        end: RunEnd | None = None
        try:
            gate, end = self._enter_reactor_gate()
            if end is None:
                end = self._run_steps()
            return end
        finally:
            if gate is not None:
                gate.exit(_release_outcome(end))
                self.gates.remove(gate)

    def _enter_reactor_gate(self) -> tuple[Gate | None, RunEnd | None]:
        declarations = self.reactor.declarations()
        if not declarations:
            return None, None
        gate = Gate(
            declarations.ordered(),
            self.inputs,
            GateScope(
                reactor=self.reactor_path,
                step=None,
                owner=self.owner,
                execution_id=self.execution_id,
                held_keys=self.held_keys,
                positions=self.state.ordered,
                position_slot="",
            ),
        )
        try:
            skip = gate.enter(wait=declarations.wait_seconds(), park=self.park_on_contention)
        except ParkRequested as parked:
            return None, RunEnd("parked", park=parked)
        except CoordinationError as error:
            return None, RunEnd("failed", error=error)
        if isinstance(skip, Skip):
            return None, RunEnd("halted", reason=skip.reason)
        self.gates.append(gate)
        return gate, None

    def _run_steps(self) -> RunEnd:
        plan = self.reactor.plan
        while self.state.next_index < len(plan.order):
            name = plan.order[self.state.next_index]
            spec = plan.specs[name]
            self.execution.current_step = name
            outcome = self._run_spec(spec)
            if outcome.status in ("completed", "skipped"):
                self.state.results[name] = outcome.value
                if outcome.record is not None:
                    self.state.completed.append(outcome.record)
                self.state.next_index += 1
                self.persist(current_step=name)
                continue
            if outcome.status == "halted":
                return RunEnd("halted", reason=outcome.reason)
            if outcome.status == "parked":
                return RunEnd("parked", park=outcome.park)
            failures = list(outcome.rollback_failures)
            failures.extend(roll_back(self))
            return RunEnd("failed", error=outcome.error, rollback_failures=failures)
        return RunEnd("succeeded", value=self._value())

    def _value(self) -> Any:
        if self.reactor.returns is not None:
            return self.state.results.get(self.reactor.returns)
        return dict(self.state.results)

    def _scope(self, element: Any = None, with_element: bool = False) -> Scope:
        if with_element:
            return Scope(self.inputs, self.state.results, element)
        return Scope(self.inputs, self.state.results)

    def _run_spec(self, spec: StepSpec) -> StepOutcome:
        try:
            if not evaluate_where(spec, self.inputs, self.state.results):
                StepRecorder(self.execution, spec.name, StepRunKind.RUN, 1).finished(
                    EngineEvent.STEP_SKIPPED, reason="where"
                )
                return StepOutcome("skipped", reason="where")
        except Exception as exc:
            return StepOutcome("failed", error=StepFailed(
                f"where= of step {spec.name!r} of {self.reactor_path} raised "
                f"{type(exc).__name__}: {exc}",
                reactor=self.reactor_path, step=spec.name, cause=exc,
            ))
        if isinstance(spec, MapSpec):
            return self._run_map(spec)
        try:
            args = resolve_arguments(spec, self._scope(), self.reactor_path)
        except ArgumentResolutionError as error:
            return StepOutcome("failed", error=error)
        if isinstance(spec, ComposeSpec):
            return self._run_child(spec.target, args, label=spec.name)
        step_class = spec.step_class()
        assert step_class is not None
        return self._run_unit(spec, step_class, args, spec.name)

    def _run_unit(self, spec: StepSpec, step_class: Any, args: dict[str, Any], label: str) -> StepOutcome:
        try:
            validate_arguments(step_class, args, self.reactor_path, label)
        except InputValidationError as error:
            return StepOutcome("failed", error=error)
        runner = UnitRunner(
            self,
            step_class,
            spec,
            args,
            label=label,
            owner=self.owner,
            held_keys=self.held_keys,
            position_slot=label,
        )
        outcome = runner.execute(park=self.park_on_contention)
        if outcome.status == "parked":
            self._record_park(label, outcome.park)
        return outcome

    def _record_park(self, label: str, park: ParkRequested | None) -> None:
        StepRecorder(self.execution, label, StepRunKind.RUN, 1).parked(
            primitive=park.refused.claim.primitive if park else None,
            key=park.refused.claim.key if park else None,
        )

    def _run_child(self, reactor: type[Reactor], inputs: dict[str, Any], *, label: str) -> StepOutcome:
        known = self.state.extra.setdefault("children", {})
        child: ExecutionRun | None = None
        if label in known:
            child = self.child_run(known[label])
        if child is None:
            error = input_errors(reactor, inputs)
            if error is not None:
                return StepOutcome("failed", error=error)
            execution = Execution.objects.start(
                reactor=reactor.path(),
                inputs=to_json(inputs),
                parent=self.execution,
                root_id=self.root.execution.id,
                status=ExecutionStatus.PENDING,
            )
            child = ExecutionRun(reactor, execution, inputs, parent=self, mode=self.mode)
            self.children[child.execution_id] = child
            known[label] = child.execution_id
        end = child.execute()
        child.finish(end)
        if end.status == "succeeded":
            known.pop(label, None)
            record = CompletedStep(
                step=label, kind="compose", args=to_json(inputs), result=end.value,
                child_execution=child.execution_id,
            )
            return StepOutcome("completed", value=end.value, record=record)
        if end.status == "parked":
            return StepOutcome("parked", park=end.park)
        if end.status == "halted":
            known.pop(label, None)
            return StepOutcome("halted", reason=end.reason)
        known.pop(label, None)
        return StepOutcome(
            "failed", error=end.error, rollback_failures=list(end.rollback_failures)
        )

    def _run_map(self, spec: MapSpec) -> StepOutcome:
        try:
            items = spec.over.resolve(self._scope())
        except PathError as exc:
            return StepOutcome("failed", error=ArgumentResolutionError(
                f"map_step {spec.name!r} of {self.reactor_path}: over={spec.over.describe()}: {exc}",
                reactor=self.reactor_path, step=spec.name, argument="over",
                source=spec.over.describe(),
            ))
        if not isinstance(items, (list, tuple)):
            return StepOutcome("failed", error=ArgumentResolutionError(
                f"map_step {spec.name!r} of {self.reactor_path}: over={spec.over.describe()} "
                f"must be a list, got {type(items).__name__}",
                reactor=self.reactor_path, step=spec.name, argument="over",
                source=spec.over.describe(),
            ))
        progress = self.state.extra.setdefault("map_progress", {}).setdefault(
            spec.name, {"elements": [], "values": [], "index": 0}
        )
        while progress["index"] < len(items):
            index = progress["index"]
            label = f"{spec.name}[{index}]"
            try:
                args = resolve_arguments(
                    spec, self._scope(items[index], with_element=True), self.reactor_path,
                    default_to_inputs=not spec.is_reactor,
                )
            except ArgumentResolutionError as error:
                outcome = StepOutcome("failed", error=error)
            else:
                if spec.is_reactor:
                    outcome = self._run_child(spec.target, args, label=label)
                else:
                    outcome = self._run_unit(spec, spec.target, args, label)
            if outcome.status == "completed":
                record = outcome.record
                progress["elements"].append(
                    {
                        "label": label,
                        "args": record.args if record else args,
                        "result": outcome.value,
                        "child_execution": record.child_execution if record else None,
                    }
                )
            if outcome.status in ("completed", "skipped"):
                progress["values"].append(outcome.value)
                progress["index"] += 1
                self.persist()
                continue
            if outcome.status == "failed":
                # Roll back the iterations that completed, newest first, then fail the step.
                partial = CompletedStep(step=spec.name, kind="map", elements=progress["elements"])
                failures = list(outcome.rollback_failures) + undo_record(self, partial)
                self.state.extra["map_progress"].pop(spec.name, None)
                return StepOutcome("failed", error=outcome.error, rollback_failures=failures)
            return outcome  # parked or halted: keep the progress for a resume
        self.state.extra["map_progress"].pop(spec.name, None)
        record = CompletedStep(
            step=spec.name, kind="map", elements=progress["elements"], result=progress["values"]
        )
        return StepOutcome("completed", value=progress["values"], record=record)

    # -- ending ---------------------------------------------------------------------------

    def finish(self, end: RunEnd) -> None:
        """Write the end of this pass onto the execution row and emit its event."""
        now = timezone.now()
        if end.status == "succeeded":
            self.persist(
                status=ExecutionStatus.SUCCEEDED, result=to_json(end.value), finished_at=now,
                current_step="",
            )
            emit_engine(EngineEvent.EXECUTION_SUCCEEDED, self.execution, value=end.value)
        elif end.status == "halted":
            self.state.extra["halt_reason"] = end.reason
            self.persist(status=ExecutionStatus.HALTED, finished_at=now)
            emit_engine(EngineEvent.EXECUTION_HALTED, self.execution, reason=end.reason)
        elif end.status == "failed":
            self.persist(
                status=ExecutionStatus.FAILED,
                error=end.error.as_dict() if end.error else None,
                rollback_failures=to_json(end.rollback_failures),
                finished_at=now,
            )
            emit_engine(EngineEvent.EXECUTION_FAILED, self.execution, error=end.error)
        elif end.status == "parked":
            self.persist(status=ExecutionStatus.PARKED)
            emit_engine(EngineEvent.EXECUTION_PARKED, self.execution)

    def result(self, end: RunEnd) -> Result:
        return Result(
            status=end.status,
            value=end.value if end.status == "succeeded" else None,
            error=end.error,
            execution_id=self.execution_id,
            rollback_failures=end.rollback_failures,
            halt_reason=end.reason if end.status == "halted" else None,
        )


def _release_outcome(end: RunEnd | None) -> str:
    if end is None or end.status == "failed":
        return "failure"
    return {"succeeded": "success", "halted": "halt", "parked": "park"}.get(end.status, "failure")


def input_errors(reactor: type[Reactor], inputs: dict[str, Any]) -> InputValidationError | None:
    """Missing or unexpected inputs of a run, as one structured error."""
    field_errors = {name: "required" for name in reactor.inputs if name not in inputs}
    field_errors.update(
        {name: "unexpected input" for name in inputs if name not in reactor.inputs}
    )
    if not field_errors:
        return None
    described = ", ".join(f"{k}: {v}" for k, v in field_errors.items())
    return InputValidationError(
        f"invalid inputs for {reactor.__qualname__}: {described}",
        reactor=reactor.path(), step=None, field_errors=field_errors,
    )


def run_reactor(reactor: type[Reactor], inputs: dict[str, Any]) -> Result:
    """``Reactor.run``: create the execution row and run it to the end in this process."""
    error = input_errors(reactor, inputs)
    execution = Execution.objects.start(
        reactor=reactor.path(),
        inputs=to_json(inputs),
        status=ExecutionStatus.FAILED if error else ExecutionStatus.PENDING,
        error=error.as_dict() if error else None,
        finished_at=timezone.now() if error else None,
    )
    if error is not None:
        return Result(status=ExecutionStatus.FAILED, error=error, execution_id=str(execution.id))
    run = ExecutionRun(reactor, execution, inputs)
    end = run.execute()
    run.finish(end)
    return run.result(end)
