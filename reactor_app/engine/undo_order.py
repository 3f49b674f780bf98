"""The order a rollback undoes in: newest first by completion, across a tree's logs.

WHY: a run's rollback log holds one entry for a composed child that succeeded, while the
child's steps are in the child's own log (and one for a map, its elements inside it); and an
async step of the run (or of a run it is composed into) can end between two of the child's
steps, or two of the map's elements. Undoing the child's log as one block (or a failing
child's log before its parents settle their async steps) undid by kind, not by completion.
So a rollback first lays out every entry it undoes: its own, those of the composed children
in it (recursively), a map's elements one by one, and — when the run is itself a composed
child rolling back first — its ancestors' settled async steps that ended after its oldest
entry; and sorts them by their stamp (``engine.async_order``). An entry of a log written
before stamps existed takes the stamp of the entry before it, so such a log keeps its order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from reactor_app.engine.async_order import lineage
from reactor_app.engine.state import CompletedStep

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun


@dataclass
class Undo:
    """One entry to undo, and the run whose owner and holds undo it."""

    at: int
    owner: ExecutionRun
    record: CompletedStep


@dataclass
class UndoPlan:
    """What a rollback undoes, newest first (an ancestor's entry among them is undone here,
    so it leaves the ancestor's log: ``engine.rollback.roll_back``); the composed children
    whose logs it empties."""

    undos: list[Undo]
    children: list[ExecutionRun]


def plan_undos(run: ExecutionRun, *, with_ancestors: bool) -> UndoPlan:
    """Every entry ``run``'s rollback undoes, newest first; ``with_ancestors``: ``run`` is a
    composed child rolling back before its ancestors (see the module docstring)."""
    undos: list[Undo] = []
    children: list[ExecutionRun] = []
    _lay_out(run, run.state.completed, 0, undos, children)
    if with_ancestors and undos:
        oldest = min(undo.at for undo in undos)
        for ancestor in lineage(run)[1:]:
            undos.extend(
                Undo(record.at, ancestor, record)
                for record in ancestor.state.completed
                if _async_entry(record) and record.at is not None and record.at > oldest
            )
    undos.sort(key=lambda undo: undo.at)  # stable: entries of one stamp keep their log order
    undos.reverse()
    return UndoPlan(undos, children)


def _async_entry(record: CompletedStep) -> bool:
    """A settled ``async_step``'s entry (the only kind a run adds while a child it composed is
    running)."""
    return record.kind == "step" and record.child_execution is not None


def _lay_out(
    owner: ExecutionRun,
    records: list[CompletedStep],
    floor: int,
    undos: list[Undo],
    children: list[ExecutionRun],
) -> None:
    at = before = floor
    for record in records:
        at = record.at if record.at is not None else at
        if record.kind == "map" and any(e.get("at") is not None for e in record.elements):
            # its elements one by one: an async step may have ended between two of them; each
            # by its body's clock (a worker's, for a parallel map), kept between the step
            # entry before the map and the map's own
            for element in record.elements:
                one = CompletedStep(step=record.step, kind="map", elements=[element])
                undos.append(Undo(min(max(element.get("at") or at, before), at), owner, one))
            before = at
            continue
        if record.kind != "compose":
            undos.append(Undo(at, owner, record))
            if not _async_entry(record):  # one may have ended inside the next entry's span
                before = at
            continue
        child = owner.child_run(record.child_execution) if record.child_execution else None
        if child is not None:
            children.append(child)
            # an unstamped child entry sorts where the compose entry before it would
            _lay_out(child, child.state.completed, at, undos, children)
        before = at
