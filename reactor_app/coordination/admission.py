"""Admission: one atomic decision to take every claim of a unit of work (docs/design.md §2.1).

``Coordinator.admit`` sends all claims — sorted into ``ADMISSION_ORDER`` (ordered gate →
period check → lock → semaphore → rate-limit charge) — to ``lua/admit.lua`` in ONE script
call: nothing is taken unless everything is. When the keys cannot share a cluster hash slot,
the claims are admitted one by one in the same order with the same script and what was taken is
given back on the first refusal. ``release`` is one call too, in reverse order.

Contention is answered, not raised: ``Refused`` (with the primitive's ``retry_after`` hint and
a blocker snapshot), ``PeriodHit`` or ``ChainFailed``. ``refusal_error`` turns a ``Refused``
into the public exception of §1.3.

Waiting, for synchronous callers (``admit_waiting``): subscribe to the refusing key's wake
channel, retry once subscribed (so a release in between is never missed), then sleep on the
subscription until a release PUBLISHes — or until the refusal's ``retry_after`` (a lease
lapsing, a rate window sliding) or the caller's ``wait`` runs out. No fixed-interval polling.
A release that hands a lock to the head registered waiter names it, and only that waiter
wakes. Worker deliveries wait the same way before they park, registered as waiters.

A period bucket another owner is running (``PERIOD_IN_FLIGHT``) is contention like a held
lock: waited for (woken when that run ends, or at its lease's end) or parked, and then skipped
(done) or run (freed).

Parked workers (§2.3) instead pass ``waiter_id``: a refusal registers it atomically in the
refusing key's waiters zset, and the release that frees the key pops it and returns it in
``Released.woken`` so the caller can re-enqueue that execution at once.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

from reactor_app.coordination import (
    holds_index,
    lock,
    ordered_lock,
    semaphore,
)
from reactor_app.coordination.claims import (
    ADMISSION_ORDER,
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
    PeriodClaim,
    PeriodHit,
    RefusalDetail,
    Refused,
)
from reactor_app.coordination.keys import current_prefix, hash_slot
from reactor_app.coordination.primitives import REGISTRY, RENEWABLE
from reactor_app.coordination.redis import (
    get_client,
    is_cluster,
    server_time,
    unavailable_on_connection_error,
)
from reactor_app.coordination.scripts import (
    STATUSES,
    ScriptReply,
    Status,
    decode_reply,
    holder_json,
    scripts_for,
)
from reactor_app.exceptions import (
    CoordinationError,
    CoordinationUnavailable,
    LeaseLost,
    LockAcquisitionError,
    OrderedLockWaitError,
    PeriodInFlightError,
    RateLimitExceeded,
    SemaphoreAcquisitionError,
)

if TYPE_CHECKING:
    from reactor_app.coordination.renewal import Renewal


logger = logging.getLogger(__name__)

ReleaseOutcome = Outcome | Literal["give_back"]

#: the shortest pause between two attempts of ``admit_waiting`` (seconds), so that a hint of
#: zero (a lease lapsing right now) cannot turn into a busy loop
MIN_PAUSE = 0.001


@dataclass
class TrackedHold(Hold):
    """A ``Hold`` with what release needs from its admission (period bucket, rate-limit entry)
    and the Redis time of admission (``detail["time"]``, ``"seconds.micros"``)."""

    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Released:
    """What a release did. Keys are ``(primitive, user key)`` pairs."""

    freed: list[tuple[str, str]] = field(default_factory=list)
    woken: list[str] = field(default_factory=list)  # parked waiter ids to re-enqueue now
    not_held: list[tuple[str, str]] = field(default_factory=list)  # lapsed or taken over
    marked: list[tuple[str, str]] = field(default_factory=list)  # period buckets marked

    def __iter__(self) -> Iterator[str]:
        """Iterating a release yields the waiter ids to wake (what a worker acts on)."""
        return iter(self.woken)


@dataclass(frozen=True)
class Extended:
    """What a renewal did: holds renewed and holds found lost, with the reason."""

    extended: list[Hold] = field(default_factory=list)
    granted_ms: list[int] = field(default_factory=list)  # lease now granted, per extended hold
    lost: list[tuple[Hold, str]] = field(default_factory=list)


@dataclass(frozen=True)
class ForceReleased:
    released: list[str] = field(default_factory=list)  # owners whose hold was removed
    woken: list[str] = field(default_factory=list)


def _admit_part(claim: Claim, prefix: str, sharded: bool) -> tuple[tuple[str, ...], str]:
    """A claim's keys and its admission spec as a JSON fragment, built once per claim (the
    same declaration on the same key hits the cache): no per-call key building or JSON
    encoding of what never changes. A lock's or semaphore's group ends with the live-holds
    index keys — ``sharded`` (a cluster): its hash slot's shard of the index."""
    try:
        return _cached_admit_part(claim, prefix, sharded)
    except TypeError:  # a claim with an unhashable field: built every time, as before
        return _build_admit_part(claim, prefix, sharded)


