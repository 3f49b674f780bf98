"""Before a run ends without reading its children: settling what it dispatched or parked in.

WHY a module of its own: ``engine.children`` creates, runs and reads children on the way
forward; this is what a rollback or a halt does with those still open — wait for running
async children (a rollback or a halt never parks, so a worker blocks here), end the composed
children the tree parked in, hand a map's completed elements to the rollback log — in the
order the rollback's promise needs (newest first by completion, ``engine.undo_order``).

* ``settle_children``: before a rollback — a failed attempt that was waiting for its retry
  first (``compensate_pending``: the run ends before that retry, so it was the final attempt),
  then the async steps (so their successes are
  undone too, in their place), then the parked composed children (``settle_composed``, whose
  rollback takes the async steps that ended inside its steps), a parallel map's running
  elements (``settle_map_elements``), a sequential map stopped part-way
  (``settle_map_progress``); a composed run with entries settles its ancestors' async steps.
* ``settle_on_halt``: before a halt — wait for running async children, nothing undone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from reactor_app.coordination.admission import Coordinator
from reactor_app.engine.async_order import enter_log, lineage
from reactor_app.engine.cancel_flag import cancelled_error
from reactor_app.engine.children import block_on, completed_elements, settle_child
from reactor_app.engine.enqueueing import wake
from reactor_app.engine.leftovers import abandon_positions, leave_lines, release_kept
from reactor_app.engine.outcomes import PassEnd, RunEnd
from reactor_app.engine.rollback import (
    record_rollback,
    recorded_end,
    roll_back,
    run_rollback_hook,
)
from reactor_app.engine.state import AsyncChild, ChildKind, CompletedStep
from reactor_app.engine.time_slice import DeliveryTimeUp, stops_delivery
from reactor_app.engine.worker import ClaimLost
from reactor_app.exceptions import ReactorError, StepFailed
from reactor_app.models import Execution
from reactor_app.status import TERMINAL_STATUSES, ExecutionStatus, StepRunKind

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun


logger = logging.getLogger(__name__)

#: seconds a rollback waits for a parallel map's running elements before reporting them
ELEMENT_SETTLE_TIMEOUT = 300.0


def children_to_settle(run: ExecutionRun) -> bool:
    """Whether a rollback of ``run`` has anything to settle first (``settle_children``) — a
    sequential map stopped part-way and a failed attempt waiting for its retry included: a
    run whose earlier steps were skipped has nothing else to roll back."""
    children = run.state.children
    return bool(
        children.pending_async
        or children.parallel_maps
        or children.composed
        or any(entry["elements"] for entry in (children.map_progress or {}).values())
        or run.state.continuation.pending_failures
    )


def compensate_pending(run: ExecutionRun) -> list[dict[str, Any]]:
    """Compensate the failed attempts of ``run`` that were waiting for a retry
    (``state.PendingFailure``): the run ends before their next attempt, so each is the final
    attempt of a body that did not complete (docs/reactors-and-steps.md, "The promise under
    cancel and retry"). Under the step's re-taken lock and semaphore, as every rollback hook;
    ``compensate`` receives a ``StepFailed`` with the attempt's recorded error."""
    failures: list[dict[str, Any]] = []
    pending = run.state.continuation.pending_failures or {}
    for label in list(pending):
        entry = pending.pop(label)
        spec = run.reactor.steps.get(entry["step"])
        step_class = spec.step_class() if spec is not None else None
        if spec is None or step_class is None:
            # the reactor changed under a parked run (a deploy removed the step): say so
            logger.error("no step %r in %s to compensate %s", entry["step"], run.reactor, label)
            failures.append({"step": label, "kind": "compensate", "reason": "unknown_step"})
            continue
        if not step_class.has_compensate():
            continue
        recorded = entry["error"]
        error = StepFailed(
            str(recorded.get("message") or f"{label} failed"),
            reactor=run.reactor_path,
            step=label,
            cause=recorded.get("cause"),
        )
        args = entry["args"]
        instance = step_class()
        failures += run_rollback_hook(
            run,
            step_class,
            label,
            args,
            kind=StepRunKind.COMPENSATE,
            call=partial(instance.compensate, error, args),  # then the context
            owner=run.owner,
            held_keys=run.held_keys,
            declared=spec.declarations,
        )
    return failures


def settle_children(run: ExecutionRun) -> list[dict[str, Any]]:
    """Before a rollback: wait for running async steps so that their successes are undone too
    (rollback never parks, so a worker blocks here as well), then end the composed children
    the tree parked in (``settle_composed``) — after, since such a child's rollback undoes the
    async steps that ended after its first entry in between its own (``engine.undo_order``).
    A composed run with entries waits for its ancestors' async steps too, for the same
    reason: its rollback comes first, and its ancestors roll back after it."""
    failures = compensate_pending(run)  # the failing unit first, as the runner does
    failures += _settle_async(run)
    failures += settle_composed(run)
    failures += settle_map_elements(run) + settle_map_progress(run)
    if run.state.completed:
        for ancestor in lineage(run)[1:]:
            failures += _settle_async(ancestor, kind="async_step")
    return failures


def _settle_async(run: ExecutionRun, kind: ChildKind | None = None) -> list[dict[str, Any]]:
    """Wait for ``run``'s pending async children (of ``kind``) and settle them; what did not
    end in time is reported."""
    failures: list[dict[str, Any]] = []
    pending = run.state.children.pending_async or {}
    wanted = {name: e for name, e in pending.items() if kind is None or e["kind"] == kind}
    for name, entry, child in _ended_async_children(wanted):
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
    return failures


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
    its kept holds renewed by every sweep. A child still listed although it ``succeeded`` (a
    delivery lost between its end and this run's record of it) has its steps undone. Returns
    what could not be undone."""
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
        if child is not None and child.execution.status == ExecutionStatus.SUCCEEDED:
            # It ended, and the delivery that ran it was lost before this run recorded the
            # step (the next one would have taken its result): its completed steps are undone
            # here, as a recorded composed step's are (``engine.rollback``).
            failures += roll_back(child, with_ancestors=False)
            child.persist()
            continue
        if child is None or child.execution.status in TERMINAL_STATUSES:
            continue
        end = _child_end(child, label)
        try:
            # recorded first on a worker, as any rollback (``engine.rollback_progress``): a
            # redelivery after a crash in it passes over the hooks that ran
            mark = record_rollback(child, end.status, end.error, [])
            end.rollback_failures = settle_children(child)
            undone = roll_back(child)
            if mark is not None:
                end = recorded_end(child, mark, end.rollback_failures)
            else:
                end.rollback_failures += undone
        except ClaimLost:
            raise
        except Exception as exc:  # a rollback bug must not leave the child parked for good
            if stops_delivery(child.root.time_slice, exc):
                raise DeliveryTimeUp("rollback cut off by its time limit") from exc
            logger.exception("rollback of composed child %s failed", child.execution_id)
            child.state.continuation.rolling_back = None  # ends here: no pass goes on with it
            end.rollback_failures.append(
                {"step": label, "kind": "undo", "reason": "error", "error": str(exc)}
            )
        coordinator = Coordinator()
        woken = release_kept(child, coordinator) + abandon_positions(child, coordinator)
        leave_lines(child, coordinator)
        if woken:
            wake(woken)
        child.finish(end)
        failures += end.rollback_failures
    return failures


def _child_end(child: ExecutionRun, label: str) -> RunEnd:
    """How a composed child its parent settles ends: ``cancelled`` when the tree was
    cancelled, else ``failed`` (its parent ended before resuming it)."""
    request = child.cancel_requested()
    if request is not None:
        error: ReactorError = cancelled_error(
            request, child.execution_id, reactor=child.reactor_path
        )
        return RunEnd(PassEnd.CANCELLED, error=error)
    error = StepFailed(
        f"the execution {child.reactor_path} is composed into ended before resuming it",
        reactor=child.reactor_path,
        step=label,
    )
    return RunEnd(PassEnd.FAILED, error=error)


def settle_map_elements(run: ExecutionRun) -> list[dict[str, Any]]:
    """Before a rollback that is not the map's own failure (a cancel, a refusal at the
    reactor gate on a later pass, an unexpected error) while a parallel map's elements run:
    wait for them (rollback never parks); those that completed join the rollback log, which
    the rollback right after undoes newest first by completion (an async step that ended
    after them comes first)."""
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
        if done:  # undone by the rollback that follows, each in its place by completion
            enter_log(run, CompletedStep(step=name, kind="map", elements=done))
    return failures


def settle_map_progress(run: ExecutionRun) -> list[dict[str, Any]]:
    """Before a rollback that is not the map's own failure while a sequential map is part-way
    (parked in an element on a worker, then cancelled, refused at the reactor gate on a later
    pass, or ended by an unexpected error): the elements that completed join the rollback log
    (the map enters it only when it completes), for the rollback right after; the element the
    map stopped in was ended by ``settle_composed`` when it is a composed reactor, and had not
    completed when it is a step."""
    failures: list[dict[str, Any]] = []
    progress = run.state.children.map_progress or {}
    for name in list(progress):
        elements = progress.pop(name)["elements"]
        if elements:  # undone by the rollback that follows, each in its place by completion
            enter_log(run, CompletedStep(step=name, kind="map", elements=elements))
    return failures
