"""``map_step``: one step (or composed reactor) per element of a list.

Each element is its own unit, labelled ``<step>[<index>]`` and coordinated on its own
arguments (``element()`` reads the element). Progress is kept per element in
``state.children.map_progress``, so a park or a redelivery continues at the element it stopped
at; a worker writes it in batches (``ExecutionRun.element_done``), so a redelivery after a
crash re-runs at most the elements of the unwritten batch. A failed element rolls back the
elements that completed, newest first, and fails the step; the whole map then sits in the
rollback log as one entry whose elements are undone in reverse.

``parallel=True`` on a worker delivery (``run_parallel``)::

    1. First pass: resolve every element's arguments, validate them and run the hand-off
       guard per element (a key this execution holds → ``HandOffRefused``); any refusal fails
       the step with nothing created. Then, in one transaction, one child execution per
       element (an ``async_step``-kind delivery running this map's step with the element's
       arguments, labelled ``<step>[<index>]``, owned by its own execution id, so it is
       coordinated on its own arguments) and its task after commit; the element ids are
       checkpointed in ``state.children.parallel_maps``. The parent parks: it holds
       nothing of the elements (its own reactor-level holds follow the usual park rule).
    2. Each element's delivery wakes the root of the tree when it ends (``engine.dispatch``);
       the park's own requeue (the contention backoff, growing with each look) covers an
       element that ended before the park was persisted.
    3. A later pass finds an element still running → parks again. Once all have ended:
         all succeeded → the results in element order; the map enters the rollback log
            with its elements in completion order (undone newest first).
         one failed → after all ended (so each success is known), the completed elements
            join the rollback log; the step fails with the first failed element's error, and
            the executor's rollback undoes them with the earlier steps, newest first by
            completion, under this execution's owner re-taking their lock and semaphore.
         one halted (none failed) → the step halts, as a sequential map's halted element.
    4. A rollback of the parent for another reason while elements run (a cancel, a refusal
       at its reactor gate on a later pass) waits for them and undoes those that completed
       first (``engine.settling.settle_map_elements``).

In the caller's process a ``parallel`` map runs its elements one after another (above).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reactor_app import isolation
from reactor_app.dsl.arguments import PathError
from reactor_app.dsl.kinds import MapSpec
from reactor_app.engine.async_order import enter_log
from reactor_app.engine.children import (
    check_handed_on,
    child_error,
    completed_elements,
    run_child,
    start_worker_child,
)
from reactor_app.engine.hand_off_guard import guard_hand_off
from reactor_app.engine.outcomes import UnitStatus
from reactor_app.engine.runner import StepOutcome, resolve_arguments, validate_arguments
from reactor_app.engine.state import CompletedStep, ExecutionState, MapElement
from reactor_app.engine.worker import backoff_seconds
from reactor_app.exceptions import (
    ArgumentResolutionError,
    CoordinationError,
    InputValidationError,
    StepFailed,
)
from reactor_app.models import Execution
from reactor_app.serialization import decode
from reactor_app.status import TERMINAL_STATUSES, EngineEvent, ExecutionStatus, StepRunKind
from reactor_app.tracking import StepRecorder

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun


def run_map(run: ExecutionRun, spec: MapSpec) -> StepOutcome:
    """Run ``spec`` once per element, in order; the checkpoint is per element."""

    def bad_over(problem: str) -> StepOutcome:
        # an unreadable and a non-list ``over`` fail alike, naming the argument and its source
        return StepOutcome(
            UnitStatus.FAILED,
            error=ArgumentResolutionError(
                f"map_step {spec.name!r} of {run.reactor_path}: "
                f"over={spec.over.describe()}{problem}",
                reactor=run.reactor_path,
                step=spec.name,
                argument="over",
                source=spec.over.describe(),
            ),
        )

    try:
        items = spec.over.resolve(run.scope())
    except PathError as exc:
        return bad_over(f": {exc}")
    if not isinstance(items, (list, tuple)):
        return bad_over(f" must be a list, got {type(items).__name__}")
    if spec.parallel and run.park_on_contention:
        return run_parallel(run, spec, items)
    progress = run.state.children.progress().setdefault(
        spec.name, {"elements": [], "values": [], "index": 0}
    )
    while progress["index"] < len(items):
        if run.out_of_time():
            # the delivery's share of its time limit is used (engine.time_slice): the next
            # element starts in a fresh delivery, from the progress kept as across a park
            return StepOutcome(UnitStatus.PARKED, retry_in=0.0)
        index = progress["index"]
        label = f"{spec.name}[{index}]"
        try:
            args = resolve_arguments(
                spec,
                run.scope(items[index], with_element=True),
                run.reactor_path,
                default_to_inputs=not spec.is_reactor,
            )
        except ArgumentResolutionError as error:
            outcome = StepOutcome(UnitStatus.FAILED, error=error)
        else:
            if spec.is_reactor:
                outcome = run_child(run, spec.target, args, label=label)
            else:
                outcome = run.run_unit(spec, spec.target, args, label)
        if outcome.status == UnitStatus.COMPLETED:
            record = outcome.record
            progress["elements"].append(
                {
                    "label": label,
                    "args": record.args if record else args,
                    "result": outcome.value,
                    "child_execution": record.child_execution if record else None,
                    # when its body returned: its place in a rollback (``engine.undo_order``)
                    "at": record.at if record else None,
                }
            )
        if outcome.status in (UnitStatus.COMPLETED, UnitStatus.SKIPPED):
            progress["values"].append(outcome.value)
            progress["index"] += 1
            run.element_done()  # written in batches on a worker (engine.progress)
            continue
        if outcome.status == UnitStatus.FAILED:
            # The iterations that completed join the rollback log, and the run's rollback
            # (which a failed step always starts) undoes them in their place by completion.
            _log_completed(run, spec.name, progress["elements"])
            run.state.children.progress().pop(spec.name, None)
            return outcome
        return outcome  # parked or halted: keep the progress for a resume
    run.state.children.progress().pop(spec.name, None)
    record = CompletedStep(
        step=spec.name, kind="map", elements=progress["elements"], result=progress["values"]
    )
    return StepOutcome(UnitStatus.COMPLETED, value=progress["values"], record=record)


# --------------------------------------------------------------------------------------------
# parallel=True on a worker: the elements as worker deliveries


def run_parallel(
    run: ExecutionRun, spec: MapSpec, items: list[Any] | tuple[Any, ...]
) -> StepOutcome:
    """Fan the elements out (first pass), then park until every element has ended and join.

    The fan-out and the join are two passes of the parent: its state holds the element
    executions (``state.children.parallel_maps``), so a redelivery joins the same elements
    rather than starting them again.
    """
    pending = run.state.children.parallel()
    entry = pending.get(spec.name)
    if entry is None:
        failed = _fan_out(run, spec, items)
        if failed is not None:
            return failed
        entry = pending.get(spec.name)
        if entry is None:  # no elements: nothing was started
            return StepOutcome(
                UnitStatus.COMPLETED,
                value=[],
                record=CompletedStep(step=spec.name, kind="map", result=[]),
            )
    ids = [element["execution"] for element in entry["elements"]]
    rows = {str(row.id): row for row in Execution.objects.filter(pk__in=ids)}
    if any(i in rows and rows[i].status not in TERMINAL_STATUSES for i in ids):
        # Parked until the last element ends (each one's delivery wakes this execution);
        # a failed element waits for the others too, so that every success can be undone.
        # An element that ends before this park is persisted finds nothing parked to wake:
        # the parent's own requeue then looks again, soon at first, backing off while the
        # elements run long (the contention backoff; never counted as contention).
        entry["looks"] = int(entry.get("looks", 0)) + 1
        run.root.requeue_in = backoff_seconds(entry["looks"])
        return StepOutcome(UnitStatus.PARKED, reason=f"awaiting the elements of {spec.name}")
    pending.pop(spec.name)
    return _join(run, spec, entry["elements"], rows)


def _fan_out(
    run: ExecutionRun, spec: MapSpec, items: list[Any] | tuple[Any, ...]
) -> StepOutcome | None:
    """Resolve and check every element's arguments, then create the element executions and
    enqueue them after commit — all or none. Returns the failure if an element is refused."""
    step_class = spec.step_class()
    assert step_class is not None  # parallel maps take a Step (dsl.kinds.map_step)
    prepared: list[tuple[str, dict[str, Any]]] = []
    for index, item in enumerate(items):
        label = f"{spec.name}[{index}]"
        try:
            args = resolve_arguments(
                spec, run.scope(item, with_element=True), run.reactor_path, default_to_inputs=True
            )
            validate_arguments(step_class, args, run.reactor_path, label)
            check_handed_on(args, run.reactor_path, label)
        except (ArgumentResolutionError, InputValidationError) as error:
            return StepOutcome(UnitStatus.FAILED, error=error)
        try:
            guard_hand_off(run, spec, args)
        except CoordinationError as refused:  # HandOffRefused, or a key function that raised
            StepRecorder(run.execution, label, StepRunKind.RUN, 1).finished(
                EngineEvent.STEP_FAILED, error=refused.as_dict(), body_started=False
            )
            return StepOutcome(UnitStatus.FAILED, error=refused)
        prepared.append((label, args))
    if not prepared:
        return None
    with isolation.atomic():
        elements: list[MapElement] = []
        for label, args in prepared:
            child_id = start_worker_child(
                run,
                reactor_path=run.reactor_path,
                args=args,
                marker={"kind": "async_step", "step": spec.name, "label": label},
                # the tree's root is the execution a finished element wakes (a composed
                # child parks with its root and continues in the root's delivery)
                parent=run.root.execution,
                root_id=run.root.execution.id,
            )
            # the values, as an async step's (``children.dispatch_child``): its undo gets them
            elements.append({"label": label, "execution": str(child_id), "args": dict(args)})
        run.state.children.parallel()[spec.name] = {"elements": elements}
        run.persist(current_step=spec.name)
    return None


def _join(
    run: ExecutionRun,
    spec: MapSpec,
    elements: list[MapElement],
    rows: dict[str, Execution],
) -> StepOutcome:
    """Every element has ended: the results in element order, or the failure after the
    completed elements were undone, newest first."""
    values: list[Any] = []
    failure: StepOutcome | None = None
    halted: StepOutcome | None = None
    for element in elements:
        row = rows.get(element["execution"])
        if row is not None and row.status == ExecutionStatus.SUCCEEDED:
            values.append(decode(row.result))
        elif row is not None and row.status == ExecutionStatus.HALTED:
            reason = ExecutionState.peek(row.context).ending.halt_reason
            halted = halted or StepOutcome(UnitStatus.HALTED, reason=reason)
        elif failure is None:
            failure = _element_failure(run, spec, element, row)
    done = completed_elements(elements, rows)
    if failure is not None:
        _log_completed(run, spec.name, done)
        return failure
    if halted is not None:
        return halted  # as a sequential map's halted element: no rollback
    record = CompletedStep(step=spec.name, kind="map", elements=done, result=values)
    return StepOutcome(UnitStatus.COMPLETED, value=values, record=record)


def _log_completed(run: ExecutionRun, name: str, elements: list[dict[str, Any]]) -> None:
    """A failed map's completed elements, into the rollback log: undone by the run's rollback
    with the rest, newest first by completion — not here, at once, before the async steps that
    completed after them (which the rollback waits for first)."""
    if elements:
        enter_log(run, CompletedStep(step=name, kind="map", elements=elements))


def _element_failure(
    run: ExecutionRun, spec: MapSpec, element: MapElement, row: Execution | None
) -> StepOutcome:
    label = element["label"]
    if row is None:
        missing = StepFailed(
            f"element {label} of {run.reactor_path}: its execution {element['execution']} "
            "is missing",
            reactor=run.reactor_path,
            step=label,
        )
        return StepOutcome(UnitStatus.FAILED, error=missing)
    error = child_error(
        row, f"element {label} of {run.reactor_path} ended {row.status}", run.reactor_path, label
    )
    return StepOutcome(
        UnitStatus.FAILED, error=error, rollback_failures=list(row.rollback_failures or [])
    )
