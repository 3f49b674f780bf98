"""Where an entry enters a rollback log: its stamp, and the place of a settled ``async_step``.

WHY: the log is walked newest first by the rollback, and it is in the order steps completed —
except an async step's entry, written only when its result is settled: when a later step reads
it, or when a rollback waits for it (``engine.children``). Appended then, an async step nobody
read was undone first, before steps that completed after it. So while async steps are pending,
each entry a step adds first marks the ones that have ended (``enter_log``), and a settled one
is placed by when its body completed, never after it was seen ended (``enter_settled``).

The entries of a composed child are in the child's own log, and an async step of its parent
(or of any ancestor) may end between two of them. So every entry carries ``at``, when its body
returned, kept growing across the whole tree (never below the newest entry of its own log, of
its ancestors' logs, or of any stamp this process gave the tree), and an entry a composed child
adds marks the ended async steps of its ancestors too (``before_at``). The rollback merges the
logs by those stamps (``engine.undo_order``).

Why the body's own time and not when the engine saw it: an async step that completes just
before a step in the run may be seen ended only after that step's entry is written (its worker
still recording it); observation alone put it after, undone first.
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING

from reactor_app.engine.state import AsyncChild, CompletedStep
from reactor_app.models import Execution
from reactor_app.status import TERMINAL_STATUSES

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun

#: the newest stamp given to each tree (by its root run) in this process: a composed child's
#: entries are not in its parent's log, yet the parent's next entry must come after them
_TREE_CLOCKS: weakref.WeakKeyDictionary[ExecutionRun, int] = weakref.WeakKeyDictionary()


def lineage(run: ExecutionRun) -> list[ExecutionRun]:
    """``run`` and the runs it is composed into, innermost first."""
    runs = []
    current: ExecutionRun | None = run
    while current is not None:
        runs.append(current)
        current = current.parent
    return runs


def stamp(run: ExecutionRun, at: int | None = None) -> int:
    """A stamp for ``run``'s tree: ``at`` (when a body returned; default now), but after
    every entry stamped before it that ``run`` can see (its log and its ancestors', this
    process's stamps of the tree), so that a clock that steps back, or another machine's,
    never reorders a tree's entries."""
    latest = _TREE_CLOCKS.get(run.root, 0)
    for member in lineage(run):
        for record in reversed(member.state.completed):
            if record.at is not None:
                latest = max(latest, record.at)
                break
    stamped = max(time.time_ns() if at is None else at, latest + 1)
    _TREE_CLOCKS[run.root] = stamped
    return stamped


def enter_log(run: ExecutionRun, record: CompletedStep) -> None:
    """Append ``record`` to ``run``'s log, stamped (``record.at``, when its body returned, or
    for a composed child the newest of its entries, is kept unless an entry before it is
    newer); first mark the async steps not read yet that have ended by now — ``run``'s and its
    ancestors' — with the latest their entries may take (``enter_settled``). One query, only
    while such a child is pending and unmarked."""
    record.at = stamp(run, record.at)
    unmarked: dict[str, tuple[ExecutionRun, AsyncChild]] = {}
    for member in lineage(run):
        for entry in (member.state.children.pending_async or {}).values():
            if entry["kind"] == "async_step" and not {"before", "before_at"} & entry.keys():
                unmarked[entry["child"]] = (member, entry)
    if unmarked:
        ended = Execution.objects.filter(pk__in=list(unmarked), status__in=TERMINAL_STATUSES)
        seen = max(time.time_ns(), record.at)
        for child_id in ended.values_list("pk", flat=True):
            member, entry = unmarked[str(child_id)]
            entry["before_at"] = seen
    run.state.completed.append(record)


def enter_settled(
    run: ExecutionRun, entry: AsyncChild, record: CompletedStep, completed_at: int | None
) -> None:
    """Place a settled async step's ``record`` in ``run``'s log by when its body completed
    (``completed_at``, its own clock), kept between when it was dispatched and when it was
    first seen ended (``enter_log``; else now): a worker's clock off by more than that window
    cannot move it past an entry it surely came before or after. Its result is settled when a
    later step reads it, or when a rollback waits for it; appended then, it was undone before
    steps that completed after it — the rollback walks the log newest first, so it is now
    undone in its place by completion."""
    log = run.state.completed
    before = entry.get("before")  # marked by a pass of a version without stamps
    if before is not None and "before_at" not in entry:
        for position, other in enumerate(log):
            if other.step == before:
                record.at = None if other.at is None else other.at - 1
                log.insert(position, record)
                return
    latest = entry.get("before_at") or stamp(run)
    at = latest if completed_at is None else min(completed_at, latest)
    at = max(at, entry.get("since", 0))
    record.at = at
    after = next((i for i, r in enumerate(log) if r.at is not None and r.at > at), len(log))
    log.insert(after, record)
    _TREE_CLOCKS[run.root] = max(_TREE_CLOCKS.get(run.root, 0), at)
