"""``coordination_state()``: what Redis holds right now, in the terms a test asserts on.

A thin, read-only view over the coordination layer's own readers (``coordination.state``):
nothing here knows a key layout or talks to Redis directly, so a test reads exactly what the
admin and the API read. Every call reads afresh — a state object is a lens, not a snapshot —
and resolves the client and ``REACTOR_KEY_PREFIX`` at call time unless they were given, so it
follows ``settings`` overrides (and the per-test key space of the pytest plugin).

::

    state = coordination_state()
    state.lock("acct:1")              # LockState(held, owner, step, count, ttl, token, ...)
    state.semaphore("pool:1")         # SemaphoreState(limit, held, available, holders)
    state.rate_limit("sms:1", "minute")   # admissions counted in the current window
    state.period_marked("report:1", "hour")
    state.ordered_lock("line:1")      # OrderedLockState(next, last_completed, in_flight, ...)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from reactor_app.coordination import state as readers
from reactor_app.coordination.lock import LockState
from reactor_app.coordination.ordered_lock import OrderedLockState
from reactor_app.coordination.semaphore import SemaphoreHolder, SemaphoreState

__all__ = [
    "CoordinationState",
    "LockState",
    "OrderedLockState",
    "SemaphoreHolder",
    "SemaphoreState",
    "coordination_state",
]


@dataclass(frozen=True)
class CoordinationState:
    """Read-only access to live coordination state; see the module docstring.

    ``client`` and ``prefix`` default to the coordination Redis and ``REACTOR_KEY_PREFIX``
    as configured when each method is called.
    """

    client: Any = None
    prefix: str | None = None

    def lock(self, key: str) -> LockState:
        """The lock on ``key``: ``held``, ``owner``, ``step`` (None at reactor level),
        ``execution``, ``count`` (nesting), ``ttl`` (seconds left), ``token`` and
        ``last_token`` (the latest fencing token ever issued for the key, held or not)."""
        return readers.lock_state(key, client=self.client, prefix=self.prefix)

    def semaphore(self, key: str, limit: int | None = None) -> SemaphoreState:
        """The semaphore on ``key``: ``held`` (live leases), ``holders`` (with their step and
        lease time left) and, when ``limit`` is given, ``available`` slots."""
        return readers.semaphore_state(key, limit, client=self.client, prefix=self.prefix)

    def rate_limit(
        self, key: str, window: str | float | timedelta, *, strategy: str = "sliding"
    ) -> int:
        """Admissions of ``key`` counted now in its window of that length (``"second"``,
        ``"minute"``, ``"hour"``, ``"day"`` or seconds) — the window must be one the
        declaration uses."""
        return readers.rate_limit_count(
            key, window, strategy=strategy, client=self.client, prefix=self.prefix
        )

    def period_marked(self, key: str, every: str | int) -> bool:
        """True when the current ``every`` bucket of ``key`` is marked (the work already ran
        successfully in it, so the next run is skipped or halted)."""
        return self.period_marked_by(key, every) is not None

    def period_marked_by(self, key: str, every: str | int) -> str | None:
        """The execution (else owner) that marked the current bucket, or None."""
        return readers.period_marked(key, every, client=self.client, prefix=self.prefix)

    def period_reserved(self, key: str, every: str | int) -> dict[str, Any] | None:
        """The live in-flight reservation of the current bucket — ``owner``, ``count``,
        ``step``, ``execution``, ``reactor``, ``acquired_at`` (ms), ``ttl`` (s left) — or None
        when no run holds it (done, free, or its holder's lease lapsed)."""
        return readers.period_reserved(key, every, client=self.client, prefix=self.prefix)

    def ordered_lock(self, key: str) -> OrderedLockState:
        """The line of ``key``: ``next`` (the position the next arrival gets),
        ``last_completed`` (the cursor), ``head``, ``in_flight``, ``first_failed`` (strict
        mode) and the waiting ``positions``."""
        return readers.ordered_state(key, client=self.client, prefix=self.prefix)

    def holds(self) -> list[dict[str, Any]]:
        """Every live lock and semaphore hold under the prefix, with its attribution (the
        rows of the admin's Coordination page)."""
        return readers.live_holds(client=self.client, prefix=self.prefix)


def coordination_state(*, client: Any = None, prefix: str | None = None) -> CoordinationState:
    """A ``CoordinationState`` for the configured Redis and key prefix (or the ones given)."""
    return CoordinationState(client=client, prefix=prefix)
