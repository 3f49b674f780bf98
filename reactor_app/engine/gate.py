"""The gate: coordination around one unit of work (a reactor run, a step attempt, a rollback).

A gate turns declarations into claims (computing keys from the unit's arguments), asks the
coordination layer for one atomic admission, keeps auto-extended locks alive while the work
runs, records the hold in the execution's held-key registry and in events, and releases
everything in one call when the work ends.

Entering a gate has four answers: admitted (the work runs), a skip (period bucket marked,
strict ordered chain failed), contention (synchronously: wait, then a ``CoordinationError``;
in a worker: ``ParkRequested``), or ``CoordinationUnavailable`` when Redis cannot be reached.

Leaving it is ``exit(outcome)`` — or, for a reactor-level gate whose execution parks on a
worker, ``suspend()`` (docs/design.md §2.8): the lock and semaphore holds are *kept* (renewal stops,
nothing is released; the rest is given back with outcome ``park``, which keeps an ordered
position) and described for the execution's state. The next delivery passes that description
to ``enter(adopt=...)``, which re-adopts the holds without a second acquisition — no nesting
level, no new fencing token, a ``resumed`` event instead of ``acquired`` — after checking they
are still this owner's (``Coordinator.extend``), admits only what was given back (the ordered
gate and the period check; the rate limit was charged by the admission being continued), and
restarts keep-alive. ``suspend`` lengthens the kept leases to cover the park (and the sweeper
keeps them alive for as long as the execution stays parked). A hold that lapsed or was
force-released anyway is recorded as ``lease_lost``, whatever is still held is given back, and
``enter`` raises ``LeaseLost``: another execution may have run inside the workflow, so the run
fails (and rolls back) instead of competing again.

One module, over the usual size, on purpose: entering, keeping alive, suspending and leaving
are one protocol over one admission's state (its claims, holds, keep-alive and deferred
events), read top to bottom in the order a unit of work goes through them. What is not that
protocol lives elsewhere: the waiting itself in ``coordination.waiting``, the refusal errors in
``coordination.refusals``, the execution's side in ``engine.host``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from reactor_app import forks
from reactor_app.coordination import primitives, subscriptions
from reactor_app.coordination.admission import Coordinator, Released
from reactor_app.coordination.claims import (
    ADMISSION_ORDER,
    UNASSIGNED,
    WAITING_PREFIX,
    AdmissionResult,
    Admitted,
    ChainFailed,
    Claim,
    Hold,
    Holder,
    LockClaim,
    OrderedLockClaim,
    OrderedPosition,
    Outcome,
    PeriodHit,
    Refused,
    SemaphoreClaim,
    with_positions,
)
from reactor_app.coordination.redis import unusable_state
from reactor_app.dsl.declarations import (
    Declaration,
    OrderedLockDeclaration,
    RateLimitDeclaration,
    SemaphoreDeclaration,
)
from reactor_app.engine import contention, finished_waiters
from reactor_app.engine.enqueueing import wake
from reactor_app.exceptions import (
    CoordinationError,
    CoordinationUnavailable,
    LeaseLost,
    location,
)
from reactor_app.status import CoordinationEventKind
from reactor_app.tracking import record_coordination

if TYPE_CHECKING:
    from reactor_app.engine.context import HeldKeys
    from reactor_app.engine.state import KeptHold

logger = logging.getLogger(__name__)

#: what a reactor-level hold keeps across a worker park (``Gate.suspend``); everything else is
#: given back with outcome ``park`` (an ordered position is kept by that outcome, a period check
#: and a rate-limit charge have nothing to give back)
KEPT_ACROSS_PARK = primitives.HOLDING


@dataclass
class Skip:
    """The unit must not run, and that is not a failure."""

    reason: str  # "period" | "ordered_lock_chain_failed"
    key: str


class ParkRequested(Exception):
    """Contention in a worker: the execution parks and is requeued; nothing ran."""

    def __init__(self, refused: Refused, error: CoordinationError, gate: Gate) -> None:
        super().__init__(error.message)
        self.refused = refused
        self.error = error
        #: the refused gate, so a park turned into a failure can give up its ordered position
        self.gate = gate


@dataclass
class GateScope:
    """Who is asking, on behalf of which execution."""

    reactor: str  # reactor path ("" for Step.call)
    step: str | None  # None at reactor level
    owner: str
    execution_id: str | None
    held_keys: HeldKeys | None
    #: the execution's persisted ordered-lock positions (None: assign a fresh one each time)
    positions: dict[str, dict[str, Any]] | None = None
    position_slot: str = ""
    #: a parked worker's id: registered on the refusing key in the same atomic admission, so
    #: the release that frees the key returns it to be re-enqueued at once (None: no parking)
    waiter_id: str | None = None
    #: persists the execution state after a fresh ordered-lock position was assigned
    on_position: Callable[[], None] | None = None
    #: a worker's in-delivery wait before it parks (``REACTOR_WORKER_WAIT``; 0: park at once)
    worker_wait: float = 0.0
    #: the execution's place among the waiters of a contended key (``run_async(priority=)``)
    priority: int = 0


def get_coordinator() -> Coordinator:
    return Coordinator()


class Gate:
    """Coordination for one unit of work; see the module docstring."""

    def __init__(
        self,
        declarations: Sequence[Declaration],
        args: Mapping[str, Any],
        scope: GateScope,
        *,
        coordinator: Coordinator | None = None,
        waits: Mapping[str, float] | None = None,
    ) -> None:
        self.declarations = list(declarations)
        #: how long a synchronous caller waits for each primitive before failing (docs/design.md
        #: §2.3); rollback gates pass their ``rollback_wait`` values instead
        self.waits = (
            dict(waits)
            if waits is not None
            else {d.primitive: d.wait_seconds() for d in self.declarations}
        )
        self.args = args
        self.scope = scope
        self.coordinator = coordinator or get_coordinator()
        self.admitted: Admitted | None = None
        self.keep_alive: Any = None
        self.lost: list[BaseException] = []
        self.claims: list[Claim] = []
        # Events raised on the renewal thread are recorded by the thread that owns the work,
        # so no ORM write ever happens off the work's own connection.
        self.deferred_events: list[tuple[str, dict[str, Any]]] = []

    # -- entering -------------------------------------------------------------------------

    def compute_claims(self) -> list[Claim]:
        """Keys first (a bad key function fails here, before anything is taken)."""
        reactor, step = self.scope.reactor, self.scope.step
        keyed = [
            (d, d.compute_key(self.args, reactor=reactor, step=step)) for d in self.declarations
        ]
        claims = []
        for declaration, key in keyed:
            position = None
            if isinstance(declaration, OrderedLockDeclaration):
                position = self._position(declaration, key)
            if isinstance(declaration, (RateLimitDeclaration, SemaphoreDeclaration)):
                # a weighted limit's cost, a fair semaphore's group: computed from the same
                # arguments as the key
                claims.append(declaration.claim(key, args=self.args, reactor=reactor, step=step))
                continue
            claims.append(declaration.claim(key, position))
        self.claims = claims
        return claims

    def _position(self, declaration: OrderedLockDeclaration, key: str) -> OrderedPosition:
        store = self.scope.positions
        slot = self.scope.position_slot
        if store is None:
            # Nothing to persist it in (a direct call): the admission assigns the place in
            # line in its own round trip (``UNASSIGNED``), and ``_take_positions`` learns it.
            return UNASSIGNED
        known = store.get(slot)
        if known and known.get("key") == key:
            return OrderedPosition(nonce=int(known["nonce"]), epoch=int(known["epoch"]))
        position = self.coordinator.assign_position(key, self._holder(), declaration.ttl)
        store[slot] = {"key": key, "nonce": position.nonce, "epoch": position.epoch}
        if self.scope.on_position is not None:
            # Persist before the body runs: a delivery that dies now must find its place in
            # the line again, not queue behind its own ghost.
            self.scope.on_position()
        return position

    def _take_positions(self, answer: AdmissionResult) -> None:
        """Keep the ordered positions an admission assigned (``UNASSIGNED`` claims): the
        release, a further attempt and leaving the line all use that place."""
        if answer.assigned:
            self.claims = with_positions(self.claims, answer.assigned)

    def abandon_position(self) -> None:
        """Complete this unit's ordered-lock position without running (a terminal ``halt``:
        the cursor moves on, a strict line is not stopped) and forget it."""
        ordered = [c for c in self.claims if isinstance(c, OrderedLockClaim)]
        if not ordered:
            return
        holds = [Hold(claim=claim, fresh=True) for claim in ordered]
        try:
            released = self.coordinator.release(
                Admitted(holds=holds, holder=self._holder()), "halt"
            )
        except CoordinationUnavailable:
            logger.warning("could not leave the ordered line of %s", [c.key for c in ordered])
            return
        self.forget_position()
        _wake(released.woken)

    def forget_position(self) -> None:
        """The position is used up (terminal outcome) or stale (the key was reset)."""
        if self.scope.positions is not None:
            self.scope.positions.pop(self.scope.position_slot, None)

    def _holder(self) -> Holder:
        return Holder(
            owner=self.scope.owner,
            execution_id=self.scope.execution_id,
            step=self.scope.step,
            reactor=self.scope.reactor,
            priority=self.scope.priority,
        )

    def enter(
        self,
        *,
        wait: float | None,
        park: bool,
        adopt: Sequence[KeptHold] | None = None,
    ) -> Skip | None:
        """Admit every claim or none. ``park``: contention raises ``ParkRequested``.

        ``adopt``: the holds ``suspend()`` kept across a park (see the module docstring); they
        are re-adopted if still ours, else ``LeaseLost`` is raised (nothing held).
        """
        claims = self.claims or self.compute_claims()
        holder = self._holder()
        adopted = self._verify_kept(claims, adopt) if adopt else []
        if adopted:
            kept = [hold.claim for hold in adopted]
            # the rate limit was charged by the admission this one continues
            answer = self._admit(
                lambda c: c not in kept and c.primitive not in primitives.CHARGING,
                holder,
                wait=wait,
                park=park,
            )
            if isinstance(answer, Admitted):
                _wake(answer.woken)  # waiters ahead of this one granted free slots with it
                holds = sorted(
                    [*answer.holds, *adopted],
                    key=lambda hold: ADMISSION_ORDER.index(hold.claim.primitive),
                )
                self._admitted(Admitted(holds=holds, holder=holder), adopted=adopted)
                return None
            # The ordered gate or the period check refused the continuation: hold nothing
            # while skipping, parking or failing, as a gate that was never entered would.
            self._release(Admitted(holds=adopted, holder=holder), "park", tracked=False)
        else:
            answer = self._admit_by_strategy(holder, wait=wait, park=park)
        if isinstance(answer, Admitted):
            _wake(answer.woken)  # waiters ahead of this one granted free slots with it
            self._admitted(answer)
            return None
        if isinstance(answer, (PeriodHit, ChainFailed)):
            # A skip completes this unit's ordered position: let the next one through now.
            self.forget_position()
            _wake(answer.woken)
            reason = "period" if isinstance(answer, PeriodHit) else "ordered_lock_chain_failed"
            return Skip(reason, answer.claim.key)
        assert isinstance(answer, Refused)
        # parked waiters a wait that gave up handed its keys on to
        _wake(answer.woken)
        error = self.coordinator.refusal_error(answer, self.scope.reactor, self.scope.step)
        strategy = self._strategy(answer.claim)
        if strategy in (contention.SKIP, contention.CANCEL_NEWEST):
            self._event(
                CoordinationEventKind.ACQUISITION_FAILED,
                answer.claim,
                blocker=answer.blocker,
                on_contention=strategy,
            )
            self.abandon_position()
            if strategy == contention.SKIP:
                return Skip("contended", answer.claim.key)
            contention.cancel_newcomer(self.scope, answer)
            raise error
        if park:
            # A park is its own event (recorded with the ContentionState row), never a failure.
            raise ParkRequested(answer, error, self)
        self._event(
            CoordinationEventKind.ACQUISITION_FAILED,
            answer.claim,
            retry_after=answer.retry_after,
            blocker=answer.blocker,
        )
        # This unit will not come back for its turn: leave the line, or everyone behind the
        # position would wait for it until poison_pill_timeout.
        self.abandon_position()
        raise error

    def enter_lock(self, wait: float) -> None:
        """``enter(wait=wait, park=False)`` for a gate whose one declaration is a lock that
        queues on contention (``engine.locked_call``): the same admission, registrations and
        events, without the general selection of claims, strategies and re-assigned ordered
        positions, none of which such a gate has. Raises as ``enter`` does."""
        (declaration,) = self.declarations
        key = declaration.compute_key(self.args, reactor=self.scope.reactor, step=self.scope.step)
        claims = self.claims = [declaration.claim(key)]
        holder = self._holder()
        try:
            answer = self._ask(claims, holder, wait)
        except CoordinationUnavailable as exc:
            raise self._unavailable(exc) from exc
        _wake(answer.woken)
        if isinstance(answer, Admitted):
            self._admitted(answer)
            return
        assert isinstance(answer, Refused)  # a lock answers nothing else
        error = self.coordinator.refusal_error(answer, self.scope.reactor, self.scope.step)
        self._event(
            CoordinationEventKind.ACQUISITION_FAILED,
            answer.claim,
            retry_after=answer.retry_after,
            blocker=answer.blocker,
        )
        raise error

    def _ask(self, claims: list[Claim], holder: Holder, wait: float | None) -> AdmissionResult:
        """One admission, or one that waits up to ``wait`` seconds. A wait that ends admitted
        sends its UNSUBSCRIBE after the release (``exit``), not inside the critical section
        (``coordination.subscriptions``)."""
        if not wait:
            return self.coordinator.admit(claims, holder)
        return self.coordinator.admit_waiting(
            claims, holder, wait, waits=self.waits, settle_later=True
        )

    def _strategy(self, claim: Claim) -> str:
        """The refused claim's ``on_contention`` (``engine.contention``)."""
        for declaration in self.declarations:
            if declaration.primitive == claim.primitive:
                return str(getattr(declaration, "on_contention", contention.QUEUE))
        return contention.QUEUE

    def _admit_by_strategy(
        self, holder: Holder, *, wait: float | None, park: bool
    ) -> AdmissionResult:
        """A first admission, decided by ``on_contention`` when a declaration has a strategy
        other than queueing: one try without waiting or parking; a refusal by a
        ``cancel_in_progress`` claim cancels the holder, and one by a queueing claim queues."""
        everything: Callable[[Claim], bool] = lambda c: True  # noqa: E731
        if not any(
            getattr(d, "on_contention", contention.QUEUE) in contention.DECIDED_AT_ONCE
            for d in self.declarations
        ):
            return self._admit(everything, holder, wait=wait, park=park)
        answer = self._admit(everything, holder, wait=0, park=False)
        if not isinstance(answer, Refused):
            return answer
        strategy = self._strategy(answer.claim)
        if strategy in (contention.SKIP, contention.CANCEL_NEWEST):
            return answer
        if strategy == contention.CANCEL_IN_PROGRESS:
            cancelled = contention.cancel_holder(self.scope, answer)
            self._event(
                CoordinationEventKind.ACQUISITION_FAILED,
                answer.claim,
                blocker=answer.blocker,
                on_contention=strategy,
                cancelled=cancelled,
            )
        return self._admit(everything, holder, wait=wait, park=park)

    def _admit(
        self, wanted: Callable[[Claim], bool], holder: Holder, *, wait: float | None, park: bool
    ) -> AdmissionResult:
        """One admission of the claims ``wanted`` selects, re-assigning a stale ordered
        position once."""
        claims = [c for c in (self.claims or self.compute_claims()) if wanted(c)]
        if not claims:
            return Admitted(holds=[], holder=holder)
        registered = [(c.primitive, c.key) for c in claims if c.primitive in KEPT_ACROSS_PARK]
        held_keys = self.scope.held_keys
        for _ in range(2):  # a second round only after re-assigning a stale ordered position
            try:
                if held_keys is not None:
                    held_keys.announce(registered, self.scope.step)
                if park:
                    answer = self._admit_or_park(claims, holder)
                else:
                    answer = self._ask(claims, holder, wait)
            except CoordinationUnavailable as exc:
                raise self._unavailable(exc) from exc
            self._take_positions(answer)
            if held_keys is not None and not isinstance(answer, Admitted):
                held_keys.settle(registered)
            if isinstance(answer, Refused) and answer.detail.stale:
                # The place this unit kept is gone: passed over by a later position after
                # poison_pill_timeout of silence, or the line was reset. It takes a new place
                # at the back, and says so (docs/coordination.md, "Losing a place in line").
                self._event(
                    CoordinationEventKind.ORDERED_SKIPPED,
                    answer.claim,
                    by="poison_pill" if answer.detail.reason == "passed" else "reset",
                    nonce=answer.detail.nonce,
                    reason="this unit's kept position was found stale; it takes a new one",
                )
                self.forget_position()
                self.claims = []
                claims = [c for c in self.compute_claims() if wanted(c)]
                continue
            break
        return answer

    def _admit_or_park(self, claims: list[Claim], holder: Holder) -> AdmissionResult:
        """A worker's admission: wait briefly in this delivery before parking.

        A delivery that meets contention first waits here — registered in the key's waiter
        order as ``wait:<id>`` and woken by the release's PUBLISH (``Coordinator.admit_waiting``,
        the in-process wait; a release that grants the key to another waiter does not wake it)
        — for up to ``REACTOR_WORKER_WAIT``: a short critical section then hands over in
        milliseconds instead of a park, requeue, redelivery and re-admission. Only when the
        budget runs out (or waiting cannot help: a rate-limit window that reopens later than
        the budget) does it register as a parked waiter, in the same atomic admission that
        tries once more. Waiting holds nothing: admission is all-or-nothing.
        """
        parked_id = self.scope.waiter_id
        budget = self.scope.worker_wait
        if not budget or parked_id is None:
            return self.coordinator.admit(claims, holder, waiter_id=parked_id)
        waiting_id = f"{WAITING_PREFIX}{parked_id}"
        # Any of the admissions below may grant a semaphore's free slots to the heads of its
        # line (lua/_semaphore.lua) and name them in ``woken``, even when it refuses this
        # one: the answer returned reports them all, so the parked ones are re-enqueued.
        granted: list[str] = []

        def reporting(answer: Any) -> Any:
            if isinstance(answer, (Admitted, Refused)):
                granted.extend(w for w in answer.woken if w not in granted)
                answer.woken = list(granted)
            return answer

        answer = reporting(self.coordinator.admit(claims, holder, waiter_id=waiting_id))
        if isinstance(answer, Refused) and _worth_waiting(answer, budget):
            # woken only when the release names this waiter, or names nobody
            answer = reporting(
                self.coordinator.admit_waiting(
                    claims, holder, budget, waiter_id=waiting_id, refused=answer, settle_later=True
                )
            )
        if not isinstance(answer, Refused) or answer.detail.stale:
            return answer
        answer = reporting(self.coordinator.admit(claims, holder, waiter_id=parked_id))
        if isinstance(answer, Refused) and (answer.blocker or {}).get("granted_to") == waiting_id:
            # a release handed the key to the wait just as its budget ran out: take it
            answer = reporting(self.coordinator.admit(claims, holder, waiter_id=waiting_id))
            if not isinstance(answer, Refused):
                for claim in claims:  # the parking refusal registered the parked id
                    _wake(self.coordinator.unregister_waiter(claim, parked_id))
                return answer
        for claim in claims:
            if isinstance(answer, Refused) and claim == answer.claim:
                # one order for waiting and parked waiters: the park keeps the wait's turn
                self.coordinator.move_waiter(claim, waiting_id, parked_id)
            else:
                # a key handed to the wait meanwhile goes on to the next waiter
                _wake(self.coordinator.unregister_waiter(claim, waiting_id))
        return answer

    def _verify_kept(self, claims: Sequence[Claim], kept: Sequence[KeptHold]) -> list[Hold]:
        """The kept holds, still ours, ready to adopt — or ``[]`` (all or nothing) after
        recording the lapsed ones and giving back the rest.

        A kept hold matches this gate's claim on the same primitive and key (the keys come
        from the execution's inputs, so they do not change between deliveries) and is ours
        while it names this owner (a lock also its fencing token) with its lease unexpired:
        exactly what a renewal checks, so ``Coordinator.extend`` answers, renewing the leases
        that auto-extend (a lock without ``auto_extend`` keeps its original deadline).
        """
        by_key: dict[tuple[str, str], Claim] = {
            (c.primitive, c.key): c for c in claims if c.primitive in KEPT_ACROSS_PARK
        }
        holds: list[Hold] = []
        strays: list[Hold] = []
        for entry in kept:
            primitive, key = str(entry.get("primitive")), str(entry.get("key"))
            claim = by_key.get((primitive, key))
            token, lease = entry.get("token"), entry.get("lease")
            if claim is not None:
                holds.append(Hold(claim=claim, fresh=True, token=token, lease=lease))
            elif primitive in KEPT_ACROSS_PARK:
                # The declarations changed between deliveries (a deploy): this gate no longer
                # covers the key, so give the hold back rather than let it wait for its TTL.
                stray = primitives.holding(primitive).hold_claim(key, entry.get("limit"))
                strays.append(Hold(claim=stray, fresh=True, token=token, lease=lease))
        holder = self._holder()
        if strays:
            self._release(Admitted(holds=strays, holder=holder), "park", tracked=False)
        if not holds:
            return []
        try:
            answer = self.coordinator.extend(
                holds,
                self.scope.owner,
                renew=lambda h: not isinstance(h.claim, LockClaim) or h.claim.auto_extend,
            )
        except CoordinationUnavailable as exc:
            raise self._unavailable(exc) from exc
        if not answer.lost:
            return holds
        self._record_lost_while_parked(answer.lost)
        still_ours = [hold for hold in holds if any(hold is h for h in answer.extended)]
        if still_ours:
            self._release(Admitted(holds=still_ours, holder=holder), "park", tracked=False)
        # Someone may have run inside this workflow while it slept: continuing (or competing
        # again) would hide that. The resume fails before any further step runs
        # (docs/coordination.md, "Guarantees").
        hold, reason = answer.lost[0]
        raise LeaseLost(
            f"the {hold.claim.primitive} {hold.claim.key!r} that "
            f"{self.scope.reactor or 'this execution'} kept across a park was lost while it "
            f"was parked ({reason}); another execution may have entered the workflow, so it "
            "fails instead of continuing",
            reactor=self.scope.reactor,
            step=self.scope.step,
            key=hold.claim.key,
            primitive=hold.claim.primitive,
            token=hold.token,
            reason=reason,
        )

    def _record_lost_while_parked(self, lost: Sequence[tuple[Hold, str]]) -> None:
        for hold, reason in lost:
            self._event(
                CoordinationEventKind.LEASE_LOST,
                hold.claim,
                token=hold.token,
                reason=reason,
                during="park",
            )

    def _unavailable(self, exc: CoordinationUnavailable) -> CoordinationUnavailable:
        where = location(self.scope.reactor, self.scope.step)
        return type(exc)(
            f"coordination store {unusable_state(exc.__cause__)} for {where}: "
            f"{exc.cause or exc.message}; the protected work did not run",
            reactor=self.scope.reactor,
            step=self.scope.step,
            key=self.claims[0].key if self.claims else None,
            primitive=self.claims[0].primitive if self.claims else None,
            cause=exc.cause or exc.message,
        )

    def _admitted(self, admitted: Admitted, *, adopted: Sequence[Hold] = ()) -> None:
        self.admitted = admitted
        for hold in admitted.holds:
            claim = hold.claim
            if self.scope.held_keys is not None and primitives.holds(claim.primitive):
                self.scope.held_keys.push(
                    claim.primitive, claim.key, self.scope.step, getattr(claim, "limit", None)
                )
            limit: dict[str, Any] = (
                {"limit": claim.limit} if isinstance(claim, SemaphoreClaim) else {}
            )
            if adopted and any(hold is h for h in adopted):
                # held since before the park: no second acquisition is recorded
                self._event(
                    CoordinationEventKind.RESUMED, claim, token=hold.token, adopted=True, **limit
                )
                continue
            self._event(
                CoordinationEventKind.ACQUIRED,
                claim,
                token=hold.token,
                reentrant=not hold.fresh,
                **limit,
            )
        # Held by the gate before it runs: an exception landing while it starts (Celery's soft
        # limit, raised by a signal handler at any call) still finds it in ``exit``/``suspend``,
        # which stop it. Started first, it would go on renewing the holds after the delivery
        # ended, with no work under them, until another delivery gave them back — and then log
        # them lost (docs/operations.md, "Celery time limits").
        self.keep_alive = self.coordinator.keep_alive(
            admitted, on_lost=self._on_lost, on_extended=self._on_extended, start=False
        )
        if self.keep_alive is not None:
            self.keep_alive.start()

    def _on_lost(self, error: LeaseLost) -> None:
        error.reactor = self.scope.reactor
        error.step = self.scope.step
        self.lost.append(error)
        key = error.key
        detail = {
            "key": key,
            "token": error.token,
            "primitive": error.primitive or self._primitive_of(key),
            # why, as the error says it: gone, taken over, or run out by the clock
            "reason": error.extra.get("reason"),
            "at": timezone.now(),  # recorded later: stamped when it was detected
        }
        self.deferred_events.append((CoordinationEventKind.LEASE_LOST, detail))

    def _on_extended(self, key: str, ttl_ms: int) -> None:
        detail = {
            "key": key,
            "ttl_ms": ttl_ms,
            "primitive": self._primitive_of(key),
            "at": timezone.now(),  # recorded later: stamped when the renewal happened
        }
        self.deferred_events.append((CoordinationEventKind.EXTENDED, detail))

    def _primitive_of(self, key: str | None) -> str:
        """The primitive of the admitted lock or semaphore hold on ``key`` (renewal callbacks
        only name the key, and only for those: a period reservation on the same key is renewed
        silently, so it must not take the event)."""
        holds = self.admitted.holds if self.admitted else []
        return next(
            (
                h.claim.primitive
                for h in holds
                if h.claim.key == key and primitives.holds(h.claim.primitive)
            ),
            "lock",
        )

    # -- leaving --------------------------------------------------------------------------

    def exit(self, outcome: Outcome) -> list[str]:
        """Release what was admitted (one call, reverse order). Returns woken waiter ids."""
        try:
            admitted = self._stop()
            if admitted is None:
                return []
            return self._release(admitted, outcome)
        finally:
            # the UNSUBSCRIBE an admitted wait left out of the critical section
            subscriptions.settle()

    def exit_unless(self, outcome: Outcome, flags: Sequence[str]) -> str | None:
        """``exit`` — unless one of the Redis keys ``flags`` (the execution's cancel request)
        is set when the release runs: it is read in the release's own round trip
        (``Coordinator.release(unless=...)``). Then nothing is released, the gate keeps its
        holds, renewed as before, and the flag's value is returned; else None."""
        renewal = self.keep_alive  # stopped first: it must not renew what is being released
        admitted = self._stop()
        if admitted is None:
            return None
        try:
            released = self._give_back(admitted, outcome, unless=flags)
            if released.flagged is not None:
                self.admitted = admitted
                self.keep_alive = renewal  # held before it runs again (see ``_admitted``)
                if renewal is not None:
                    renewal.restart()
                return released.flagged
            self._released(admitted, outcome, released)
            return None
        finally:
            subscriptions.settle()  # as in ``exit``

    def suspend(self, hold_for: float | None = None) -> list[KeptHold]:
        """A reactor-level gate whose execution parks on a worker (docs/design.md §2.8): keep
        the lock and semaphore holds — the renewal thread lets go of them, nothing is released
        — and give back the rest with outcome ``park``. Returns the kept holds as JSON data for the
        execution's state, to pass to ``enter(adopt=...)`` on the next delivery.

        ``hold_for``: seconds until the parked execution is due back (its requeue delay plus
        a margin). The kept leases are lengthened to cover it — never shortened — so a park
        longer than a lock's ``ttl`` does not let another execution into the workflow; the
        sweeper keeps them alive if the execution is due back later than that.
        """
        subscriptions.settle()  # as in ``exit`` (a park, not a hand-off: sent first)
        admitted = self._stop()
        if admitted is None:
            return []
        kept = [h for h in admitted.holds if h.claim.primitive in KEPT_ACROSS_PARK]
        rest = [h for h in admitted.holds if h.claim.primitive not in KEPT_ACROSS_PARK]
        if rest:
            self._release(Admitted(holds=rest, holder=admitted.holder), "park")
        if kept and hold_for:
            try:
                extended = self.coordinator.extend(
                    kept, self.scope.owner, lease_ms=int(hold_for * 1000)
                )
            except CoordinationUnavailable:
                logger.warning("could not lengthen the holds kept across a park: %s", kept)
            else:
                self._record_lost_while_parked(extended.lost)
        described = []
        for hold in kept:
            claim = hold.claim
            if self.scope.held_keys is not None:
                # this delivery is done with it, but it stays held (and announced)
                self.scope.held_keys.pop(claim.primitive, claim.key, still_held=True)
            entry: KeptHold = {"primitive": claim.primitive, "key": claim.key}
            if hold.token is not None:
                entry["token"] = hold.token
            if hold.lease is not None:
                entry["lease"] = hold.lease
            if isinstance(claim, SemaphoreClaim):
                entry["limit"] = claim.limit
            described.append(entry)
        return described

    def _stop(self) -> Admitted | None:
        """Stop keep-alive, record what it deferred; hand over (and forget) the admission."""
        if self.keep_alive is not None:
            self.keep_alive.stop()
            self.keep_alive = None
        admitted, self.admitted = self.admitted, None
        for kind, detail in self.deferred_events:
            self._event(kind, None, **detail)
        self.deferred_events.clear()
        return admitted

    def _release(self, admitted: Admitted, outcome: Outcome, *, tracked: bool = True) -> list[str]:
        """Release ``admitted``; ``tracked``: its holds are in the held-key registry (False for
        kept holds given back before this delivery adopted them)."""
        return self._released(
            admitted, outcome, self._give_back(admitted, outcome), tracked=tracked
        )

    def _give_back(
        self, admitted: Admitted, outcome: Outcome, unless: Sequence[str] = ()
    ) -> Released:
        try:
            return self.coordinator.release(admitted, outcome, unless=unless)
        except CoordinationUnavailable as exc:
            # The work already ran; the holds lapse with their TTLs. Never hide it: not in the
            # log, nor in the history (a ``release_failed`` event, not ``released``).
            logger.exception("could not release %s; holds will expire by TTL", self.claims)
            return Released(failed=exc.cause or exc.message)

    def _released(
        self, admitted: Admitted, outcome: Outcome, released: Released, *, tracked: bool = True
    ) -> list[str]:
        """What follows a release: the held-key registry, the events, the ordered position,
        and re-enqueueing the parked executions it let through. A release that could not reach
        the store records ``release_failed`` events: this unit is done with the holds, but
        they stay taken until their leases lapse, and the history must not say otherwise."""
        # stamped now, recorded after the wake below: the history keeps the release before the
        # woken waiter's admission
        at = timezone.now()
        woken = list(released.woken)
        # Parked executions waited for exactly this release: re-enqueue them first, before
        # this unit's own bookkeeping (the look-up of finished waiters, the held-key registry,
        # the events), so the next holder's delivery is on its way while that is done
        # (docs/benchmarks.md, "Wake latency").
        _wake(woken)
        alive = finished_waiters.past_finished(self.coordinator, admitted, woken)
        _wake([w for w in alive if w not in woken])  # the grants passed over finished ones
        kind, detail = CoordinationEventKind.RELEASED, dict[str, Any]()
        if released.failed is not None:
            kind, detail = CoordinationEventKind.RELEASE_FAILED, {"cause": released.failed}
        elif alive and len(admitted.holds) == 1:
            # whom the freed key went to (with several holds the waiters are not told apart by
            # key): the key's timeline shows each hand-off, the chaos test checks them
            detail = {"handed_to": alive}
        for hold in reversed(admitted.holds):
            claim = hold.claim
            registered = tracked and primitives.holds(claim.primitive)
            if self.scope.held_keys is not None and registered:
                self.scope.held_keys.pop(claim.primitive, claim.key)
            self._event(kind, claim, token=hold.token, outcome=outcome, at=at, **detail)
        if not tracked and self.scope.held_keys is not None:
            # kept holds given back before this delivery adopted them: still announced
            self.scope.held_keys.settle([(h.claim.primitive, h.claim.key) for h in admitted.holds])
        if outcome in TERMINAL_OUTCOMES:
            self.forget_position()
        return alive

    # -- helpers --------------------------------------------------------------------------

    def token_for(self, key: str | None = None) -> int | None:
        return self.admitted.token_for(key) if self.admitted else None

    def _event(
        self,
        kind: str,
        claim: Claim | None,
        *,
        key: str | None = None,
        primitive: str | None = None,
        token: int | None = None,
        **detail: Any,
    ) -> None:
        """Record one coordination event of this gate: about ``claim`` (its key and primitive),
        or — for a renewal's deferred event, which names only a key — about ``key``."""
        scope = self.scope
        record_coordination(
            kind,
            primitive=claim.primitive if claim else primitive or "lock",
            key=key or (claim.key if claim else ""),
            owner=scope.owner,
            step=scope.step,
            reactor=scope.reactor,
            execution_id=scope.execution_id,
            token=token,
            **detail,
        )


