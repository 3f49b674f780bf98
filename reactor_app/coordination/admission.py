"""Admission: one atomic decision to take every claim of a unit of work (docs/design.md §2.1).

``Coordinator.admit`` sends all claims — sorted into ``ADMISSION_ORDER`` (ordered gate →
period check → lock → semaphore → rate-limit charge) — to ``lua/admit.lua`` in ONE script
call: nothing is taken unless everything is. When the keys cannot share a cluster hash slot,
the claims are admitted one by one in the same order with the same script and what was taken is
given back on the first refusal. ``release`` is one call too, in reverse order.

Contention is answered, not raised: ``Refused`` (with the primitive's ``retry_after`` hint and
a blocker snapshot), ``PeriodHit`` or ``ChainFailed``; ``coordination.refusals`` turns a
``Refused`` into the public exception of §1.3.

The ``Coordinator`` is the one object callers use. Its other verbs live with their concern and
take it as their first argument: waiting and the waiter orders (``coordination.waiting``),
lease renewal (``coordination.leases``), removing holds by force (``coordination.forced_release``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from reactor_app.coordination import (
    forced_release,
    holds_index,
    leases,
    lock,
    ordered_lock,
    refusals,
    waiting,
)
from reactor_app.coordination.claims import (
    ADMISSION_ORDER,
    UNASSIGNED,
    AdmissionResult,
    Admitted,
    Claim,
    Hold,
    Holder,
    LockClaim,
    OrderedLockClaim,
    OrderedPosition,
    Outcome,
    PeriodHit,
    with_positions,
)
from reactor_app.coordination.keys import current_prefix, hash_slot
from reactor_app.coordination.primitives import HOLDING, REGISTRY
from reactor_app.coordination.redis import (
    get_client,
    is_cluster,
    unavailable_on_connection_error,
)
from reactor_app.coordination.replies import admission_result, lock_admission
from reactor_app.coordination.script_args import admit_part, lock_keys, specs
from reactor_app.coordination.scripts import (
    ScriptReply,
    holder_json,
    scripts_for,
)

ReleaseOutcome = Outcome | Literal["give_back"]


@dataclass(frozen=True)
class Released:
    """What a release did. Keys are ``(primitive, user key)`` pairs."""

    freed: list[tuple[str, str]] = field(default_factory=list)
    woken: list[str] = field(default_factory=list)  # parked waiter ids to re-enqueue now
    not_held: list[tuple[str, str]] = field(default_factory=list)  # lapsed or taken over
    marked: list[tuple[str, str]] = field(default_factory=list)  # period buckets marked
    #: the value of the flag that stopped the release (``release(unless=...)``): nothing
    #: was released
    flagged: str | None = None
    #: why the store could not be reached (``Gate._give_back``): nothing was released, the
    #: holds lapse with their leases
    failed: str | None = None

    def __iter__(self) -> Iterator[str]:
        """Iterating a release yields the waiter ids to wake (what a worker acts on)."""
        return iter(self.woken)


#: ``lua/lock_release.lua``'s states (1 is "kept": still nested)
LOCK_FREED, LOCK_NOT_HELD, LOCK_FLAGGED = 0, 2, 3


def sort_claims(claims: Iterable[Claim]) -> list[Claim]:
    """Claims in ``ADMISSION_ORDER`` (stable for claims of one primitive)."""
    return sorted(claims, key=lambda claim: ADMISSION_ORDER.index(claim.primitive))


class Coordinator:
    """The coordination backend's verbs: admit, release, wait, renew, operate.

    ``client`` defaults to ``get_client()`` (resolved on each use, so settings overrides
    apply), ``prefix`` to ``REACTOR_KEY_PREFIX``. ``atomic`` forces (True) or forbids (False)
    the single-call admission; by default it is used unless the keys of a cluster client span
    several hash slots.
    """

    def __init__(
        self, client: Any = None, *, prefix: str | None = None, atomic: bool | None = None
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._atomic = atomic

    @property
    def client(self) -> Any:
        return self._client if self._client is not None else get_client()

    @property
    def prefix(self) -> str:
        return current_prefix(self._prefix)

    def _run(
        self, operation: str, keys: Sequence[str], args: Sequence[Any], claim: Claim | None = None
    ) -> ScriptReply:
        return scripts_for(self.client).run(
            operation,
            keys,
            args,
            key=claim.key if claim else None,
            primitive=claim.primitive if claim else None,
        )

    def _with_index(self, claims: Sequence[Claim], groups: list[list[str]]) -> list[list[str]]:
        """Append the live-holds index keys to the groups of locks and semaphores, so the
        scripts keep the index (on a cluster, the shard of each hold's hash slot)."""
        prefix, sharded = self.prefix, is_cluster(self.client)
        return [
            [*group, *holds_index.keys_for(claim.key, prefix, sharded=sharded)]
            if claim.primitive in HOLDING
            else group
            for claim, group in zip(claims, groups, strict=True)
        ]

    def _one_call(self, keys: Sequence[str]) -> bool:
        if self._atomic is not None:
            return self._atomic
        if not is_cluster(self.client):
            return True
        return len({hash_slot(name) for name in keys}) <= 1

    # -- admission ------------------------------------------------------------------------

    def admit(
        self, claims: Iterable[Claim], holder: Holder, *, waiter_id: str | None = None
    ) -> AdmissionResult:
        """Take every claim or none: ``Admitted | Refused | PeriodHit | ChainFailed``."""
        ordered = list(claims)
        if len(ordered) > 1:
            ordered = sort_claims(ordered)
        if not ordered:
            return Admitted(holds=[], holder=holder)
        if len(ordered) == 1 and type(ordered[0]) is LockClaim:
            return self._admit_lock(ordered[0], holder, waiter_id)
        prefix = self.prefix
        parts = [admit_part(c, prefix, is_cluster(self.client)) for c in ordered]
        groups = [list(keys) for keys, _ in parts]
        sent_at = time.monotonic()
        if len(ordered) == 1 or self._one_call([k for group in groups for k in group]):
            # an UNASSIGNED ordered position is assigned by this call (admit.lua)
            result = self._admit_call(ordered, groups, holder, waiter_id, parts)
        else:
            assigned = self._assign_positions(ordered, holder)
            ordered = with_positions(ordered, assigned)
            result = self._admit_one_by_one(ordered, groups, holder, waiter_id)
            result.assigned.update(assigned)
        if isinstance(result, Admitted):
            result.sent_at = sent_at
        return result

    def _assign_positions(
        self, claims: Sequence[Claim], holder: Holder
    ) -> dict[str, OrderedPosition]:
        """Places in line for the ``UNASSIGNED`` ordered claims of an admission that cannot
        be one script call (a cluster, keys in several slots), where no call assigns them."""
        return {
            claim.key: self.assign_position(claim.key, holder, claim.ttl)
            for claim in claims
            if isinstance(claim, OrderedLockClaim) and claim.position == UNASSIGNED
        }

    def _admit_call(
        self,
        claims: list[Claim],
        groups: list[list[str]],
        holder: Holder,
        waiter_id: str | None,
        parts: list[tuple[tuple[str, ...], str]] | None = None,
    ) -> AdmissionResult:
        prefix = self.prefix
        parts = parts or [admit_part(c, prefix, is_cluster(self.client)) for c in claims]
        specs_json = "[" + ",".join(fragment for _, fragment in parts) + "]"
        keys = [k for group in groups for k in group]
        reply = self._run(
            "admit",
            keys,
            [holder_json(holder), specs_json, waiter_id or ""],
            claims[0] if len(claims) == 1 else None,
        )
        return admission_result(reply, claims, holder)

    def _admit_lock(
        self, claim: LockClaim, holder: Holder, waiter_id: str | None
    ) -> AdmissionResult:
        """One lock on its own — the most common admission — through ``lua/lock_admit.lua``:
        the same rules as in ``admit.lua``, flat arguments and answer, no JSON either way."""
        client = self.client
        keys = lock_keys(claim.key, self.prefix, is_cluster(client), admit=True)
        # the lease counts from here (Admitted.sent_at): once the keys are built, which on a
        # cluster may first build the process's slot table (holds_index.slot_tags)
        sent_at = time.monotonic()
        with unavailable_on_connection_error(key=claim.key, primitive="lock"):
            raw = scripts_for(client).call(
                "lock_admit",
                keys,
                (
                    holder.owner,
                    holder.step or "",
                    holder.execution_id or "",
                    holder.reactor or "",
                    lock.seconds_to_ms(claim.ttl),
                    waiter_id or "",
                    claim.key,
                    holder.priority,
                ),
            )
        result = lock_admission(claim, holder, raw)
        if isinstance(result, Admitted):
            result.sent_at = sent_at
        return result

    def _admit_one_by_one(
        self,
        claims: list[Claim],
        groups: list[list[str]],
        holder: Holder,
        waiter_id: str | None,
    ) -> AdmissionResult:
        taken: list[Hold] = []
        for claim, group in zip(claims, groups, strict=True):
            result = self._admit_call([claim], [group], holder, waiter_id)
            if isinstance(result, Admitted):
                taken.extend(result.holds)
                continue
            if taken:
                # a skipped period completes the ordered position, as the one-call script does
                outcome: ReleaseOutcome = (
                    "success" if isinstance(result, PeriodHit) else "give_back"
                )
                self.release(Admitted(holds=taken, holder=holder), outcome)
            return result
        return Admitted(holds=taken, holder=holder)

    # -- release --------------------------------------------------------------------------

    def _batches(
        self, holds: list[Hold], groups: list[list[str]]
    ) -> list[tuple[list[Hold], list[list[str]]]]:
        """One script call for every hold when their keys can share a slot, else one each."""
        if len(holds) == 1 or self._one_call([k for group in groups for k in group]):
            return [(holds, groups)]
        return [([h], [g]) for h, g in zip(holds, groups, strict=True)]

    def release(
        self, admitted: Admitted, outcome: ReleaseOutcome, *, unless: Sequence[str] = ()
    ) -> Released:
        """Release every hold (reverse order) in one call; see ``lua/release.lua``.

        ``unless``: Redis keys of flags (an execution's cancel request, ``engine.cancel_flag``)
        — when one is set, nothing is released and ``Released.flagged`` is its value. On one
        server the flags are read inside the release script, in its round trip; where the
        holds' keys cannot share a call with them (a cluster), they are read just before.
        """
        holds = list(reversed(admitted.holds))
        if not holds:
            return Released()
        lone_lock = len(holds) == 1 and type(holds[0].claim) is LockClaim
        batches = []
        if not lone_lock:
            groups = self._with_index(
                [h.claim for h in holds],
                [REGISTRY[h.claim.primitive].release_keys(h.claim, self.prefix) for h in holds],
            )
            batches = self._batches(holds, groups)
        flags = list(unless)
        if flags and (is_cluster(self.client) or len(batches) > 1):
            raised = self._raised_flag(flags)  # they cannot ride on the release call
            if raised is not None:
                return Released(flagged=raised)
            flags = []
        if lone_lock:
            return self._release_lock(holds[0], admitted.holder, flags)
        freed: list[tuple[str, str]] = []
        woken: list[str] = []
        not_held: list[tuple[str, str]] = []
        marked: list[tuple[str, str]] = []
        for batch_holds, batch_groups in batches:
            base_keys = {
                group[0]: (hold.claim.primitive, hold.claim.key)
                for hold, group in zip(batch_holds, batch_groups, strict=True)
            }
            arguments = specs(
                batch_holds, batch_groups, lambda h: REGISTRY[h.claim.primitive].release_spec(h)
            )
            reply = self._run(
                "release",
                [*(k for group in batch_groups for k in group), *flags],
                [outcome, holder_json(admitted.holder), json.dumps(arguments), len(flags)],
                batch_holds[0].claim if len(batch_holds) == 1 else None,
            )
            if reply.data.get("flagged") is not None:
                return Released(flagged=str(reply.data["flagged"]))
            freed += [base_keys[name] for name in reply.data.get("freed", [])]
            woken += list(reply.data.get("woken", []))
            not_held += [base_keys[name] for name in reply.data.get("not_held", [])]
            marked += [base_keys[name] for name in reply.data.get("marked", [])]
        return Released(freed=freed, woken=woken, not_held=not_held, marked=marked)

    def _release_lock(self, hold: Hold, holder: Holder, flags: Sequence[str] = ()) -> Released:
        """One lock on its own through ``lua/lock_release.lua`` (see ``_admit_lock``); only
        the hold its admission took (its fencing token), not a later one of the same owner."""
        claim = hold.claim
        assert isinstance(claim, LockClaim)
        client = self.client
        keys = lock_keys(claim.key, self.prefix, is_cluster(client), admit=False)
        token = "" if hold.token is None else str(hold.token)
        arguments: tuple[str | int, ...] = (holder.owner, claim.key, len(flags), token)
        if flags:
            keys = (*keys, *flags)
        with unavailable_on_connection_error(key=claim.key, primitive="lock"):
            state, woken = scripts_for(client).call("lock_release", keys, arguments)
        name = ("lock", claim.key)
        state = int(state)
        if state == LOCK_FLAGGED:
            return Released(flagged=_text(woken))
        return Released(
            freed=[name] if state == LOCK_FREED else [],
            woken=[str(woken)] if woken else [],
            not_held=[name] if state == LOCK_NOT_HELD else [],
        )

    def _raised_flag(self, flags: Sequence[str]) -> str | None:
        """The first of ``flags`` that is set (read one by one: they need not share a slot)."""
        client = self.client
        with unavailable_on_connection_error(key=flags[0]):
            for name in flags:
                value = client.get(name)
                if value is not None:
                    return _text(value)
        return None

    # -- waiting and the waiter orders (coordination.waiting) -----------------------------

    wake_channel = waiting.wake_channel
    admit_waiting = waiting.admit_waiting
    register_waiter = waiting.register_waiter
    move_waiter = waiting.move_waiter
    unregister_waiter = waiting.unregister_waiter
    leave = waiting.leave
    waiters = waiting.waiters

    # -- renewal (coordination.leases) ----------------------------------------------------

    extend = leases.extend
    extend_many = leases.extend_many
    keep_alive = leases.keep_alive

    def heartbeat(self, claim: OrderedLockClaim) -> bool:
        """An ordered position says it is alive; False when it was reset/passed/completed."""
        return ordered_lock.heartbeat(claim, client=self.client, prefix=self.prefix)

    # -- ordered lock ---------------------------------------------------------------------

    def assign_position(
        self, key: str, holder: Holder, ttl: float = ordered_lock.DEFAULT_TTL
    ) -> OrderedPosition:
        return ordered_lock.assign_position(
            key, holder, ttl, client=self.client, prefix=self.prefix
        )

    def peek(self, key: str) -> ordered_lock.Position | None:
        return ordered_lock.peek(key, client=self.client, prefix=self.prefix)

    def skip(self, key: str) -> int | None:
        return ordered_lock.skip(key, client=self.client, prefix=self.prefix)

    def reset(self, key: str) -> int:
        return ordered_lock.reset(key, client=self.client, prefix=self.prefix)

    # -- operator -------------------------------------------------------------------------

    force_release = forced_release.force_release

    # -- errors (coordination.refusals) ---------------------------------------------------

    refusal_error = staticmethod(refusals.refusal_error)


__all__ = [
    "Coordinator",
    "Released",
    "sort_claims",
]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
