"""Ending a run that was asked to stop (the engine's side of ``engine.cancel``).

``end_cancelled`` rolls the run back like a failure and ends it ``cancelled``; for a run that is
not inside a pass (stopped before its gate, or an idle execution the canceller ends itself) it
also lets go of what the execution still holds and wakes the waiters.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from reactor_app.coordination import primitives
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    Admitted,
    Hold,
    Holder,
    OrderedLockClaim,
    OrderedPosition,
)
from reactor_app.coordination.registry import HoldRegistry
from reactor_app.engine.cancel_flag import cancelled_error
from reactor_app.engine.children import children_to_settle, settle_children
from reactor_app.engine.enqueueing import wake
from reactor_app.engine.outcomes import PassEnd, RunEnd
from reactor_app.engine.rollback import roll_back
from reactor_app.engine.state import kept_hold
from reactor_app.exceptions import ReactorError
from reactor_app.models import ContentionState

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun

logger = logging.getLogger(__name__)


def end_cancelled(run: ExecutionRun, request: dict[str, Any], *, gate_held: bool) -> RunEnd:
    """Roll ``run`` back and end it ``cancelled``.

    ``gate_held``: the reactor-level gate of this pass is entered (its holds are released by
    ``execute``'s ``finally`` with outcome ``halt``). Otherwise (a pass that stopped before its
    gate, or the canceller of an idle execution) the holds it kept across a park, its registry
    entries and its ordered positions are let go here, after the rollback."""
    failures: list[dict[str, Any]] = []
    try:
        if run.state.completed or children_to_settle(run):
            failures = settle_children(run) + roll_back(run)
    except Exception as exc:  # a rollback bug must not leave the run neither here nor there
        logger.exception("rollback of cancelled %s failed", run.execution_id)
        failures.append({"step": None, "kind": "undo", "reason": "error", "error": str(exc)})
    if not gate_held:
        _let_go(run)
    error = cancelled_error(request, run.execution_id, reactor=run.reactor_path)
    return RunEnd(PassEnd.CANCELLED, error=error, rollback_failures=failures)


def _let_go(run: ExecutionRun) -> None:
    """Release what an execution that is not inside a pass still holds; wake the waiters."""
    coordinator = Coordinator()
    holder = Holder(owner=run.owner, execution_id=run.execution_id, reactor=run.reactor_path)
    woken: list[str] = []
    kept_entries, run.state.continuation.kept_holds = run.state.continuation.kept_holds, None
    kept = [h for e in kept_entries or [] if (h := kept_hold(e))]
    if kept:
        try:
            woken += coordinator.release(Admitted(holds=kept, holder=holder), "halt").woken
        except ReactorError:
            logger.warning("could not release the kept holds of %s", run.execution_id)
    # whatever a worker delivery announced and never withdrew (it died, or parked keeping it)
    registry = HoldRegistry(run.owner)
    try:
        for primitive, key, _step in registry.entries():
            outcome = coordinator.force_release(primitive, key, owner=run.owner)
            woken += outcome.woken
        registry.withdraw([(p, k) for p, k, _ in registry.entries()])
    except (ReactorError, ValueError):
        logger.warning("could not release the registry holds of %s", run.execution_id)
    # the line moves on past this execution's positions (not a failure: a strict line goes on)
    positions = [
        Hold(
            claim=OrderedLockClaim(
                key=str(p["key"]),
                position=OrderedPosition(nonce=int(p["nonce"]), epoch=int(p["epoch"])),
            ),
            fresh=True,
        )
        for p in run.state.ordered.values()
        if isinstance(p, dict) and p.get("key")
    ]
    if positions:
        try:
            woken += coordinator.release(Admitted(holds=positions, holder=holder), "halt").woken
        except ReactorError:
            logger.warning("could not abandon the ordered positions of %s", run.execution_id)
        run.state.ordered.clear()
    # leave the lines it waited in: a release would otherwise hand the key to a waiter that
    # will never come (the grant only lapses after a moment)
    for row in ContentionState.objects.filter(execution_id=run.execution_id):
        # the waiters of a hold (a lock, a semaphore slot: ``Primitive.HOLDS``)
        if primitives.holds(row.primitive):
            waited = primitives.holding(row.primitive).hold_claim(row.key, 1)
            try:
                coordinator.unregister_waiter(waited, run.owner)
            except ReactorError:
                logger.warning("could not leave the waiters of %s %r", row.primitive, row.key)
    ContentionState.objects.filter(execution_id=run.execution_id).delete()
    if woken:
        wake(woken)
