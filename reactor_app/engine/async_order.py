"""Where a succeeded ``async_step`` enters its parent's rollback log.

WHY: the log is walked newest first by the rollback, and it is in the order steps completed —
except an async step's entry, written only when its result is settled: when a later step reads
it, or when a rollback waits for it (``engine.children``). Appended then, an async step nobody
read was undone first, before steps that completed after it. So while async steps are pending,
each entry a step adds first marks the ones that have ended (``note_ended_children``: the step
whose entry came after), and a settled one is inserted before that entry (``log_position``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reactor_app.engine.state import AsyncChild
from reactor_app.models import Execution
from reactor_app.status import TERMINAL_STATUSES

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun


def note_ended_children(run: ExecutionRun, step: str) -> None:
    """Before ``step``'s entry joins the rollback log: mark the async steps not read yet that
    have ended by now, so that they enter the log before it (``log_position``). One query,
    only while such a child is pending and unmarked."""
    pending = run.state.children.pending_async
    if not pending:
        return
    unmarked = {
        entry["child"]: entry
        for entry in pending.values()
        if entry["kind"] == "async_step" and "before" not in entry
    }
    if not unmarked:
        return
    ended = Execution.objects.filter(pk__in=list(unmarked), status__in=TERMINAL_STATUSES)
    for child_id in ended.values_list("pk", flat=True):
        unmarked[str(child_id)]["before"] = step


def log_position(run: ExecutionRun, entry: AsyncChild) -> int:
    """Where a settled async step enters the rollback log: before the entry of the first step
    that completed after it ended (``note_ended_children``), else last. Its result is settled
    when a later step reads it, or when a rollback waits for it; appended then, it was undone
    before steps that completed after it — the rollback walks the log newest first, so it is
    now undone in its place by completion."""
    before = entry.get("before")
    if before is not None:
        for at, record in enumerate(run.state.completed):
            if record.step == before:
                return at
    return len(run.state.completed)