def _build_admit_part(claim: Claim, prefix: str, sharded: bool) -> tuple[tuple[str, ...], str]:
    module = REGISTRY[claim.primitive]
    keys = list(module.admit_keys(claim, prefix))
    if claim.primitive in holds_index.INDEXED:
        keys.extend(holds_index.keys_for(claim.key, prefix, sharded=sharded))
    spec = {
        "p": claim.primitive,
        "n": len(keys),
        **module.admit_spec(claim),
        **_index_spec(claim, keys),
    }
    return tuple(keys), json.dumps(spec)


_cached_admit_part = lru_cache(maxsize=4096)(_build_admit_part)


#: ``lua/lock_release.lua``'s states (1 is "kept": still nested)
LOCK_FREED, LOCK_NOT_HELD = 0, 2


@lru_cache(maxsize=4096)
def _lock_keys(user_key: str, prefix: str, sharded: bool, *, admit: bool) -> tuple[str, ...]:
    """A lock's keys for the fast-path scripts (built once per key), index keys last (on a
    cluster, ``sharded``, its hash slot's shard)."""
    claim = LockClaim(user_key)
    keys = lock.admit_keys(claim, prefix) if admit else lock.release_keys(claim, prefix)
    keys.extend(holds_index.keys_for(user_key, prefix, sharded=sharded))
    return tuple(keys)


def sort_claims(claims: Iterable[Claim]) -> list[Claim]:
    """Claims in ``ADMISSION_ORDER`` (stable for claims of one primitive)."""
    return sorted(claims, key=lambda claim: ADMISSION_ORDER.index(claim.primitive))


def _specs(
    holds: list[Hold], groups: list[list[str]], spec: Callable[[Hold], dict[str, Any]]
) -> list[dict[str, Any]]:
    """The per-hold argument specs of a script call: primitive, key count and its own fields."""
    return [
        {"p": h.claim.primitive, "n": len(g), **spec(h), **_index_spec(h.claim, g)}
        for h, g in zip(holds, groups, strict=True)
    ]


def _index_spec(claim: Claim, group: list[str]) -> dict[str, Any]:
    """``ik`` (the user key) for a group that ends with the live-holds index keys."""
    if claim.primitive in holds_index.INDEXED and holds_index.is_index_group(group):
        return {"ik": claim.key}
    return {}


def _ids(data: dict[str, Any]) -> list[str]:
    """The ``woken`` waiter ids of a reply (cjson encodes an empty list as ``{}``)."""
    woken = data.get("woken")
    return [str(w) for w in woken] if isinstance(woken, list) else []


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else max(float(ms), 0.0) / 1000


