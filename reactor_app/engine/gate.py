"""The gate: coordination around one unit of work (a reactor run, a step attempt, a rollback).

A gate turns declarations into claims (computing keys from the unit's arguments), asks the
coordination layer for one atomic admission, keeps auto-extended locks alive while the work
runs, records the hold in the execution's held-key registry and in events, and releases
everything in one call when the work ends.

Entering a gate has four answers: admitted (the work runs), a skip (period bucket marked,
strict ordered chain failed), contention (synchronously: wait, then a ``CoordinationError``;
in a worker: ``ParkRequested``), or ``CoordinationUnavailable`` when Redis cannot be reached.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reactor_app.coordination.claims import (
    Admitted,
    ChainFailed,
    Claim,
    Holder,
    OrderedPosition,
    Outcome,
    PeriodHit,
    Refused,
    SemaphoreClaim,
)
from reactor_app.dsl.coordination import Declaration, OrderedLockDeclaration
from reactor_app.exceptions import CoordinationError, CoordinationUnavailable, LeaseLost
from reactor_app.status import CoordinationEventKind
from reactor_app.tracking import record_coordination

if TYPE_CHECKING:
    from reactor_app.coordination.admission import Coordinator
    from reactor_app.engine.context import HeldKeys

logger = logging.getLogger(__name__)


@dataclass
class Skip:
    """The unit must not run, and that is not a failure."""

    reason: str  # "period" | "ordered_lock_chain_failed"
    key: str


class ParkRequested(Exception):
    """Contention in a worker: the execution parks and is requeued; nothing ran."""

    def __init__(self, refused: Refused, error: CoordinationError) -> None:
        super().__init__(error.message)
        self.refused = refused
        self.error = error


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


def get_coordinator() -> Coordinator:
    from reactor_app.coordination.admission import Coordinator

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
        record_events: bool = True,
    ) -> None:
        self.declarations = list(declarations)
        self.args = args
        self.scope = scope
        self.coordinator = coordinator or get_coordinator()
        self.record_events = record_events
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
            claims.append(declaration.claim(key, position))
        self.claims = claims
        return claims

    def _position(self, declaration: OrderedLockDeclaration, key: str) -> OrderedPosition:
        store = self.scope.positions
        slot = self.scope.position_slot
        if store is not None:
            known = store.get(slot)
            if known and known.get("key") == key:
                return OrderedPosition(nonce=int(known["nonce"]), epoch=int(known["epoch"]))
        position = self.coordinator.assign_position(key, self._holder(), declaration.ttl)
        if store is not None:
            store[slot] = {"key": key, "nonce": position.nonce, "epoch": position.epoch}
        return position

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
        )

    def enter(self, *, wait: float | None, park: bool) -> Skip | None:
        """Admit every claim or none. ``park``: contention raises ``ParkRequested``."""
        claims = self.claims or self.compute_claims()
        holder = self._holder()
        for _ in range(2):  # a second round only after re-assigning a stale ordered position
            try:
                if park:
                    answer = self.coordinator.admit(claims, holder, waiter_id=self.scope.waiter_id)
                elif not wait:
                    answer = self.coordinator.admit(claims, holder)
                else:
                    answer = self.coordinator.admit_waiting(claims, holder, wait)
            except CoordinationUnavailable as exc:
                raise self._unavailable(exc) from exc
            if isinstance(answer, Refused) and answer.detail.get("stale_epoch"):
                self.forget_position()
                self.claims = []
                claims = self.compute_claims()
                continue
            break
        if isinstance(answer, Admitted):
            self._admitted(answer)
            return None
        if isinstance(answer, PeriodHit):
            return Skip("period", answer.claim.key)
        if isinstance(answer, ChainFailed):
            self.forget_position()
            return Skip("ordered_lock_chain_failed", answer.claim.key)
        assert isinstance(answer, Refused)
        error = self.coordinator.refusal_error(answer, self.scope.reactor, self.scope.step)
        if park:
            # A park is its own event (recorded with the ContentionState row), never a failure.
            raise ParkRequested(answer, error)
        self._event(
            CoordinationEventKind.ACQUISITION_FAILED,
            answer.claim,
            retry_after=answer.retry_after,
            blocker=answer.blocker,
        )
        raise error

    def _unavailable(self, exc: CoordinationUnavailable) -> CoordinationUnavailable:
        where = f"step {self.scope.step!r} of " if self.scope.step else "reactor "
        return CoordinationUnavailable(
            f"coordination store unreachable for {where}{self.scope.reactor or '?'}: "
            f"{getattr(exc, 'cause', None) or exc.message}; the protected work did not run",
            reactor=self.scope.reactor,
            step=self.scope.step,
            key=self.claims[0].key if self.claims else None,
            primitive=self.claims[0].primitive if self.claims else None,
            cause=getattr(exc, "cause", None) or exc.message,
        )

    def _admitted(self, admitted: Admitted) -> None:
        self.admitted = admitted
        for hold in admitted.holds:
            claim = hold.claim
            if self.scope.held_keys is not None and claim.primitive in ("lock", "semaphore"):
                self.scope.held_keys.push(
                    claim.primitive, claim.key, self.scope.step, getattr(claim, "limit", None)
                )
            limit = {"limit": claim.limit} if isinstance(claim, SemaphoreClaim) else {}
            self._event(
                CoordinationEventKind.ACQUIRED,
                claim,
                token=hold.token,
                reentrant=not hold.fresh,
                **limit,
            )
        self.keep_alive = self.coordinator.keep_alive(
            admitted, on_lost=self._on_lost, on_extended=self._on_extended
        )

    def _on_lost(self, error: LeaseLost) -> None:
        error.reactor = self.scope.reactor  # type: ignore[attr-defined]
        error.step = self.scope.step  # type: ignore[attr-defined]
        self.lost.append(error)
        detail = {"key": getattr(error, "key", None), "token": getattr(error, "token", None)}
        self.deferred_events.append((CoordinationEventKind.LEASE_LOST, detail))

    def _on_extended(self, key: str, ttl_ms: int) -> None:
        detail = {"key": key, "ttl_ms": ttl_ms}
        self.deferred_events.append((CoordinationEventKind.EXTENDED, detail))

    # -- leaving --------------------------------------------------------------------------

    def exit(self, outcome: Outcome) -> list[str]:
        """Release what was admitted (one call, reverse order). Returns woken waiter ids."""
        if self.keep_alive is not None:
            self.keep_alive.stop()
            self.keep_alive = None
        admitted, self.admitted = self.admitted, None
        for kind, detail in self.deferred_events:
            self._event(kind, None, **detail)
        self.deferred_events.clear()
        if admitted is None:
            return []
        woken: list[str] = []
        try:
            released = self.coordinator.release(admitted, outcome)
            woken = list(getattr(released, "woken", None) or [])
        except CoordinationUnavailable:
            # The work already ran; the holds lapse with their TTLs. Never hide it.
            logger.exception("could not release %s; holds will expire by TTL", self.claims)
        for hold in reversed(admitted.holds):
            claim = hold.claim
            if self.scope.held_keys is not None and claim.primitive in ("lock", "semaphore"):
                self.scope.held_keys.pop(claim.primitive, claim.key)
            self._event(CoordinationEventKind.RELEASED, claim, token=hold.token, outcome=outcome)
        if outcome in ("success", "failure"):
            self.forget_position()
        if woken:
            # Parked executions waited for exactly this release: re-enqueue them now.
            from reactor_app.engine.dispatch import wake

            wake(woken)
        return woken

    # -- helpers --------------------------------------------------------------------------

    def token_for(self, key: str | None = None) -> int | None:
        return self.admitted.token_for(key) if self.admitted else None

    def _event(self, kind: str, claim: Claim | None, **detail: Any) -> None:
        if not self.record_events:
            return
        key = detail.pop("key", None) or (claim.key if claim else "")
        primitive = claim.primitive if claim else "lock"
        token = detail.pop("token", None)
        record_coordination(
            kind,
            primitive=primitive,
            key=key,
            owner=self.scope.owner,
            step=self.scope.step,
            reactor=self.scope.reactor,
            execution_id=self.scope.execution_id,
            token=token,
            **detail,
        )


def fresh_owner() -> str:
    """Owner id of work that belongs to no execution (``Step.call``)."""
    return f"call:{uuid.uuid4()}"
