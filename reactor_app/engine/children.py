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
* What a rollback or a halt does with the children still open (waiting, ending parked
  composed children, undoing a map's completed elements): ``engine.settling``.
* Where a settled async step enters the rollback log: ``engine.async_order``.
* ``start_worker_child``: the row of any child a worker runs (also a parallel map's elements,
  ``engine.mapping``).
"""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from reactor_app import isolation
from reactor_app.dsl.kinds import AsyncReactorSpec, AsyncStepSpec
from reactor_app.engine.async_order import enter_settled, stamp
from reactor_app.engine.enqueueing import enqueue_on_commit
from reactor_app.engine.hand_off_guard import guard_hand_off
from reactor_app.engine.inputs import check_kept_arguments, input_errors
from reactor_app.engine.outcomes import PassEnd, UnitStatus
from reactor_app.engine.priority import message_priority
from reactor_app.engine.result import error_from_dict
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
    InputNotSerializable,
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
        # On a worker the child's row and the state naming it commit together: a redelivery
        # after a crash inside the child must continue this child, not start a second one
        # (the first left running, its completed steps done twice), and a crash between the
        # two writes must not leave a row nobody names (pending for good).
        persists = run.policy.persists_each_step
        with isolation.atomic() if persists else nullcontext():
            execution = Execution.objects.start(
                reactor=reactor.path(),
                inputs=encode(inputs, strict=False, where="inputs"),
                parent=run.execution,
                root_id=run.root.execution.id,
                status=ExecutionStatus.PENDING,
            )
            child = run.spawn_child(reactor, execution, inputs)
            known[label] = child.execution_id
            if persists:
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
            # a floor for its stamp: it comes after the child's entries (``enter_log``)
            at=max((r.at for r in child.state.completed if r.at is not None), default=None),
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
            check_handed_on(args, run.reactor_path, spec.name)
        except InputValidationError as invalid:
            return StepOutcome(UnitStatus.FAILED, error=invalid)
        reactor_path, kind = run.reactor_path, "async_step"
    else:
        wrong_inputs = input_errors(spec.target, args)
        if wrong_inputs is not None:
            return StepOutcome(UnitStatus.FAILED, error=wrong_inputs)
        try:
            check_handed_on(args, run.reactor_path, spec.name)
        except InputNotSerializable as invalid:
            return StepOutcome(UnitStatus.FAILED, error=invalid)
        reactor_path, kind = spec.target.path(), "async_reactor"
    try:
        guard_hand_off(run, spec, args)
    except CoordinationError as refused:  # HandOffRefused, or a key function that raised
        StepRecorder(run.execution, spec.name, StepRunKind.RUN, 1).finished(
            EngineEvent.STEP_FAILED, error=refused.as_dict(), body_started=False
        )
        return StepOutcome(UnitStatus.FAILED, error=refused)
    with isolation.atomic():
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
            # the values themselves: the state goes through the codec (``check_handed_on``
            # made sure it can hold them), and the undo of this step receives them. Kept as
            # display JSON before, an undo received "10.50" for Decimal("10.50").
            "args": dict(args),
            "timeout": spec.result_timeout,
            "since": stamp(run),
        }
        run.state.next_index += 1
        run.persist(current_step=spec.name)
    return StepOutcome(UnitStatus.DISPATCHED)


def check_handed_on(args: dict[str, Any], reactor_path: str, label: str) -> None:
    """``InputNotSerializable`` when a worker child could not read ``args`` back as the same
    values. Before, they were stored as their ``repr``, and the child's step received the text
    ``"{1, 2}"`` where the parent passed a set — an input of an in-process run, or a
    ``value(...)`` of the declaration, neither checked until here (results are:
    ``runner.storable``)."""
    check_kept_arguments(args, reactor_path, label, kept_for="for a worker")


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
        inputs=encode(args, where="arguments"),  # checked first: check_handed_on
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
        ending = ExecutionState.peek(child.context).ending
        skipped = ending.skipped
        if entry["kind"] == "async_step" and not skipped:
            # an async step is part of this saga: undone if a later step fails — in its place
            # by completion, not first because it is settled last (``enter_settled``)
            record = CompletedStep(
                step=name,
                kind="step",
                args=entry["args"],
                result=decode(child.result),
                child_execution=entry["child"],
            )
            enter_settled(run, entry, record, ending.completed_at)
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
        ending = ExecutionState.peek(row.context).ending
        if ending.skipped:
            continue  # a skipped step is never undone
        entry = {
            "label": element["label"],
            "args": element["args"],
            "result": decode(row.result),
            "child_execution": None,
            "element_execution": element["execution"],
            "at": ending.completed_at,  # its place in a rollback (``engine.undo_order``)
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