def _blocker(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """Blocker snapshot with seconds: owner, step, execution, reactor, since, ttl."""
    if not raw:
        return None
    since = raw.get("since", raw.get("acquired_at", raw.get("assigned_at")))
    blocker = {
        "owner": raw.get("owner"),
        "step": raw.get("step") or None,
        "execution": raw.get("execution") or None,
        "reactor": raw.get("reactor") or None,
        "since": since / 1000 if since else None,
        "ttl": _seconds(raw.get("ttl_ms")),
    }
    if raw.get("granted_to"):
        # a free lock the last release handed to this waiter (FIFO hand-off), not yet taken
        blocker["granted_to"] = raw["granted_to"]
    return blocker


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
            if claim.primitive in holds_index.INDEXED
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
            sent_at = time.monotonic()
            result = self._admit_lock(ordered[0], holder, waiter_id)
            if isinstance(result, Admitted):
                result.sent_at = sent_at
            return result
        prefix = self.prefix
        parts = [_admit_part(c, prefix, is_cluster(self.client)) for c in ordered]
        groups = [list(keys) for keys, _ in parts]
        sent_at = time.monotonic()
        if len(ordered) == 1 or self._one_call([k for group in groups for k in group]):
            result = self._admit_call(ordered, groups, holder, waiter_id, parts)
        else:
            result = self._admit_one_by_one(ordered, groups, holder, waiter_id)
        if isinstance(result, Admitted):
            result.sent_at = sent_at
        return result

    def _admit_call(
        self,
        claims: list[Claim],
        groups: list[list[str]],
        holder: Holder,
        waiter_id: str | None,
        parts: list[tuple[tuple[str, ...], str]] | None = None,
    ) -> AdmissionResult:
        prefix = self.prefix
        parts = parts or [_admit_part(c, prefix, is_cluster(self.client)) for c in claims]
        specs = "[" + ",".join(fragment for _, fragment in parts) + "]"
        keys = [k for group in groups for k in group]
        reply = self._run(
            "admit",
            keys,
            [holder_json(holder), specs, waiter_id or ""],
            claims[0] if len(claims) == 1 else None,
        )
        return self._admission_result(reply, claims, holder)

    def _admit_lock(
        self, claim: LockClaim, holder: Holder, waiter_id: str | None
    ) -> AdmissionResult:
        """One lock on its own — the most common admission — through ``lua/lock_admit.lua``:
        the same rules as in ``admit.lua``, flat arguments and answer, no JSON either way."""
        client = self.client
        keys = _lock_keys(claim.key, self.prefix, is_cluster(client), admit=True)
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
                ),
            )
        if int(raw[0]) == Status.OK:
            hold = TrackedHold(
                claim=claim, fresh=bool(raw[2]), token=int(raw[3]), detail={"time": raw[1]}
            )
            return Admitted(holds=[hold], holder=holder)
        _, at, retry_ms, owner, step, execution, reactor, since, ttl_ms, granted_to = raw
        return Refused(
            claim=claim,
            retry_after=None if int(retry_ms) < 0 else _seconds(retry_ms),
            blocker=_blocker(
                {
                    "owner": owner or None,
                    "step": step,
                    "execution": execution,
                    "reactor": reactor,
                    "since": int(since) if int(since) > 0 else None,
                    "ttl_ms": None if int(ttl_ms) < 0 else int(ttl_ms),
                    "granted_to": granted_to,
                }
            ),
            detail=RefusalDetail(status=int(Status.LOCKED), time=str(at)),
        )

    def _admission_result(
        self, reply: ScriptReply, claims: list[Claim], holder: Holder
    ) -> AdmissionResult:
        data = reply.data
        if reply.status is Status.OK:
            holds: list[Hold] = []
            for claim, raw in zip(claims, data["holds"], strict=True):
                detail = {k: v for k, v in raw.items() if k not in ("fresh", "token")}
                detail["time"] = data["time"]
                holds.append(
                    TrackedHold(
                        claim=claim,
                        fresh=bool(raw.get("fresh")),
                        token=int(raw["token"]) if raw.get("token") is not None else None,
                        detail=detail,
                    )
                )
            return Admitted(holds=holds, holder=holder)
        claim = claims[int(data.get("index", 0))]
        if reply.status is Status.PERIOD_MARKED:
            assert isinstance(claim, PeriodClaim)
            return PeriodHit(claim=claim, marked_by=data.get("marked_by") or None, woken=_ids(data))
        if reply.status is Status.CHAIN_FAILED:
            assert isinstance(claim, OrderedLockClaim)
            return ChainFailed(claim=claim, first_failed=data.get("first_failed"), woken=_ids(data))
        window_ms = data.get("window_ms")
        refusal = RefusalDetail(
            status=int(reply.status),
            time=str(data.get("time", "")),
            stale=reply.status is Status.ORDERED_STALE,
            limit=data.get("limit"),
            held=data.get("held"),
            label=data.get("label"),
            window=None if window_ms is None else window_ms / 1000,
            count=data.get("count"),
            cost=data.get("cost"),
            bucket=data.get("bucket"),
            bucket_end=data.get("bucket_end"),
            nonce=data.get("nonce"),
            epoch=data.get("epoch"),
            head=data.get("head"),
            last_completed=data.get("last_completed"),
            reason=data.get("reason"),
        )
        return Refused(
            claim=claim,
            retry_after=_seconds(data.get("retry_after_ms")),
            blocker=_blocker(data.get("blocker")),
            detail=refusal,
        )

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

    def release(self, admitted: Admitted, outcome: ReleaseOutcome) -> Released:
        """Release every hold (reverse order) in one call; see ``lua/release.lua``."""
        holds = list(reversed(admitted.holds))
        if not holds:
            return Released()
        if len(holds) == 1 and type(holds[0].claim) is LockClaim:
            return self._release_lock(holds[0].claim, admitted.holder)
        groups = self._with_index(
            [h.claim for h in holds],
            [REGISTRY[h.claim.primitive].release_keys(h.claim, self.prefix) for h in holds],
        )
        freed: list[tuple[str, str]] = []
        woken: list[str] = []
        not_held: list[tuple[str, str]] = []
        marked: list[tuple[str, str]] = []
        for batch_holds, batch_groups in self._batches(holds, groups):
            base_keys = {
                group[0]: (hold.claim.primitive, hold.claim.key)
                for hold, group in zip(batch_holds, batch_groups, strict=True)
            }
            specs = _specs(
                batch_holds, batch_groups, lambda h: REGISTRY[h.claim.primitive].release_spec(h)
            )
            reply = self._run(
                "release",
                [k for group in batch_groups for k in group],
                [outcome, holder_json(admitted.holder), json.dumps(specs)],
                batch_holds[0].claim if len(batch_holds) == 1 else None,
            )
            freed += [base_keys[name] for name in reply.data.get("freed", [])]
            woken += list(reply.data.get("woken", []))
            not_held += [base_keys[name] for name in reply.data.get("not_held", [])]
            marked += [base_keys[name] for name in reply.data.get("marked", [])]
        return Released(freed=freed, woken=woken, not_held=not_held, marked=marked)

    def _release_lock(self, claim: LockClaim, holder: Holder) -> Released:
        """One lock on its own through ``lua/lock_release.lua`` (see ``_admit_lock``)."""
        client = self.client
        keys = _lock_keys(claim.key, self.prefix, is_cluster(client), admit=False)
        with unavailable_on_connection_error(key=claim.key, primitive="lock"):
            state, woken = scripts_for(client).call("lock_release", keys, (holder.owner, claim.key))
        name = ("lock", claim.key)
        state = int(state)
        return Released(
            freed=[name] if state == LOCK_FREED else [],
            woken=[str(woken)] if woken else [],
            not_held=[name] if state == LOCK_NOT_HELD else [],
        )

    # -- waiting --------------------------------------------------------------------------

    def wake_channel(self, claim: Claim) -> str | None:
        """The pub/sub channel a release of ``claim``'s key PUBLISHes on (None: never)."""
        channel: str | None = REGISTRY[claim.primitive].wake_channel(claim, self.prefix)
        return channel

    def admit_waiting(
        self,
        claims: Iterable[Claim],
        holder: Holder,
        wait_seconds: float,
        *,
        waiter_id: str | None = None,
        waits: Mapping[str, float] | None = None,
        refused: Refused | None = None,
    ) -> AdmissionResult:
        """Admit, waiting up to ``wait_seconds`` for contention to clear (0 = one try).

        ``waits`` bounds the wait per refusing primitive (``{"lock": 0, "ordered_lock":
        600}``): a lock declared with ``wait=0`` fails at once even when an ordered lock beside
        it would wait its turn. Woken by the release's PUBLISH, or at the refusal's
        ``retry_after``; gives up with the last ``Refused`` when the wait is spent. A stale
        ordered position is returned at once (waiting cannot help: the caller must re-assign).

        A caller that waits is registered in the refusing keys' waiter order, so waiters are
        admitted first come, first served: a release hands a lock to the head waiter and names
        it, and a wake message naming another waiter does not wake this one (see
        ``_sleep_until_woken``). ``waiter_id`` is the caller's own registration (a worker
        delivery's in-process wait, ``engine.gate``, which it moves to its parked id when it
        parks); without one the wait registers under a private ``WAITING_PREFIX`` id and leaves
        every waiter order when it ends unadmitted (``leave``) — a key handed to it meanwhile
        goes on to the next waiter at once, and a parked one that gets it is listed in the
        answer's ``woken``. ``refused`` is the answer of an admission the caller already made,
        so the first attempt is not repeated.
        """
        claims = list(claims)
        started = time.monotonic()
        limits = dict(waits or {})
        queue_as = waiter_id or f"{WAITING_PREFIX}{uuid.uuid4().hex}"
        queued = False  # whether an attempt was made under ``queue_as`` (own registration only)

        def deadline_for(refused: Refused) -> float:
            allowed = min(wait_seconds, limits.get(refused.claim.primitive, wait_seconds))
            return started + max(allowed, 0.0)

        result = refused if refused is not None else self.admit(claims, holder, waiter_id=waiter_id)
        if (
            not isinstance(result, Refused)
            or deadline_for(result) <= time.monotonic()
            or result.detail.stale
        ):
            return result
        with unavailable_on_connection_error(
            key=result.claim.key, primitive=result.claim.primitive
        ):
            pubsub = self.client.pubsub()
        subscribed: set[str] = set()
        try:
            while True:
                channel = self.wake_channel(result.claim)
                if channel is not None and channel not in subscribed:
                    self._subscribe(pubsub, channel, deadline_for(result))
                    subscribed.add(channel)
                    # the release may have happened between the refusal and the subscription
                else:
                    remaining = deadline_for(result) - time.monotonic()
                    if remaining <= 0:
                        return result
                    pause = remaining
                    if result.retry_after is not None:
                        pause = min(remaining, max(result.retry_after, MIN_PAUSE))
                    self._sleep_until_woken(pubsub if subscribed else None, pause, queue_as)
                queued = waiter_id is None
                result = self.admit(claims, holder, waiter_id=queue_as)
                if not isinstance(result, Refused) or result.detail.stale:
                    return result
        finally:
            with unavailable_on_connection_error():
                pubsub.close()
            if queued and not isinstance(result, Admitted):
                handed_on = self.leave(claims, queue_as)
                woken = getattr(result, "woken", None)
                if isinstance(woken, list):
                    woken.extend(handed_on)

    @staticmethod
    def _subscribe(pubsub: Any, channel: str, deadline: float) -> None:
        """SUBSCRIBE and wait for the confirmation, so a later PUBLISH cannot be missed."""
        with unavailable_on_connection_error():
            pubsub.subscribe(channel)
            while True:
                left = max(deadline - time.monotonic(), 0.05)
                message = pubsub.get_message(timeout=left)
                if message is None or (
                    message["type"] == "subscribe" and message["channel"] == channel
                ):
                    return

    @staticmethod
    def _sleep_until_woken(pubsub: Any | None, seconds: float, waiter_id: str | None) -> None:
        """Sleep up to ``seconds``; return early on a wake message that concerns ``waiter_id``.

        A release that frees a lock grants it to the head registered waiter for a moment
        (``lua/_lock.lua``) and its message names that waiter (``to``). Only the named waiter
        can take the key then, so a message naming another one does not end the sleep — with
        several waiters on one key, every one of them would otherwise wake on every release
        and run an admission only the head could win, competing for the CPU with the winner
        at the very moment the key is idle. It shortens the sleep to when that grant would
        lapse unused (``grant_ms``), so a waiter asks again if the named one is gone. A
        message naming nobody (a semaphore slot, an ordered-lock cursor, a lock nobody was
        registered for, a forced release) wakes every waiter.
        """
        if pubsub is None:
            time.sleep(seconds)
            return
        end = time.monotonic() + seconds
        with unavailable_on_connection_error():
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    return
                message = pubsub.get_message(timeout=left)
                if message is None or message["type"] != "message":
                    continue
                granted_to, grant_ms = _grant(message.get("data"))
                if granted_to is None or granted_to == waiter_id:
                    return
                end = min(end, time.monotonic() + grant_ms / 1000 + MIN_PAUSE)

    # -- parked waiters -------------------------------------------------------------------

    def register_waiter(self, claim: Claim, waiter_id: str, ttl: float = 86400.0) -> bool:
        """Park ``waiter_id`` on ``claim``'s key: the next release that frees it returns the id
        in ``Released.woken``. (``admit(..., waiter_id=...)`` registers atomically on refusal,
        which is what workers should use.) False for the rate limit, which never releases."""
        name = REGISTRY[claim.primitive].claim_waiters_key(claim, self.prefix)
        if name is None:
            return False
        score = claim.position.nonce if isinstance(claim, OrderedLockClaim) else None
        with unavailable_on_connection_error(key=claim.key, primitive=claim.primitive):
            client = self.client
            if score is None:
                seconds, micros = server_time(client, name)
                score = seconds * 1000 + micros // 1000
            pipe = client.pipeline(transaction=False)
            pipe.zadd(name, {waiter_id: score})
            pipe.pexpire(name, lock.seconds_to_ms(ttl))
            pipe.execute()
        return True

    def move_waiter(self, claim: Claim, from_id: str, to_id: str) -> None:
        """Give ``to_id`` the place ``from_id`` had in ``claim``'s waiter order (a worker
        delivery that waited in-process and now parks keeps its turn), dropping ``from_id``.
        ``to_id`` must already be registered (the parking admission registered it)."""
        name = REGISTRY[claim.primitive].claim_waiters_key(claim, self.prefix)
        if name is None:
            return
        with unavailable_on_connection_error(key=claim.key, primitive=claim.primitive):
            score = self.client.zscore(name, from_id)
            pipe = self.client.pipeline(transaction=False)
            if score is not None and score >= 0:
                pipe.zadd(name, {to_id: score}, xx=True)
            pipe.zrem(name, from_id)
            pipe.execute()

    def unregister_waiter(self, claim: Claim, waiter_id: str) -> list[str]:
        """Take ``waiter_id`` out of ``claim``'s waiter order (a wait that ended unadmitted, a
        worker delivery that stopped waiting in-process and parked under its own id instead).
        A lock the last release handed to ``waiter_id``, still unused, goes on to the next
        waiter (``lua/lock_leave.lua``); returns that waiter's id in a list (else ``[]``):
        a parked one must be re-enqueued like any woken waiter."""
        name = REGISTRY[claim.primitive].claim_waiters_key(claim, self.prefix)
        if name is None:
            return []
        with unavailable_on_connection_error(key=claim.key, primitive=claim.primitive):
            if isinstance(claim, LockClaim):
                keys = lock.release_keys(claim, self.prefix)
                handed_on = scripts_for(self.client).call("lock_leave", keys, [waiter_id])
                return [handed_on] if handed_on else []
            self.client.zrem(name, waiter_id)
        return []

    def leave(self, claims: Iterable[Claim], waiter_id: str) -> list[str]:
        """``unregister_waiter`` for every claim, best effort: a wait ending on an outage
        leaves what it can (its registrations expire with their zsets). Returns the waiters
        the keys were handed on to."""
        handed_on: list[str] = []
        for claim in claims:
            try:
                handed_on += self.unregister_waiter(claim, waiter_id)
            except CoordinationUnavailable:
                logger.warning("could not leave the waiters of %s %s", claim.primitive, claim.key)
        return handed_on

    def waiters(self, claim: Claim) -> list[str]:
        """Parked waiter ids of ``claim``'s key, first to be woken first."""
        name = REGISTRY[claim.primitive].claim_waiters_key(claim, self.prefix)
        if name is None:
            return []
        with unavailable_on_connection_error(key=claim.key, primitive=claim.primitive):
            # a lock's hand-off grant sorts first (negative score): not a waiter
            return list(self.client.zrangebyscore(name, 0, "+inf"))

    # -- renewal --------------------------------------------------------------------------

    def extend(
        self,
        holds: Sequence[Hold],
        owner: str,
        *,
        renew: Callable[[Hold], bool] | None = None,
        lease_ms: int | None = None,
    ) -> Extended:
        """Renew the leases of lock and semaphore ``holds`` and period reservations (one
        call); see extend.lua.

        ``renew`` picks the holds whose lease is renewed; the others are only checked (still
        held by ``owner`` with their token, lease not expired) and keep the lease they have.
        By default every hold is renewed. A hold re-adopted after a park (``Gate.enter``) uses
        this: a lock declared without ``auto_extend`` must not outlive its TTL because of it.
        ``lease_ms`` grants that lease instead of each claim's own TTL (a hold kept across a
        park is made to cover the park); a lease is never shortened.
        """
        items = [h for h in holds if h.claim.primitive in RENEWABLE]
        if not items:
            return Extended()
        groups = self._with_index(
            [h.claim for h in items],
            [RENEWABLE[h.claim.primitive].extend_keys(h.claim, self.prefix) for h in items],
        )
        extended: list[Hold] = []
        granted_ms: list[int] = []
        lost: list[tuple[Hold, str]] = []

        def spec(hold: Hold) -> dict[str, Any]:
            return {
                **RENEWABLE[hold.claim.primitive].extend_spec(hold, owner),
                **({} if lease_ms is None else {"ttl_ms": lease_ms}),
                # a lease of 0 ms never lengthens one: extend.lua only checks the hold
                **({} if renew is None or renew(hold) else {"ttl_ms": 0}),
            }

        for batch_holds, batch_groups in self._batches(items, groups):
            specs = _specs(batch_holds, batch_groups, spec)
            reply = self._run(
                "extend",
                [k for g in batch_groups for k in g],
                [json.dumps(specs)],
                batch_holds[0].claim if len(batch_holds) == 1 else None,
            )
            extended += [batch_holds[i] for i in reply.data.get("extended", [])]
            granted_ms += [int(ms) for ms in reply.data.get("ttl_ms", [])]
            lost += [(batch_holds[e["index"]], e["reason"]) for e in reply.data.get("lost", [])]
        return Extended(extended=extended, granted_ms=granted_ms, lost=lost)

    def extend_many(self, requests: Sequence[tuple[Sequence[Hold], str]]) -> list[Extended]:
        """Renew several admissions' leases — ``(holds, owner)`` each — in ONE pipeline (the
        renewal scheduler's round). A cluster client, whose pipeline cannot carry scripts of
        several slots, renews them one call each."""
        client = self.client
        if len(requests) == 1 or is_cluster(client):
            return [self.extend(holds, owner) for holds, owner in requests]
        scripts = scripts_for(client)
        prefix = self.prefix
        plans: list[list[Hold]] = []
        with unavailable_on_connection_error():
            pipe = client.pipeline(transaction=False)
            for holds, owner in requests:
                items = [h for h in holds if h.claim.primitive in RENEWABLE]
                plans.append(items)
                if not items:
                    continue
                groups = self._with_index(
                    [h.claim for h in items],
                    [RENEWABLE[h.claim.primitive].extend_keys(h.claim, prefix) for h in items],
                )
                specs = [
                    {
                        "p": h.claim.primitive,
                        "n": len(g),
                        **RENEWABLE[h.claim.primitive].extend_spec(h, owner),
                        **_index_spec(h.claim, g),
                    }
                    for h, g in zip(items, groups, strict=True)
                ]
                scripts.queue(pipe, "extend", [k for g in groups for k in g], [json.dumps(specs)])
            raws = iter(pipe.execute())
        answers: list[Extended] = []
        for items in plans:
            if not items:
                answers.append(Extended())
                continue
            data = decode_reply(next(raws)).data
            answers.append(
                Extended(
                    extended=[items[i] for i in data.get("extended", [])],
                    granted_ms=[int(ms) for ms in data.get("ttl_ms", [])],
                    lost=[(items[e["index"]], e["reason"]) for e in data.get("lost", [])],
                )
            )
        return answers

    def keep_alive(
        self,
        admitted: Admitted,
        *,
        on_lost: Callable[[LeaseLost], None] | None = None,
        on_extended: Callable[[str, int], None] | None = None,
    ) -> Renewal | None:
        """Start the renewal thread for ``admitted`` (None when nothing needs renewing):
        auto-extended locks, semaphore leases and ordered-lock heartbeats. ``on_extended``
        receives ``(key, granted lease ms)`` per renewed lease."""
        from reactor_app.coordination.renewal import start_renewal

        return start_renewal(admitted, coordinator=self, on_lost=on_lost, on_extended=on_extended)

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

    def force_release(self, primitive: str, key: str, owner: str | None = None) -> ForceReleased:
        """Remove a lock (or a semaphore's holders, or one owner's slot) whatever its nesting.
        Ordered locks have ``skip``/``reset`` instead."""
        prefix = self.prefix
        if primitive == "lock":
            keys = [lock.hold_key(key, prefix), lock.waiters_key(key, prefix)]
        elif primitive == "semaphore":
            keys = [
                semaphore.leases_key(key, prefix),
                semaphore.holders_key(key, prefix),
                semaphore.waiters_key(key, prefix),
            ]
        else:
            raise ValueError(
                f"force_release supports 'lock' and 'semaphore', not {primitive!r} "
                "(use skip/reset for an ordered lock)"
            )
        args = [primitive, owner or "", key]
        keys += holds_index.keys_for(key, prefix, sharded=is_cluster(self.client))
        reply = scripts_for(self.client).run(
            "force_release", keys, args, key=key, primitive=primitive
        )
        if reply.status is Status.NOT_FOUND:
            return ForceReleased()
        return ForceReleased(
            released=list(reply.data.get("released", [])), woken=list(reply.data.get("woken", []))
        )

    # -- errors ---------------------------------------------------------------------------

    @staticmethod
    def refusal_error(
        refused: Refused, reactor: str | None = None, step: str | None = None
    ) -> CoordinationError:
        return refusal_error(refused, reactor, step)


