"""Keeping holds alive while the protected work runs (docs/design.md §2.6).

A ``Renewal`` covers one ``Admitted``: every ``interval`` seconds (a third of the shortest
lease, so two renewals can fail before a lease lapses) it renews

* locks declared with ``auto_extend`` — only while still owned by this owner with this fencing
  token (``lua/extend.lua``);
* semaphore leases — a live holder keeps its slot however long the work takes, while a dead
  one's lease still lapses;
* period reservations — a live holder keeps its bucket in flight however long the work takes,
  while a dead one's reservation still lapses;
* ordered-lock positions — a heartbeat, so a slow but live head is not passed over.

Renewals do not get a thread each: one ``RenewalScheduler`` thread per process keeps every
active renewal in a deadline heap, wakes at the earliest deadline (or after ``IDLE_LOOK`` with
nothing due, so a new renewal due later than that need not wake it), and renews every hold due
by then (and those due within a fifth of their interval, so holds taken at nearly the same
time share a trip) in ONE pipeline of ``extend`` script calls (docs/operations.md).

A lease is lost by the clock as well as by a failed renewal: once the last successful renewal
— or the admission — is older than the shortest lease by this process's monotonic clock, the
lease has lapsed in Redis for sure (a process paused by SIGSTOP, a stalled VM, a thread starved
for longer than the lease). ``raise_if_lost`` (the engine's checkpoints) says so at once,
without waiting for the scheduler; the scheduler never renews such a hold.

If a hold is found gone or taken over, its lease runs out by the clock, or Redis stays
unreachable for longer than the shortest lease, ``lost`` is set to a ``LeaseLost`` and
``on_lost`` is called once; the renewal then stops. ``on_extended(key, granted_ms)`` is called
after each successful renewal, once per renewed lock or semaphore lease (period reservations
are renewed without it: the callback names only a key, which a lock may share). ``stop()``
removes the renewal and, while a round in flight is renewing it, waits for that part of the
round (its client's pipeline and callbacks: one round trip at most), so no callback runs after
it.

One module, a little over the usual size, on purpose: a ``Renewal`` and the scheduler that
runs it are one protocol — stopping, removing and restarting a renewal while a round may be
renewing it — read together.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from reactor_app import forks
from reactor_app.background import BackgroundThread
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    Admitted,
    Hold,
    LockClaim,
    OrderedLockClaim,
    PeriodClaim,
    SemaphoreClaim,
)
from reactor_app.coordination.leases import Extended
from reactor_app.coordination.refusals import lease_lost
from reactor_app.coordination.renewal_scope import note_started
from reactor_app.exceptions import CoordinationUnavailable, LeaseLost

logger = logging.getLogger(__name__)

#: a renewal due within this fraction of its interval rides along with an earlier one
COALESCE_FRACTION = 0.2

#: a renewal's reasons for a lease gone from Redis (not taken over: that is never early)
GONE = frozenset({"released", "expired"})

#: longest sleep of the renewal thread with nothing due (seconds): it looks at its heap again
#: by then, so ``add`` wakes it only for a renewal due sooner than that. Woken for every
#: admission, the thread found the call already over at each wake (a locked ``Step.call`` is
#: ~1 ms): a futex wake and a context switch per call on the caller's path, for nothing
#: (docs/benchmarks.md, "The renewal thread's wake-ups"). Once a second costs an idle process
#: next to nothing.
IDLE_LOOK = 1.0

#: cleared entries a heap may hold before it is compacted (and then only once they are most
#: of it): compacting is a pass over the heap, paid for by this many removals
COMPACT_AFTER = 256


#: claims renewed for as long as the work runs, besides locks with ``auto_extend`` (a tuple
#: built once: an ``A | B`` union in ``isinstance`` is built anew on every call)
_RENEWED = (SemaphoreClaim, OrderedLockClaim, PeriodClaim)
_WITH_TTL = (LockClaim, SemaphoreClaim, PeriodClaim)


def _renewable(hold: Hold) -> bool:
    claim = hold.claim
    if isinstance(claim, LockClaim):
        return claim.auto_extend
    return isinstance(claim, _RENEWED)


def _lease_seconds(hold: Hold) -> float:
    claim = hold.claim
    if isinstance(claim, OrderedLockClaim):
        return claim.poison_pill_timeout
    assert isinstance(claim, _WITH_TTL)
    return claim.ttl


class Renewal:
    """Auto-extend / heartbeat of one admission, run by the process's ``RenewalScheduler``.
    Use as a context manager, or ``start()`` / ``stop()``."""

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
        #: ordered-lock positions (heartbeats) and the rest (leases renewed by ``extend``)
        self.positions: list[Hold] = []
        self.leases: list[Hold] = []
        for hold in self.holds:
            (self.positions if isinstance(hold.claim, OrderedLockClaim) else self.leases).append(
                hold
            )
        #: the shortest lease (seconds): past it without a renewal the hold is surely gone
        self.shortest_lease = min(map(_lease_seconds, self.holds), default=0.0)
        self.interval = interval if interval is not None else self.shortest_lease / 3
        self.lost: LeaseLost | None = None
        self.renewals = 0
        #: monotonic time the leases were last granted, counted from when the request was
        #: sent (the admission, then each renewal), so never later than the grant in Redis
        self.granted_at = admitted.sent_at or time.monotonic()
        self.stopped = False
        self.due = self.granted_at + self.interval
        self._scheduler: RenewalScheduler | None = None

    @property
    def needed(self) -> bool:
        """False when nothing of the admission needs renewing (nothing is scheduled)."""
        return bool(self.holds)

    def start(self) -> Renewal:
        if self.needed and self._scheduler is None:
            note_started(self)  # first: whatever lands after it, the scope stops this one
            self._scheduler = scheduler()
            self._scheduler.add(self)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.stopped = True
        if self._scheduler is not None:
            self._scheduler.remove(self, timeout)

    def restart(self) -> Renewal:
        """Renew again after ``stop()`` — a release that did not happen (``Gate.exit_unless``:
        the execution was cancelled, its step is compensated under the holds). The leases
        still count from their last grant."""
        self.stopped = False
        self._scheduler = None
        return self.start()

    def expired(self) -> bool:
        """True once the last grant is older than the shortest lease by the monotonic clock."""
        return bool(self.holds) and time.monotonic() - self.granted_at >= self.shortest_lease

    def raise_if_lost(self) -> None:
        if self.lost is None and not self.stopped and self.expired():
            self._lose(self.holds[0], "lease expired by the clock: no renewal for a whole lease")
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

    # -- called by the scheduler --------------------------------------------------------------

    def _renewed(self, sent_at: float, extended: Extended) -> bool:
        """Apply one round's answer for the leases; False when one was lost."""
        if extended.lost:
            hold, reason = extended.lost[0]
            self._lose(hold, self._early(hold, reason, sent_at))
            return False
        for hold in self.positions:
            assert isinstance(hold.claim, OrderedLockClaim)
            if not self.coordinator.heartbeat(hold.claim):
                self._lose(hold, "position reset, skipped or passed over")
                return False
        # the lease counts from when the renewal was sent, never from when the answer came
        self.granted_at = sent_at
        self.renewals += 1
        if self.on_extended is not None:
            for hold, granted_ms in zip(extended.extended, extended.granted_ms, strict=True):
                if isinstance(hold.claim, PeriodClaim):
                    continue
                try:
                    self.on_extended(hold.claim.key, granted_ms)
                except Exception:
                    logger.exception("on_extended callback failed")
        return True

    def _early(self, hold: Hold, reason: str, sent_at: float) -> str:
        """``reason``, and when Redis found the lease gone while this process's monotonic clock
        still gave it time, how much and what can cause that: besides a release or a server
        that lost it, a lease lapses in Redis by the server's wall clock, so a renewal that
        reached the server late, or a step of that clock, ends it sooner than the holder counts
        (docs/coordination.md, "Fencing tokens")."""
        left = _lease_seconds(hold) - (sent_at - self.granted_at)
        if reason not in GONE or left <= 0:
            return reason
        return (
            f"{reason} with {left:.2f} s of its lease left by this process's clock: released "
            "by an operator, lost with a Redis restart or failover, or the renewal reached "
            "Redis late (a stalled thread, server or VM) or the server's clock stepped ahead"
        )

    def _lose(self, hold: Hold, reason: str) -> None:
        if self.lost is not None:
            return
        self.lost = lease_lost(hold, self.admitted.holder, reason)
        logger.warning("%s", self.lost.message)
        if self.on_lost is not None:
            try:
                self.on_lost(self.lost)
            except Exception:
                logger.exception("on_lost callback failed")

    def _keys(self) -> str:
        return ", ".join(f"{h.claim.primitive}:{h.claim.key}" for h in self.holds)


