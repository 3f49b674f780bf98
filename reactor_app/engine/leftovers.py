"""What an execution still holds outside a pass, and letting go of it.

A worker execution that parked keeps things between its deliveries: reactor-level holds kept
across the park (``state.continuation.kept_holds``), positions in ordered lines
(``state.ordered``), its places in waiter lines (``ContentionState`` rows) and the entries of
its tree's held-key registry. When it ends without another pass — cancelled while idle
(``engine.cancelled``), or a composed child whose tree ended before resuming it
(``engine.settling.settle_composed``) — these are given back here. Each function returns the
parked waiters its releases let through; the caller wakes them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

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
from reactor_app.engine.state import kept_hold
from reactor_app.exceptions import ReactorError
from reactor_app.models import ContentionState

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun

logger = logging.getLogger(__name__)


def _holder(run: ExecutionRun) -> Holder:
    return Holder(owner=run.owner, execution_id=run.execution_id, reactor=run.reactor_path)


def release_kept(run: ExecutionRun, coordinator: Coordinator) -> list[str]:
    """Release the holds ``run`` kept across a park. Their entries stay in the tree's
    registry (another unit of the tree may hold the same key re-entrantly): a leftover entry
    costs a takeover only a no-op force-release."""
    entries, run.state.continuation.kept_holds = run.state.continuation.kept_holds, None
    kept = [hold for entry in entries or [] if (hold := kept_hold(entry))]
    if not kept:
        return []
    try:
        return list(coordinator.release(Admitted(holds=kept, holder=_holder(run)), "halt").woken)
    except ReactorError:
        logger.warning("could not release the kept holds of %s", run.execution_id)
        return []


def release_registry(run: ExecutionRun, coordinator: Coordinator) -> list[str]:
    """Force-release whatever the tree's registry lists: what a worker delivery announced and
    never withdrew (it died, or parked keeping it). Only for a tree that is ending: the
    registry is the whole tree's."""
    woken: list[str] = []
    registry = HoldRegistry(run.owner)
    try:
        entries = registry.entries()
        for primitive, key, _step in entries:
            woken += coordinator.force_release(primitive, key, owner=run.owner).woken
        registry.withdraw([(primitive, key) for primitive, key, _ in entries])
    except (ReactorError, ValueError):
        logger.warning("could not release the registry holds of %s", run.execution_id)
    return woken


def abandon_positions(run: ExecutionRun, coordinator: Coordinator) -> list[str]:
    """Complete ``run``'s ordered positions without running: the line moves on past them (not
    a failure: a strict line goes on)."""
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
    if not positions:
        return []
    try:
        holder = _holder(run)
        woken = list(coordinator.release(Admitted(holds=positions, holder=holder), "halt").woken)
    except ReactorError:
        logger.warning("could not abandon the ordered positions of %s", run.execution_id)
        return []
    run.state.ordered.clear()
    return woken


def leave_lines(run: ExecutionRun, coordinator: Coordinator) -> None:
    """Leave the waiter lines ``run`` is parked in: a release would otherwise hand the key to a
    waiter that will never come (the grant only lapses after a moment)."""
    for row in ContentionState.objects.filter(execution_id=run.execution_id):
        # the waiters of a hold (a lock, a semaphore slot: ``Primitive.HOLDS``)
        if primitives.holds(row.primitive):
            waited = primitives.holding(row.primitive).hold_claim(row.key, 1)
            try:
                coordinator.unregister_waiter(waited, run.owner)
            except ReactorError:
                logger.warning("could not leave the waiters of %s %r", row.primitive, row.key)
    ContentionState.objects.filter(execution_id=run.execution_id).delete()
