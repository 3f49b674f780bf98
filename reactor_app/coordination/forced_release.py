"""Removing a hold by force: an operator's verb for a lock or semaphore whose holder is stuck.

Whatever its nesting, the hold goes (``lua/force_release.lua``), with its live-holds index
entry, and the waiters are woken; the holder finds out at its next renewal (``LeaseLost``).
Ordered locks have ``skip`` and ``reset`` instead (``coordination.ordered_lock``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reactor_app.coordination import holds_index, primitives
from reactor_app.coordination.redis import is_cluster
from reactor_app.coordination.scripts import Status, scripts_for

if TYPE_CHECKING:
    from reactor_app.coordination.admission import Coordinator


@dataclass(frozen=True)
class ForceReleased:
    released: list[str] = field(default_factory=list)  # owners whose hold was removed
    woken: list[str] = field(default_factory=list)


def force_release(
    coordinator: Coordinator,
    primitive: str,
    key: str,
    owner: str | None = None,
    *,
    hand_on: bool = True,
) -> ForceReleased:
    """Remove a lock (or a semaphore's holders, or one owner's slot) whatever its nesting.
    Ordered locks have ``skip``/``reset`` instead.

    ``hand_on``: a freed lock is granted to its head waiter for a moment, as a release grants
    it (an operator's release, a tree that ends). False for a delivery dropping the stale holds
    of the dead one it takes over from (``engine.worker.drop_stale_holds``): it takes them
    again at once, and a grant to a waiter would let that waiter run inside its workflow."""
    prefix = coordinator.prefix
    if not primitives.holds(primitive):
        raise ValueError(
            f"force_release supports 'lock' and 'semaphore', not {primitive!r} "
            "(use skip/reset for an ordered lock)"
        )
    keys = primitives.holding(primitive).force_release_keys(key, prefix)
    args = [primitive, owner or "", key, "1" if hand_on else "0"]
    keys += holds_index.keys_for(key, prefix, sharded=is_cluster(coordinator.client))
    reply = scripts_for(coordinator.client).run(
        "force_release", keys, args, key=key, primitive=primitive
    )
    if reply.status is Status.NOT_FOUND:
        return ForceReleased()
    return ForceReleased(
        released=list(reply.data.get("released", [])), woken=list(reply.data.get("woken", []))
    )