class RenewalScheduler:
    """The one renewal thread of a process: a deadline heap of ``Renewal``s."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        #: id() of the renewals the round in flight is renewing right now (one client's
        #: pipeline and its callbacks): ``remove`` waits only while its renewal is among them
        self._renewing: set[int] = set()
        self._part_done = threading.Condition(self._lock)
        #: [due, order, renewal] entries; a stopped renewal's entry stays until it reaches the
        #: top or the heap is compacted, but with its renewal cleared (``remove``)
        self._heap: list[list[Any]] = []
        #: id() of each renewal not stopped -> its current entry
        self._active: dict[int, list[Any]] = {}
        #: cleared entries, about (one cleared while its round had it out of the heap counts
        #: too): it only decides when to compact
        self._stale = 0
        self._order = itertools.count()
        self._background = BackgroundThread(self._run, "reactor-renewal")
        #: the monotonic deadline the thread is waiting for (inf: no deadline, or busy)
        self._sleeping_until = 0.0
        self.pid = forks.pid()
        #: rounds run and pipelines sent so far (tests and the benchmark read them)
        self.rounds = 0

    @property
    def thread(self) -> threading.Thread | None:
        return self._background.thread

    def add(self, renewal: Renewal) -> None:
        with self._lock:
            self._push(renewal)
            if not self._background.ensure() and renewal.due < self._sleeping_until:
                # due before the thread wakes on its own (its earliest deadline, or IDLE_LOOK
                # with nothing due). Only then: waking it for every hold would cost each
                # admission a context switch.
                self._wake.notify()

    def remove(self, renewal: Renewal, timeout: float = 5.0) -> None:
        with self._lock:
            self._forget(renewal)
            if id(renewal) not in self._renewing:
                return
            # The round in flight is renewing it right now: let that part finish, so nothing
            # runs on its behalf after stop() (a part not begun yet skips stopped renewals).
            # Only its own part: another client's pipeline, stuck on a slow Redis, must not
            # hold up every gate's exit in the process. (Not on the thread itself: a callback
            # of that part stopping its own renewal would wait for itself.)
            if self._background.is_current():
                return
            deadline = time.monotonic() + timeout
            while id(renewal) in self._renewing:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._part_done.wait(timeout=left)

    def _push(self, renewal: Renewal) -> None:
        # called with the lock held; one live entry per renewal, whatever came before
        self._forget(renewal)
        entry: list[Any] = [renewal.due, next(self._order), renewal]
        self._active[id(renewal)] = entry
        heapq.heappush(self._heap, entry)

    def _forget(self, renewal: Renewal) -> None:
        """Stop scheduling ``renewal`` (lock held). Its entry is cleared at once, not left to
        reach the top of the heap: it would keep the renewal — and through its callbacks the
        gate, the claims and the caller's arguments — alive until the renewal's next due time
        (a third of the lease, 20 s for a 60 s lock), so a busy process would carry every
        recent call's objects, and the garbage collector would walk them all
        (docs/benchmarks.md, "Hot path"). Mostly-stale heaps are compacted."""
        entry = self._active.pop(id(renewal), None)
        if entry is None or entry[2] is not renewal:
            return
        entry[2] = None
        self._stale += 1
        if self._stale > COMPACT_AFTER and self._stale > len(self._heap) // 2:
            self._heap = [entry for entry in self._heap if entry[2] is not None]
            heapq.heapify(self._heap)
            self._stale = 0

    def renewing(self) -> list[Renewal]:
        """The renewals scheduled and not stopped: those that renew."""
        with self._lock:
            return [entry[2] for entry in self._active.values() if not entry[2].stopped]

    def _run(self) -> None:
        while True:
            with self._lock:
                while True:
                    while self._heap and self._heap[0][2] is None:
                        heapq.heappop(self._heap)
                        self._stale -= 1
                    if not self._heap:
                        self._sleeping_until = time.monotonic() + IDLE_LOOK
                        self._wake.wait(timeout=IDLE_LOOK)
                        continue
                    self._sleeping_until = self._heap[0][0]
                    left = self._sleeping_until - time.monotonic()
                    if left <= 0:
                        break
                    self._wake.wait(timeout=left)
                self._sleeping_until = 0.0  # busy: whatever is added now is seen after the round
                taken = self._take_due()
            due: list[Renewal] = [entry[2] for entry in taken]
            try:
                self._renew(due)
            except Exception:  # never let the thread die silently
                logger.exception("renewal round crashed")
                _due_again_soon(due)
            finally:
                self._renewing_now([])
            with self._lock:
                self.rounds += 1
                self._put_back(taken)
            # nothing of this round stays referenced while the thread waits for the next: a
            # renewal let go of here must not outlive it in this frame
            del taken, due

    def _take_due(self) -> list[list[Any]]:
        """Take this round's entries out of the heap (lock held): every one due by now, and
        those due within ``COALESCE_FRACTION`` of their interval. They go back in after the
        round, as they are, unless their renewal was stopped meanwhile (cleared by
        ``_forget``; a restart during the round pushed an entry of its own)."""
        now = time.monotonic()
        taken: list[list[Any]] = []
        while self._heap:
            when, _, renewal = self._heap[0]
            if renewal is None:
                heapq.heappop(self._heap)
                self._stale -= 1
                continue
            if when > now + renewal.interval * COALESCE_FRACTION:
                break
            taken.append(heapq.heappop(self._heap))
        return taken

    def _put_back(self, taken: list[list[Any]]) -> None:
        """After a round (lock held): push back the entries of renewals that go on."""
        for entry in taken:
            renewal = entry[2]
            if renewal is None:  # stopped during the round: counted stale, never pushed
                self._stale = max(0, self._stale - 1)
            elif renewal.lost is None and not renewal.stopped:
                entry[0], entry[1] = renewal.due, next(self._order)
                heapq.heappush(self._heap, entry)
            else:
                # lost; or stopped and never removed (an exception — Celery's soft limit —
                # landed between the two): let go of it here
                entry[2] = None
                self._active.pop(id(renewal), None)

    def _renewing_now(self, renewals: list[Renewal]) -> list[Renewal]:
        """Mark the part of the round about to run (its renewals not stopped meanwhile, which
        it returns) and let ``remove`` calls waiting for the previous part go."""
        with self._lock:
            live = [renewal for renewal in renewals if not renewal.stopped]
            self._renewing = {id(renewal) for renewal in live}
            self._part_done.notify_all()
            return live

    def _renew(self, due: list[Renewal]) -> None:
        """One round: every due renewal's leases in one pipeline per client and key prefix."""
        live: list[Renewal] = []
        for renewal in self._renewing_now(due):
            if renewal.expired():
                # paused past the lease: renewing now could only find it gone, or worse
                renewal._lose(renewal.holds[0], "lease expired by the clock before renewal")
                continue
            live.append(renewal)
        # one pipeline per client and key prefix (a group's keys are built with one prefix)
        by_client: dict[tuple[int, str], list[Renewal]] = {}
        for renewal in live:
            coordinator = renewal.coordinator
            by_client.setdefault((id(coordinator.client), coordinator.prefix), []).append(renewal)
        for everyone in by_client.values():
            group = self._renewing_now(everyone)
            if not group:
                continue
            sent_at = time.monotonic()
            try:
                answers = group[0].coordinator.extend_many(
                    [(r.leases, r.admitted.holder.owner) for r in group]
                )
            except CoordinationUnavailable as exc:
                for renewal in group:
                    if time.monotonic() - renewal.granted_at >= renewal.shortest_lease:
                        renewal._lose(
                            renewal.holds[0], f"Redis unreachable for the whole lease: {exc}"
                        )
                    else:  # try again sooner: the lease is running out
                        renewal.due = time.monotonic() + max(renewal.interval / 3, 0.01)
                        logger.warning("renewal of %s failed, retrying: %s", renewal._keys(), exc)
                continue
            for renewal, extended in zip(group, answers, strict=True):
                if renewal.stopped:
                    continue  # stopped while the pipeline was out: its callbacks are over
                if renewal._renewed(sent_at, extended):
                    renewal.due = sent_at + renewal.interval


