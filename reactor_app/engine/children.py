"""Child executions of a run: composed reactors in this process, async children on workers.

* ``compose(Child, ...)`` (``run_child``): the child runs the same main loop in this process,
  as part of this tree — the root's owner, the root's held-key registry — and of its rollback.
  A child that parks parks the tree; its id is kept in ``state.children.composed`` so the
  next pass continues the same child execution.
* ``async_step`` / ``async_reactor`` (``dispatch_child``): after the hand-off guard, a child
  execution row is created and its task enqueued after commit; nothing held is handed on. The
  step is checkpointed as dispatched (``state.children.pending_async``) and the loop moves on.
* Reading a child's result (``await_children``): a synchronous run blocks on the row up to the
  step's ``result_timeout``; a worker delivery parks — holding nothing of the child — and the
  child's delivery wakes it when it ends (``engine.dispatch``). ``settle_child`` turns a finished
  child into this run's result (a succeeded ``async_step`` joins the rollback log).
* Before a halt, ``settle_on_halt`` waits for running async children (nothing undone).
* Before a rollback, ``settle_children`` waits for running async children so that their
  successes are undone too — and for a parallel map's running elements, undoing those that
  completed (``settle_map_elements``); a sequential map stopped part-way has the elements it
  completed undone (``settle_map_progress``).
* Where a settled async step enters the rollback log: ``engine.async_order``.
* ``start_worker_child``: the row of any child a worker runs (also a parallel map's elements,
  ``engine.mapping``).

One piece on purpose, though over the usual size: dispatching, reading and settling a child
share the same entries of ``state.children`` and the same rules for a child's row (which
statuses are settled, how a failure reads), and settling is the reverse of dispatching; the
order a settled child takes in the rollback log is already its own module.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from reactor_app.coordination.admission import Coordinator
from reactor_app.dsl.kinds import AsyncReactorSpec, AsyncStepSpec
from reactor_app.engine.async_order import log_position
from reactor_app.engine.cancel_flag import cancelled_error
from reactor_app.engine.enqueueing import enqueue_on_commit, message_priority, wake
from reactor_app.engine.hand_off_guard import guard_hand_off
from reactor_app.engine.inputs import input_errors
from reactor_app.engine.leftovers import abandon_positions, leave_lines, release_kept
from reactor_app.engine.outcomes import PassEnd, RunEnd, UnitStatus
from reactor_app.engine.result import error_from_dict
from reactor_app.engine.rollback import roll_back, undo_record
from reactor_app.engine.runner import StepOutcome, validate_arguments
from reactor_app.engine.state import (
    AsyncChild,
    ChildKind,
    CompletedStep,
    DispatchMarker,
    ExecutionState,
    MapElement,
)
from reactor_app.exceptions import (
    CoordinationError,
    InputValidationError,
    ReactorError,
    StepFailed,
)
from reactor_app.models import Execution
from reactor_app.serialization import decode, encode, to_json
from reactor_app.status import TERMINAL_STATUSES, EngineEvent, ExecutionStatus, StepRunKind
from reactor_app.tracking import StepRecorder

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor
    from reactor_app.engine.executor import ExecutionRun


logger = logging.getLogger(__name__)

#: seconds a rollback waits for a parallel map's running elements before reporting them
ELEMENT_SETTLE_TIMEOUT = 300.0


def run_child(
    run: ExecutionRun, reactor: type[Reactor], inputs: dict[str, Any], *, label: str
) -> StepOutcome:
    known = run.state.children.composed_runs()
    child: ExecutionRun | None = None
    if label in known:
        child = run.child_run(known[label])
    if child is not None and child.execution.status in (
        ExecutionStatus.FAILED,
        ExecutionStatus.CANCELLED,
    ):
        # ended by a rollback of this run that died before it could checkpoint
        # (``settle_composed``): its steps are undone, it must not carry on from the middle
        known.pop(label, None)
        row = child.execution
        return StepOutcome(
            UnitStatus.FAILED,
            error=child_error(row, "composed child ended", run.reactor_path, label),
        )
    if child is None:
        error = input_errors(reactor, inputs)
        if error is not None:
            return StepOutcome(UnitStatus.FAILED, error=error)
        execution = Execution.objects.start(
            reactor=reactor.path(),
            inputs=encode(inputs, strict=False, where="inputs"),
            parent=run.execution,
            root_id=run.root.execution.id,
            status=ExecutionStatus.PENDING,
        )
        child = run.spawn_child(reactor, execution, inputs)
        known[label] = child.execution_id
        if run.policy.persists_each_step:
            # a redelivery after a crash inside the child must continue this child, not start
            # a second one (the first left running, its completed steps done twice)
            run.persist()
    end = child.execute()
    child.finish(end)
    if end.status == PassEnd.SUCCEEDED:
        known.pop(label, None)
        record = CompletedStep(
            step=label,
            kind="compose",
            args=to_json(inputs),
            result=end.value,
            child_execution=child.execution_id,
        )
        return StepOutcome(UnitStatus.COMPLETED, value=end.value, record=record)
    if end.status == PassEnd.PARKED:
        return StepOutcome(UnitStatus.PARKED, park=end.park)
    if end.status == PassEnd.HALTED:
        known.pop(label, None)
        return StepOutcome(UnitStatus.HALTED, reason=end.reason)
    known.pop(label, None)
    return StepOutcome(
        UnitStatus.FAILED, error=end.error, rollback_failures=list(end.rollback_failures)
    )


def dispatch_child(
    run: ExecutionRun, spec: AsyncStepSpec | AsyncReactorSpec, args: dict[str, Any]
) -> StepOutcome:
    """Create the child execution and enqueue it after commit; nothing held is handed on."""
    kind: ChildKind
    if isinstance(spec, AsyncStepSpec):
        step_class = spec.step_class()
        assert step_class is not None
        try:
            validate_arguments(step_class, args, run.reactor_path, spec.name)
        except InputValidationError as invalid:
            return StepOutcome(UnitStatus.FAILED, error=invalid)
        reactor_path, kind = run.reactor_path, "async_step"
    else:
        wrong_inputs = input_errors(spec.target, args)
        if wrong_inputs is not None:
            return StepOutcome(UnitStatus.FAILED, error=wrong_inputs)
        reactor_path, kind = spec.target.path(), "async_reactor"
    try:
        guard_hand_off(run, spec, args)
    except CoordinationError as refused:  # HandOffRefused, or a key function that raised
        StepRecorder(run.execution, spec.name, StepRunKind.RUN, 1).finished(
            EngineEvent.STEP_FAILED, error=refused.as_dict(), body_started=False
        )
        return StepOutcome(UnitStatus.FAILED, error=refused)
    with transaction.atomic():
        child_id = start_worker_child(
            run,
            reactor_path=reactor_path,
            args=args,
            marker={"kind": kind, "step": spec.name},
            parent=run.execution,
            # an async step belongs to this tree; an async reactor is a tree of its own
            root_id=run.root.execution.id if kind == "async_step" else None,
        )
        run.state.children.async_children()[spec.name] = {
            "child": str(child_id),
            "kind": kind,
            "args": to_json(args),
            "timeout": spec.result_timeout,
        }
        run.state.next_index += 1
        run.persist(current_step=spec.name)
    return StepOutcome(UnitStatus.DISPATCHED)


def start_worker_child(
    run: ExecutionRun,
    *,
    reactor_path: str,
    args: dict[str, Any],
    marker: DispatchMarker,
    parent: Execution,
    root_id: Any,
) -> uuid.UUID:
    """Create a pending child execution for a worker and enqueue it once the caller's
    transaction commits (so the worker finds the row). ``marker`` (``state.origin.dispatch``)
    tells the delivery what to run: ``kind="async_step"`` runs one step of ``reactor_path``
    (``ExecutionRun.execute_async_step``), owned by the child's own id; ``root_id`` None makes
    the child a tree of its own (``async_reactor``)."""
    child_id = uuid.uuid4()
    context = ExecutionState()
    context.origin.worker = True
    context.origin.dispatch = marker
    # a child waits for contended keys with its parent's priority
    context.origin.priority = run.root.state.origin.priority
    Execution.objects.start(
        id=child_id,
        reactor=reactor_path,
        inputs=encode(args, strict=False, where="arguments"),
        parent=parent,
        root_id=root_id if root_id is not None else child_id,
        status=ExecutionStatus.PENDING,
        heartbeat_at=timezone.now(),
        context=context.to_json(),
    )
    enqueue_on_commit(child_id, priority=message_priority(context.origin.priority))
    return child_id


def await_children(run: ExecutionRun, names: frozenset[str] | None) -> StepOutcome | None:
    """Read the results of pending async children among ``names`` (None: all of them).

    None when every one is settled and succeeded; else the outcome for the reader: parked
    (worker, a child still running), failed (a child failed, or timed out) or halted.
    """
    pending = run.state.children.pending_async or {}
    for name in [n for n in pending if names is None or n in names]:
        entry = pending[name]
        child = Execution.objects.filter(pk=entry["child"]).first()
        if child is not None and child.status not in TERMINAL_STATUSES:
            if run.park_on_contention:
                return StepOutcome(UnitStatus.PARKED, reason=f"awaiting {name}")
            child = block_on(child, float(entry["timeout"]))
        outcome = settle_child(run, name, entry, child)
        if outcome is not None:
            return outcome
    return None


def settle_child(
    run: ExecutionRun, name: str, entry: AsyncChild, child: Execution | None
) -> StepOutcome | None:
    if child is None or child.status not in TERMINAL_STATUSES:
        status = child.status if child is not None else "missing"
        return StepOutcome(
            UnitStatus.FAILED,
            error=StepFailed(
                f"{entry['kind']} {name!r} of {run.reactor_path} did not finish within "
                f"{entry['timeout']}s (child execution {entry['child']} is {status})",
                reactor=run.reactor_path,
                step=name,
            ),
        )
    run.state.children.async_children().pop(name)
    if child.status == ExecutionStatus.SUCCEEDED:
        run.state.results[name] = decode(child.result)
        skipped = ExecutionState.peek(child.context).ending.skipped
        if entry["kind"] == "async_step" and not skipped:
            # an async step is part of this saga: undone if a later step fails — in its place
            # by completion, not first because it is settled last (``log_position``)
            run.state.completed.insert(
                log_position(run, entry),
                CompletedStep(
                    step=name,
                    kind="step",
                    args=entry["args"],
                    result=decode(child.result),
                    child_execution=entry["child"],
                ),
            )
        run.persist()
        return None
    run.persist()
    if child.status == ExecutionStatus.HALTED:
        return StepOutcome(
            UnitStatus.HALTED, reason=ExecutionState.peek(child.context).ending.halt_reason
        )
    error = child_error(
        child, f"{entry['kind']} {name!r} of {run.reactor_path} failed", run.reactor_path, name
    )
    return StepOutcome(UnitStatus.FAILED, error=error)


def child_error(row: Execution, fallback: str, reactor: str, step: str) -> ReactorError:
    """The error of a child execution that did not succeed (an async child, a parallel map's
    element): the one on its row, or a ``StepFailed`` saying ``fallback`` when the row has
    none the engine can rebuild (a cancelled child, an error of a class unknown here)."""
    error = error_from_dict(row.error)
    if isinstance(error, ReactorError):
        return error
    return StepFailed(fallback, reactor=reactor, step=step)


def children_to_settle(run: ExecutionRun) -> bool:
    """Whether a rollback of ``run`` has children to settle first (``settle_children``)."""
    children = run.state.children
    return bool(children.pending_async or children.parallel_maps or children.composed)


def settle_children(run: ExecutionRun) -> list[dict[str, Any]]:
    """Before a rollback: end the composed children the tree parked in (``settle_composed``),
    and wait for running async steps so that their successes are undone too (rollback never
    parks, so a worker blocks here as well)."""
    failures: list[dict[str, Any]] = settle_composed(run)
    pending = run.state.children.pending_async or {}
    for name, entry, child in _ended_async_children(pending):
        if child is None:
            failures.append(
                {
                    "step": name,
                    "kind": "undo",
                    "reason": "async_child_unfinished",
                    "child_execution": entry["child"],
                }
            )
            pending.pop(name)
            continue
        settle_child(run, name, entry, child)
    return failures + settle_map_elements(run) + settle_map_progress(run)


def _ended_async_children(
    pending: dict[str, AsyncChild],
) -> Iterator[tuple[str, AsyncChild, Execution | None]]:
    """Each pending async child, waited for up to its ``result_timeout`` (a rollback or a halt
    never parks, so a worker blocks here): its row once ended, None when it is gone or still
    running. The caller settles it or pops it."""
    for name in list(pending):
        entry = pending[name]
        child = Execution.objects.filter(pk=entry["child"]).first()
        if child is not None and child.status not in TERMINAL_STATUSES:
            child = block_on(child, float(entry["timeout"]))
        ended = child is not None and child.status in TERMINAL_STATUSES
        yield name, entry, child if ended else None


def settle_on_halt(run: ExecutionRun) -> None:
    """Before a halt ends ``run``: wait for its running async children and record their
    results, as the success path reads them (``await_children``). A halt is a clean stop —
    nothing is undone, so a child's success stands — but the run must not end while a child
    it dispatched still runs on. Like a rollback, a halt never parks, so a worker blocks here
    (up to each child's ``result_timeout``); a child that ends otherwise than succeeding does
    not change the halt."""
    pending = run.state.children.pending_async or {}
    for name, entry, child in _ended_async_children(pending):
        if child is None:
            logger.warning(
                "%s halted while its child execution %s (%s) was still running",
                run.reactor_path,
                entry["child"],
                name,
            )
            pending.pop(name)
            continue
        settle_child(run, name, entry, child)


def settle_composed(run: ExecutionRun) -> list[dict[str, Any]]:
    """End the composed children ``run`` parked in, before ``run`` rolls back without
    resuming them (a refusal at its own reactor gate, a cancel, an unexpected error).

    Such a child is mid-way: its completed steps are part of the tree's work, and it may keep
    reactor-level holds across the park. Each one (its own parked children first) is rolled
    back — its completed steps undone, newest first, while what it kept is still held — then
    gives back what it kept (holds, ordered positions, waiter places) and ends ``cancelled``
    when the tree was cancelled, else ``failed``. Left alone, it stayed ``parked`` for good,
    its kept holds renewed by every sweep. Returns what could not be undone."""
    failures: list[dict[str, Any]] = []
    composed = run.state.children.composed or {}
    for label in list(composed):
        child_id = composed.pop(label)
        try:
            child = run.child_run(child_id)
        except ReactorError:  # its reactor is not importable here: nothing can undo it
            logger.exception("composed child %s of %s cannot be loaded", child_id, run.reactor_path)
            failures.append({"step": label, "kind": "undo", "reason": "error"})
            continue
        if child is None or child.execution.status in TERMINAL_STATUSES:
            continue
        try:
            undone = settle_children(child) + roll_back(child)
        except Exception as exc:  # a rollback bug must not leave the child parked for good
            logger.exception("rollback of composed child %s failed", child.execution_id)
            undone = [{"step": label, "kind": "undo", "reason": "error", "error": str(exc)}]
        coordinator = Coordinator()
        woken = release_kept(child, coordinator) + abandon_positions(child, coordinator)
        leave_lines(child, coordinator)
        if woken:
            wake(woken)
        request = child.cancel_requested()
        if request is not None:
            error: ReactorError = cancelled_error(
                request, child.execution_id, reactor=child.reactor_path
            )
            child.finish(RunEnd(PassEnd.CANCELLED, error=error, rollback_failures=undone))
        else:
            error = StepFailed(
                f"the execution {child.reactor_path} is composed into ended before resuming it",
                reactor=child.reactor_path,
                step=label,
            )
            child.finish(RunEnd(PassEnd.FAILED, error=error, rollback_failures=undone))
        failures += undone
    return failures


def settle_map_elements(run: ExecutionRun) -> list[dict[str, Any]]:
    """Before a rollback that is not the map's own failure (a cancel, a refusal at the
    reactor gate on a later pass, an unexpected error) while a parallel map's elements run:
    wait for them (rollback never parks), then undo those that completed, newest first — they
    are the newest steps of the run, so before everything in the rollback log."""
    failures: list[dict[str, Any]] = []
    pending = run.state.children.parallel_maps or {}
    for name in list(pending):
        elements = pending.pop(name)["elements"]
        rows: dict[str, Execution] = {}
        for element in elements:
            row = Execution.objects.filter(pk=element["execution"]).first()
            if row is not None and row.status not in TERMINAL_STATUSES:
                row = block_on(row, ELEMENT_SETTLE_TIMEOUT)
            if row is None or row.status not in TERMINAL_STATUSES:
                failures.append(
                    {
                        "step": element["label"],
                        "kind": "undo",
                        "reason": "map_element_unfinished",
                        "child_execution": element["execution"],
                    }
                )
                continue
            rows[element["execution"]] = row
        done = completed_elements(elements, rows)
        failures.extend(undo_record(run, CompletedStep(step=name, kind="map", elements=done)))
    return failures


def settle_map_progress(run: ExecutionRun) -> list[dict[str, Any]]:
    """Before a rollback that is not the map's own failure while a sequential map is part-way
    (parked in an element on a worker, then cancelled, refused at the reactor gate on a later
    pass, or ended by an unexpected error): undo the elements that completed, newest first.
    They are not in the rollback log yet (the map enters it when it completes), and they are
    newer than everything in it; the element the map stopped in was ended by
    ``settle_composed`` when it is a composed reactor, and had not completed when it is a step."""
    failures: list[dict[str, Any]] = []
    progress = run.state.children.map_progress or {}
    for name in list(progress):
        elements = progress.pop(name)["elements"]
        if elements:
            partial = CompletedStep(step=name, kind="map", elements=elements)
            failures.extend(undo_record(run, partial))
    return failures


def completed_elements(
    elements: list[MapElement], rows: dict[str, Execution]
) -> list[dict[str, Any]]:
    """The rollback-log entries of a parallel map's succeeded (not skipped) elements, oldest
    first by when they finished, so that a reverse walk undoes the newest first. Undone by the
    parent, under its owner (``child_execution`` None), like an ``async_step``."""
    done: list[tuple[Any, dict[str, Any]]] = []
    for element in elements:
        row = rows.get(element["execution"])
        if row is None or row.status != ExecutionStatus.SUCCEEDED:
            continue
        if ExecutionState.peek(row.context).ending.skipped:
            continue  # a skipped step is never undone
        entry = {
            "label": element["label"],
            "args": element["args"],
            "result": decode(row.result),
            "child_execution": None,
            "element_execution": element["execution"],
        }
        done.append((row.finished_at, entry))
    done.sort(key=lambda pair: (pair[0] is None, pair[0]))
    return [entry for _, entry in done]


def block_on(child: Execution, timeout: float) -> Execution:
    """A synchronous reader of an async child's result: poll its row until it is terminal or
    ``timeout`` runs out (the child runs on a worker; there is nothing to subscribe to)."""
    deadline = time.monotonic() + timeout
    while child.status not in TERMINAL_STATUSES and time.monotonic() < deadline:
        time.sleep(0.05)
        child.refresh_from_db()
    return child