def _where(reactor: str | None, step: str | None) -> str:
    parts = []
    if reactor:
        parts.append(f"reactor {reactor}")
    if step:
        parts.append(f"step {step!r}")
    return ", ".join(parts) or "direct call"


def _who(blocker: dict[str, Any] | None) -> str:
    if not blocker:
        return "another execution"
    text = f"owner {blocker.get('owner')}"
    if blocker.get("step"):
        text += f" (step {blocker['step']!r}"
        text += f" of {blocker['reactor']})" if blocker.get("reactor") else ")"
    elif blocker.get("reactor"):
        text += f" ({blocker['reactor']})"
    return text


def _after(retry_after: float | None) -> str:
    return f"; retry after {retry_after:.3f}s" if retry_after is not None else ""


def refusal_error(
    refused: Refused, reactor: str | None = None, step: str | None = None
) -> CoordinationError:
    """The public error for a contention refusal, naming reactor, step and key (§1.3)."""
    claim = refused.claim
    status = Status(refused.detail.status)
    error_class = STATUSES[status].error
    where = _where(reactor, step)
    common: dict[str, Any] = {
        "reactor": reactor,
        "step": step,
        "key": claim.key,
        "primitive": claim.primitive,
    }
    if error_class is LockAcquisitionError:
        return LockAcquisitionError(
            f"{where}: lock {claim.key!r} is held by {_who(refused.blocker)}"
            + _after(refused.retry_after),
            retry_after=refused.retry_after,
            holder=refused.blocker,
            **common,
        )
    if error_class is SemaphoreAcquisitionError:
        limit = refused.detail.limit or getattr(claim, "limit", None)
        return SemaphoreAcquisitionError(
            f"{where}: all {limit} slots of semaphore {claim.key!r} are taken"
            + _after(refused.retry_after),
            retry_after=refused.retry_after,
            limit=limit,
            **common,
        )
    if error_class is PeriodInFlightError:
        bucket = refused.detail.bucket
        return PeriodInFlightError(
            f"{where}: period {claim.key!r} (bucket starting {bucket}) is being run by "
            f"{_who(refused.blocker)}; it will be done or free when that run ends"
            + _after(refused.retry_after),
            retry_after=refused.retry_after,
            holder=refused.blocker,
            bucket=bucket,
            **common,
        )
    if error_class is RateLimitExceeded:
        limit = refused.detail.limit
        label = refused.detail.label
        cost = refused.detail.cost or getattr(claim, "cost", 1)
        charged = f" (this admission costs {cost})" if cost != 1 else ""
        return RateLimitExceeded(
            f"{where}: rate limit {claim.key!r} allows {limit} per {label}{charged}"
            + _after(refused.retry_after),
            retry_after=refused.retry_after,
            limit=limit,
            period=label,
            **common,
        )
    nonce = refused.detail.nonce
    last_completed = refused.detail.last_completed
    if refused.detail.stale:
        text = f"{where}: ordered lock {claim.key!r}: position {nonce} is stale (reset or passed)"
    else:
        text = (
            f"{where}: ordered lock {claim.key!r}: position {nonce} waits for position "
            f"{refused.detail.head} (last completed {last_completed})"
        )
    return OrderedLockWaitError(
        text + _after(refused.retry_after),
        nonce=nonce,
        last_completed=last_completed,
        retry_after=refused.retry_after,
        **common,
    )


def lease_lost(hold: Hold, holder: Holder, reason: str) -> LeaseLost:
    """The ``LeaseLost`` error for a hold whose renewal failed."""
    return LeaseLost(
        f"{_where(holder.reactor, holder.step)}: the {hold.claim.primitive} on "
        f"{hold.claim.key!r} was lost ({reason}); it may now belong to someone else",
        reactor=holder.reactor,
        step=holder.step,
        key=hold.claim.key,
        primitive=hold.claim.primitive,
        token=hold.token,
        reason=reason,
    )


__all__ = [
    "Coordinator",
    "Extended",
    "ForceReleased",
    "Released",
    "TrackedHold",
    "lease_lost",
    "refusal_error",
    "sort_claims",
]


def _grant(data: Any) -> tuple[str | None, float]:
    """``(to, grant_ms)`` of a wake message, ``(None, 0)`` when it names no waiter."""
    try:
        message = json.loads(data)
    except (TypeError, ValueError):
        return None, 0.0
    if not isinstance(message, dict) or not message.get("to"):
        return None, 0.0
    return str(message["to"]), float(message.get("grant_ms") or 0.0)