def _due_again_soon(renewals: list[Renewal]) -> None:
    """After a round that crashed: try its renewals again in a third of their interval."""
    for renewal in renewals:
        renewal.due = time.monotonic() + max(renewal.interval / 3, 0.01)


_scheduler: RenewalScheduler | None = None
_scheduler_guard = threading.Lock()


def scheduler() -> RenewalScheduler:
    """The process's renewal scheduler (a forked child gets its own, with its own thread)."""
    global _scheduler
    current = _scheduler
    if current is None or current.pid != forks.pid():
        with _scheduler_guard:
            if _scheduler is None or _scheduler.pid != forks.pid():
                _scheduler = RenewalScheduler()
            current = _scheduler
    return current


def start_renewal(
    admitted: Admitted,
    *,
    coordinator: Coordinator | None = None,
    on_lost: Callable[[LeaseLost], None] | None = None,
    on_extended: Callable[[str, int], None] | None = None,
    start: bool = True,
) -> Renewal | None:
    """Start a ``Renewal`` when the admission has anything to renew (``start=False``: return
    it unstarted); else None."""
    renewal = Renewal(admitted, coordinator=coordinator, on_lost=on_lost, on_extended=on_extended)
    if not renewal.needed:
        return None
    return renewal.start() if start else renewal
