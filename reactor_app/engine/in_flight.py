"""Units a lost delivery may have been running: compensated if the run ends before they run again.

WHY: nothing records that a body ran until its unit's checkpoint. A delivery killed (or cut by
its soft time limit) after a body's effect and before that record leaves the unit to run again
in the next delivery — the at-least-once rule — and the run goes on as if it ran once. But
when the run ends *before* the unit runs again — a cancel seen at the start of the next pass,
the contention ceiling reached on the unit's own key, a refusal at the reactor gate (what the
tests exercise), or anything else that rolls it back first — nothing undid or compensated
that body's effect: it stood, and the saga promise ("every effect stands, or is undone once")
was broken (docs/reactors-and-steps.md, "A cancel between a lost delivery and the next").

A delivery that takes over knows the point the lost one had reached (``engine.lost_deliveries``),
not whether the lost one entered the unit there: the step-run rows that would say so are
written behind (``write_behind``), and a durable write before every body would make each step
wait on the database. So the takeover writes down, in the statement that counts the loss, each
unit at that point as one the lost delivery *may* have been running: a pending failure marked
``lost`` (``state.PendingFailure``), as a failed attempt waiting for its retry is. The unit's
next body start drops the mark (it runs again, and is undone or compensated as any unit). If
the run ends first, its rollback compensates the unit (``engine.settling.compensate_pending``),
newest first, before the completed steps are undone: ``compensate`` is for a body that did not
complete, and nothing says this one did — its result, which ``undo`` would need, was never
kept. The price: a compensate may run for a body that never started (the lost delivery died
before it). ``compensate`` already has to allow for that — a body can raise before its first
effect — and it is cheaper than an effect left standing.

The units at the point:

* the next step of the plan, when its ``where=`` holds and its arguments resolve (else no body
  ran with them);
* of a sequential map in progress, the element at its written progress and, when the lost
  delivery wrote its elements in batches (no loss counted before it), the rest of a batch
  (``REACTOR_MAP_CHECKPOINT_EVERY`` in all): elements completed and not yet written;
* inside a composed child in progress (a ``compose`` step, an element of a map of reactors),
  the unit at the child's own point, marked in the child's state and written to its row;
* of the execution of an ``async_step`` or of a parallel map's element, its one unit (the
  parent's step at that point dispatched it: nothing of the parent ran there, and the child
  has its own deliveries and takeovers);
* nothing for an interrupt (no body), or a rollback under way (the redelivery goes on with it:
  ``engine.rollback_progress``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from reactor_app.conf import reactor_settings
from reactor_app.dsl.kinds import AsyncReactorSpec, AsyncStepSpec, InterruptSpec, MapSpec
from reactor_app.dsl.step import StepSpec
from reactor_app.engine.runner import evaluate_where, resolve_arguments
from reactor_app.engine.state import PendingFailure
from reactor_app.engine.time_slice import stops_delivery
from reactor_app.exceptions import StepFailed
from reactor_app.status import TERMINAL_STATUSES

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun


def mark_in_flight(run: ExecutionRun, *, batched: bool) -> None:
    """Mark the units ``run``'s lost delivery may have been running, in ``run``'s state (the
    caller writes it with the loss's count); a composed child's are written to its row here.
    ``batched``: the lost delivery wrote a sequential map's elements in batches."""
    if run.state.continuation.rolling_back is not None:
        return
    marker = run.state.origin.dispatch
    if marker is not None and marker["kind"] == "async_step":
        # an async step's (or a parallel map element's) execution: its one unit
        _mark_dispatched(run, marker["step"], marker.get("label") or marker["step"])
        return
    plan = run.reactor.plan
    if run.state.next_index >= len(plan.order):
        return
    name = plan.order[run.state.next_index]
    spec = plan.specs[name]
    if isinstance(spec, (AsyncStepSpec, AsyncReactorSpec, InterruptSpec)):
        return  # a dispatch or a pause: no body of this execution's
    if isinstance(spec, MapSpec) and spec.parallel:
        return  # its elements are executions of their own
    try:
        if not evaluate_where(spec, run.inputs, run.state.results):
            return
        units = list(_units(run, spec, batched))
    except Exception as exc:
        if stops_delivery(run.root.time_slice, exc):
            raise  # the task's soft limit: the delivery ends here, counting nothing
        return  # a where= or an argument that fails: no body ran with it
    composed = run.state.children.composed or {}
    for label, args in reversed(units):  # newest first, as a rollback undoes
        if label in composed:
            _mark_child(run, composed[label], batched=batched)
        elif spec.step_class() is not None:
            _mark(run, name, label, args)


def _mark_dispatched(run: ExecutionRun, name: str, label: str) -> None:
    spec = run.reactor.steps.get(name)
    if spec is not None and spec.step_class() is not None:
        _mark(run, name, label, dict(run.inputs))


def _mark(run: ExecutionRun, name: str, label: str, args: dict[str, Any]) -> None:
    """Mark ``label`` (of the reactor's step ``name``) — unless a failed attempt of it waits
    for its retry: that is compensated as such already."""
    if label in (run.state.continuation.pending_failures or {}):
        return
    run.state.continuation.failures()[label] = PendingFailure(
        step=name, args=args, error=_lost_error(run, label), lost=True
    )


def _units(run: ExecutionRun, spec: StepSpec, batched: bool) -> Iterator[tuple[str, Any]]:
    """The units of ``spec`` the lost delivery may have been running, in the order they run:
    their labels and arguments (None for a composed child, whose own units are marked)."""
    name = spec.name
    if isinstance(spec, MapSpec):
        items = spec.over.resolve(run.scope())
        progress = (run.state.children.map_progress or {}).get(name)
        start = int(progress["index"]) if progress else 0
        window = reactor_settings.MAP_CHECKPOINT_EVERY if batched else 1
        for index in range(start, min(start + window, len(items))):
            if spec.is_reactor:
                yield f"{name}[{index}]", None
                continue
            scope = run.scope(items[index], with_element=True)
            yield f"{name}[{index}]", resolve_arguments(spec, scope, run.reactor_path)
        return
    if spec.step_class() is None:  # a composed child
        yield name, None
        return
    yield name, resolve_arguments(spec, run.scope(), run.reactor_path)


def _mark_child(run: ExecutionRun, child_id: str, *, batched: bool) -> None:
    child = run.child_run(child_id)
    if child is None or child.execution.status in TERMINAL_STATUSES:
        return
    before = dict(child.state.continuation.pending_failures or {})
    mark_in_flight(child, batched=batched)
    if (child.state.continuation.pending_failures or {}) != before:
        child.persist()


def _lost_error(run: ExecutionRun, label: str) -> dict[str, Any]:
    """What ``compensate`` receives (as a ``StepFailed``) if the unit never runs again."""
    return StepFailed(
        f"the delivery running {label!r} of {run.reactor_path} was lost (its process ended) "
        "before the step's result was recorded, and the run ended before the step ran again: "
        "its body may have run, in part or in full",
        reactor=run.reactor_path,
        step=label,
    ).as_dict()