#: release outcomes that end an ordered-lock position (see release.lua)
TERMINAL_OUTCOMES: frozenset[Outcome] = frozenset({"success", "failure", "halt", "rollback"})


def _worth_waiting(refused: Refused, budget: float) -> bool:
    """A rate limit reopens at a known time (a charge is never released, ``Primitive.CHARGES``):
    waiting for longer than the budget is useless. Everything else can be freed by a release
    at any moment."""
    if refused.claim.primitive not in primitives.CHARGING:
        return True
    return refused.retry_after is not None and refused.retry_after <= budget


def _wake(woken: Sequence[str]) -> None:
    """Re-enqueue parked executions a release (or a skip, or an admission that served the
    line its free slots) let through: at once, not at their backoff requeue."""
    if woken:
        wake(list(woken))


def fresh_owner() -> str:
    """Owner id of work that belongs to no execution (``Step.call``): 128 random bits.

    From a generator of this module's own, not ``uuid4``: every ``Step.call`` makes one, and
    ``os.urandom``'s system call measured up to tens of µs on a busy virtual machine
    (docs/benchmarks.md, "Hot path"). Not ``random``'s shared generator either: any code in the
    process may seed that one (test tools do, per example) and then hand out the same owners
    again — two callers with one owner would both walk into one lock as re-entries. This one
    is seeded from the OS, never by a caller, and again in every forked child. Owners need
    uniqueness, not secrecy (the admin shows them)."""
    return f"call:{_owners.getrandbits(128):032x}"


_owners = random.Random()  # seeded from the OS
forks.after_in_child(_owners.seed)
