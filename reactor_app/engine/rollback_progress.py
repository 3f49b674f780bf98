"""A worker's rollback, resumable: once a run decides to roll back, a redelivery goes on with
the rollback — never with the steps.

WHY: a delivery that died inside a rollback (its worker child killed while an undo ran) was
redelivered from its last checkpoint, which knew nothing of the rollback. The redelivery ran
the failing step's body again and, when it failed again, undid every completed step a second
time — and had the body succeeded on that second try, the run would have ended ``succeeded``
with the effects the first rollback had undone still undone. Both break the saga promise
(docs/reactors-and-steps.md, "The promise under cancel and retry").

So on a worker, before a run's rollback does anything (before it settles its children), its
state records that the run is rolling back and what it ends in — the status (``failed`` or
``cancelled``), the error and the failures so far — in one durable write
(``Continuation.rolling_back``). The rollback then counts its hooks as they run
(``engine.rollback.HookCount``), each count written like a checkpoint. A pass that finds the
record (a redelivery, or the sweeper's re-send) enters the reactor gate as every pass does and
then goes on with the rollback: it settles the children again (waiting for async children is
idempotent; a failed attempt waiting for its retry is compensated, as before), lays out the
same undos from the same log, passes over the hooks counted, and ends as recorded. The hook
that was running when the delivery died runs again — at least once, like a step body killed
mid-run (docs/operations.md, "Checkpoints"); every other hook runs once.

A composed child that fails rolls itself back first, in the same delivery: it records its own
rollback in its own row, and the redelivery, which continues the child
(``state.children.composed``), finds it there. A composed child the tree was parked in when
it ended is rolled back by its parent's settling (``engine.settling.settle_composed``), which
records that rollback in the child's row the same way.

The failing step's own compensate runs in the runner, with the step, before the record: a
delivery that dies there re-runs that step, as one that died in its body does.

In process nothing resumes a run from its row, so nothing is recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reactor_app.engine.outcomes import PassEnd, RunEnd
from reactor_app.engine.rollback import record_rollback, recorded_end, roll_back
from reactor_app.engine.settling import settle_children
from reactor_app.engine.state import RollingBack
from reactor_app.exceptions import ReactorError

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun


def rolling_back(run: ExecutionRun) -> RollingBack | None:
    """The rollback under way that this pass goes on with, or None."""
    return run.state.continuation.rolling_back


def roll_back_to(
    run: ExecutionRun,
    status: PassEnd,
    error: ReactorError | None,
    failures: list[dict[str, Any]],
) -> RunEnd:
    """Settle ``run``'s children and undo its completed steps, then end it ``status`` with
    ``error``, reporting ``failures`` and what could not be rolled back. A rollback already
    under way (recorded by an earlier pass) is gone on with, and ends as it recorded."""
    mark = record_rollback(run, status, error, failures)
    if mark is None:
        failures = list(failures) + settle_children(run)
        failures += roll_back(run)
        return RunEnd(status, error=error, rollback_failures=failures)
    settled = settle_children(run)
    roll_back(run)  # its hooks' failures go into the mark as each runs
    return recorded_end(run, mark, settled)


def go_on(run: ExecutionRun) -> RunEnd:
    """The pass of a run whose rollback is under way: finish it (``roll_back_to``)."""
    return roll_back_to(run, PassEnd.FAILED, None, [])
