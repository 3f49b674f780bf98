"""Ending a run that was asked to stop (the engine's side of ``engine.cancel``).

``end_cancelled`` rolls the run back like a failure and ends it ``cancelled``; for a run that is
not inside a pass (stopped before its gate, or an idle execution the canceller ends itself) it
also lets go of what the execution still holds and wakes the waiters.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from reactor_app.coordination.admission import Coordinator
from reactor_app.engine.cancel_flag import cancelled_error
from reactor_app.engine.enqueueing import wake
from reactor_app.engine.leftovers import (
    abandon_positions,
    leave_lines,
    release_kept,
    release_registry,
)
from reactor_app.engine.outcomes import PassEnd, RunEnd
from reactor_app.engine.rollback_progress import roll_back_to, rolling_back
from reactor_app.engine.settling import children_to_settle
from reactor_app.engine.time_slice import DeliveryTimeUp, stops_delivery
from reactor_app.engine.worker import ClaimLost

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun

logger = logging.getLogger(__name__)


def end_cancelled(run: ExecutionRun, request: dict[str, Any], *, gate_held: bool) -> RunEnd:
    """Roll ``run`` back and end it ``cancelled``.

    ``gate_held``: the reactor-level gate of this pass is entered (its holds are released by
    ``execute``'s ``finally`` with outcome ``halt``). Otherwise (a pass that stopped before its
    gate, or the canceller of an idle execution) the holds it kept across a park, its registry
    entries and its ordered positions are let go here, after the rollback."""
    error = cancelled_error(request, run.execution_id, reactor=run.reactor_path)
    end = RunEnd(PassEnd.CANCELLED, error=error)
    try:
        if run.state.completed or children_to_settle(run) or rolling_back(run) is not None:
            end = roll_back_to(run, PassEnd.CANCELLED, error, [])
    except ClaimLost:
        raise
    except Exception as exc:  # a rollback bug must not leave the run neither here nor there
        if stops_delivery(run.root.time_slice, exc):
            raise DeliveryTimeUp("rollback cut off by its time limit") from exc
        logger.exception("rollback of cancelled %s failed", run.execution_id)
        run.state.continuation.rolling_back = None  # ends here: no pass goes on with it
        end.rollback_failures.append(
            {"step": None, "kind": "undo", "reason": "error", "error": str(exc)}
        )
    if not gate_held:
        _let_go(run)
    return end


def _let_go(run: ExecutionRun) -> None:
    """Release what an execution that is not inside a pass still holds; wake the waiters."""
    coordinator = Coordinator()
    woken = release_kept(run, coordinator)
    woken += release_registry(run, coordinator)
    woken += abandon_positions(run, coordinator)
    leave_lines(run, coordinator)
    if woken:
        wake(woken)
