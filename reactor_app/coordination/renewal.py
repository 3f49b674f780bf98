"""Keeping holds alive while the protected work runs (docs/design.md §2.6).

``Renewal`` is a daemon thread started for one ``Admitted``: every ``interval`` seconds
(a third of the shortest lease, so two renewals can fail before a lease lapses) it renews

* locks declared with ``auto_extend`` — only while still owned by this owner with this fencing
  token (``lua/extend.lua``);
* semaphore leases — a live holder keeps its slot however long the work takes, while a dead
  one's lease still lapses;
* period reservations — a live holder keeps its bucket in flight however long the work takes,
  while a dead one's reservation still lapses;
* ordered-lock positions — a heartbeat, so a slow but live head is not passed over.

If a hold is found gone or taken over, or Redis stays unreachable for longer than the
shortest lease (so the lease has lapsed for sure), ``lost`` is set to a ``LeaseLost`` and
``on_lost`` is called once; the thread then stops. ``on_extended(key, granted_ms)`` is called
after each successful renewal, once per renewed lock or semaphore lease. The engine checks
``lost`` (or calls ``raise_if_lost``) at its checkpoints. Period reservations are renewed
without ``on_extended`` calls (the callback names only a key, which a lock may share).
``stop()`` wakes the thread through an Event and joins it, so it returns promptly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

from reactor_app.coordination.admission import Coordinator, Extended, lease_lost
from reactor_app.coordination.claims import (
    Admitted,
    Hold,
    LockClaim,
    OrderedLockClaim,
    PeriodClaim,
    SemaphoreClaim,
)
from reactor_app.exceptions import CoordinationUnavailable, LeaseLost

logger = logging.getLogger(__name__)


def _renewable(hold: Hold) -> bool:
    claim = hold.claim
    if isinstance(claim, LockClaim):
        return claim.auto_extend
    return isinstance(claim, SemaphoreClaim | OrderedLockClaim | PeriodClaim)


def _lease_seconds(hold: Hold) -> float:
    claim = hold.claim
    if isinstance(claim, OrderedLockClaim):
        return claim.poison_pill_timeout
    assert isinstance(claim, LockClaim | SemaphoreClaim | PeriodClaim)
    return claim.ttl


class Renewal:
    """Auto-extend / heartbeat thread for one admission. Use as a context manager, or
    ``start()`` / ``stop()``."""

    def __init__(
        self,
        admitted: Admitted,
        *,
        coordinator: Coordinator | None = None,
        on_lost: Callable[[LeaseLost], None] | None = None,
        on_extended: Callable[[str, int], None] | None = None,
        interval: float | None = None,
    ) -> None:
        self.admitted = admitted
        self.coordinator = coordinator or Coordinator()
        self.on_lost = on_lost
        self.on_extended = on_extended
        self.holds = [hold for hold in admitted.holds if _renewable(hold)]
        self.leases = [h for h in self.holds if not isinstance(h.claim, OrderedLockClaim)]
        self.positions = [h for h in self.holds if isinstance(h.claim, OrderedLockClaim)]
        #: the shortest lease (seconds): past it without a renewal the hold is surely gone
        self.shortest_lease = min((_lease_seconds(h) for h in self.holds), default=0.0)
        self.interval = interval if interval is not None else self.shortest_lease / 3
        self.lost: LeaseLost | None = None
        self.renewals = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def needed(self) -> bool:
        """False when nothing of the admission needs renewing (no thread is started)."""
        return bool(self.holds)

    def start(self) -> Renewal:
        if self.needed and self._thread is None:
            name = ",".join(h.claim.key for h in self.holds)
            self._thread = threading.Thread(
                target=self._run, name=f"reactor-renewal[{name}]", daemon=True
            )
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def raise_if_lost(self) -> None:
        if self.lost is not None:
            raise self.lost

    def __enter__(self) -> Renewal:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        last_success = time.monotonic()
        pause = self.interval
        while not self._stopping.wait(pause):
            try:
                lost = self._renew_once()
            except CoordinationUnavailable as exc:
                if time.monotonic() - last_success >= self.shortest_lease:
                    self._lose(self.holds[0], f"Redis unreachable for the whole lease: {exc}")
                    return
                # try again sooner: the lease is running out
                pause = max(self.interval / 3, 0.01)
                logger.warning("renewal of %s failed, retrying: %s", self._keys(), exc)
                continue
            except Exception:  # never let the thread die silently
                logger.exception("renewal of %s crashed", self._keys())
                pause = max(self.interval / 3, 0.01)
                continue
            if lost is not None:
                self._lose(*lost)
                return
            last_success = time.monotonic()
            pause = self.interval

    def _renew_once(self) -> tuple[Hold, str] | None:
        owner = self.admitted.holder.owner
        extended = self.coordinator.extend(self.leases, owner) if self.leases else Extended()
        if extended.lost:
            return extended.lost[0]
        for hold in self.positions:
            assert isinstance(hold.claim, OrderedLockClaim)
            if not self.coordinator.heartbeat(hold.claim):
                return hold, "position reset, skipped or passed over"
        self.renewals += 1
        if self.on_extended is not None:
            for hold, granted_ms in zip(extended.extended, extended.granted_ms, strict=True):
                if not isinstance(hold.claim, PeriodClaim):
                    self.on_extended(hold.claim.key, granted_ms)
        return None

    def _lose(self, hold: Hold, reason: str) -> None:
        self.lost = lease_lost(hold, self.admitted.holder, reason)
        logger.warning("%s", self.lost.message)
        if self.on_lost is not None:
            try:
                self.on_lost(self.lost)
            except Exception:
                logger.exception("on_lost callback failed")

    def _keys(self) -> str:
        return ", ".join(f"{h.claim.primitive}:{h.claim.key}" for h in self.holds)


def start_renewal(
    admitted: Admitted,
    *,
    coordinator: Coordinator | None = None,
    on_lost: Callable[[LeaseLost], None] | None = None,
    on_extended: Callable[[str, int], None] | None = None,
) -> Renewal | None:
    """Start a ``Renewal`` when the admission has anything to renew; else None."""
    renewal = Renewal(admitted, coordinator=coordinator, on_lost=on_lost, on_extended=on_extended)
    return renewal.start() if renewal.needed else None
