"""Waiting for contention to clear, and the waiter orders of the keys.

Waiting, for synchronous callers (``admit_waiting``): subscribe to the refusing key's wake
channel, retry once subscribed (so a release in between is never missed), then sleep on the
subscription until a release PUBLISHes — or until the refusal's ``retry_after`` (a lease
lapsing, a rate window sliding) or the caller's ``wait`` runs out. No fixed-interval polling.
A release that hands a lock to the head registered waiter names it, and only that waiter
wakes. Worker deliveries wait the same way before they park, registered as waiters.

A period bucket another owner is running (``PERIOD_IN_FLIGHT``) is contention like a held
lock: waited for (woken when that run ends, or at its lease's end) or parked, and then skipped
(done) or run (freed).

Parked workers (§2.3) instead pass ``waiter_id`` to ``Coordinator.admit``: a refusal registers
it atomically in the refusing key's waiters zset, and the release that frees the key pops it
and returns it in ``Released.woken`` so the caller can re-enqueue that execution at once. The
waiter registry below (``register_waiter``, ``move_waiter``, ``unregister_waiter``, ``leave``,
``waiters``) reads and edits those zsets outside an admission.

Each public function takes the ``Coordinator`` (its client and prefix) first: they are its
methods (``Coordinator.admit_waiting``, ``Coordinator.waiters``, ...).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from reactor_app.coordination import live_limits, lock, semaphore, subscriptions
from reactor_app.coordination.claims import (
    WAITING_PREFIX,
    AdmissionResult,
    Admitted,
    Claim,
    Holder,
    LockClaim,
    OrderedLockClaim,
    OrderedPosition,
    Refused,
    SemaphoreClaim,
    with_positions,
)
from reactor_app.coordination.primitives import REGISTRY
from reactor_app.coordination.redis import server_time, unavailable_on_connection_error
from reactor_app.coordination.scripts import scripts_for
from reactor_app.exceptions import CoordinationUnavailable

if TYPE_CHECKING:
    from reactor_app.coordination.admission import Coordinator

logger = logging.getLogger(__name__)

#: the shortest pause between two attempts of ``admit_waiting`` (seconds), so that a hint of
#: zero (a lease lapsing right now) cannot turn into a busy loop
MIN_PAUSE = 0.001


# -- waiting -----------------------------------------------------------------------------------


def wake_channel(coordinator: Coordinator, claim: Claim) -> str | None:
    """The pub/sub channel a release of ``claim``'s key PUBLISHes on (None: never)."""
    channel: str | None = REGISTRY[claim.primitive].wake_channel(claim, coordinator.prefix)
    return channel


def admit_waiting(
    coordinator: Coordinator,
    claims: Iterable[Claim],
    holder: Holder,
    wait_seconds: float,
    *,
    waiter_id: str | None = None,
    waits: Mapping[str, float] | None = None,
    refused: Refused | None = None,
    settle_later: bool = False,
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
    so the first attempt is not repeated. ``settle_later``: a wait that ends admitted leaves
    its UNSUBSCRIBE out of the critical section it admits to: the caller calls
    ``subscriptions.settle()`` once it has released (``coordination.subscriptions``).
    """
    wanted: list[Claim] = list(claims)
    started = time.monotonic()
    limits = dict(waits or {})
    queue_as = waiter_id or f"{WAITING_PREFIX}{uuid.uuid4().hex}"
    queued = False  # whether an attempt was made under ``queue_as`` (own registration only)

    def deadline_for(refused: Refused) -> float:
        allowed = min(wait_seconds, limits.get(refused.claim.primitive, wait_seconds))
        return started + max(allowed, 0.0)

    #: ordered positions an attempt assigned (``claims.UNASSIGNED``): every later attempt
    #: keeps that place in the line, and the answer reports it, whichever attempt it is
    assigned: dict[str, OrderedPosition] = {}

    #: waiters any attempt granted a semaphore's free slots to (``lua/_semaphore.lua``): the
    #: answer reports them all, whichever attempt it is, so the parked ones are re-enqueued
    granted: list[str] = []

    def attempt(queue: str | None) -> AdmissionResult:
        nonlocal wanted
        answer = coordinator.admit(wanted, holder, waiter_id=queue)
        if answer.assigned:
            assigned.update(answer.assigned)
            wanted = with_positions(wanted, answer.assigned)
        answer.assigned = dict(assigned)
        if isinstance(answer, (Admitted, Refused)):
            granted.extend(w for w in answer.woken if w not in granted)
            answer.woken = list(granted)
        return answer

    if refused is not None:
        assigned.update(refused.assigned)
        wanted = with_positions(wanted, refused.assigned)
        granted.extend(refused.woken)  # the caller's own attempt may have granted some
        result: AdmissionResult = refused
    else:
        result = attempt(waiter_id)
    if (
        not isinstance(result, Refused)
        or deadline_for(result) <= time.monotonic()
        or result.detail.stale
    ):
        return result
    with unavailable_on_connection_error(key=result.claim.key, primitive=result.claim.primitive):
        pubsub = subscriptions.borrow(coordinator.client)
    subscribed: set[str] = set()
    ended_cleanly = False
    try:
        while True:
            channel = wake_channel(coordinator, result.claim)
            if channel is not None and channel not in subscribed:
                _subscribe(pubsub, channel, deadline_for(result))
                subscribed.add(channel)
                # the release may have happened between the refusal and the subscription
            else:
                remaining = deadline_for(result) - time.monotonic()
                if remaining <= 0:
                    ended_cleanly = True
                    return result
                pause = remaining
                if result.retry_after is not None:
                    pause = min(remaining, max(result.retry_after, MIN_PAUSE))
                if getattr(result.claim, "limit_name", None) is not None:
                    # a named limit an operator may raise live: no release announces that
                    # (and a rate limit's exact retry_after assumed the old windows), so try
                    # again as often as this process's copy of it may change
                    pause = min(pause, live_limits.REFRESH_SECONDS)
                _sleep_until_woken(pubsub if subscribed else None, pause, queue_as)
            queued = waiter_id is None
            result = attempt(queue_as)
            if not isinstance(result, Refused) or result.detail.stale:
                ended_cleanly = True
                return result
    finally:
        # kept for this thread's next wait: closing it would disconnect a pooled connection
        # that the next command pays to reopen (coordination.subscriptions)
        subscriptions.give_back(
            pubsub,
            coordinator.client,
            subscribed,
            reusable=ended_cleanly,
            defer=settle_later and isinstance(result, Admitted),
        )
        if queued and not isinstance(result, Admitted):
            handed_on = leave(coordinator, wanted, queue_as)
            woken = getattr(result, "woken", None)
            if isinstance(woken, list):
                woken.extend(handed_on)


#: longest wait for a SUBSCRIBE's confirmation (``_subscribe``), seconds
CONFIRM_WAIT = 0.5


def _subscribe(pubsub: Any, channel: str, deadline: float) -> None:
    """SUBSCRIBE and wait for the confirmation, so a later PUBLISH cannot be missed — for at
    most ``CONFIRM_WAIT``. Waiting for it up to the caller's whole deadline would let a
    confirmation that never comes hold the caller past the key's own ``retry_after`` (a
    waiter that sat out its whole 8 s wait while the key had lapsed after 2 s was seen once
    in the full suite on a loaded machine; this is one way that can happen, not a proven
    cause). The caller asks again, and its sleeps stay bounded by that ``retry_after``
    whether or not a PUBLISH reaches it."""
    confirm_by = min(deadline, time.monotonic() + CONFIRM_WAIT)
    with unavailable_on_connection_error():
        pubsub.subscribe(channel)
        while True:
            left = confirm_by - time.monotonic()
            if left <= 0:
                return
            message = pubsub.get_message(timeout=left)
            if message is None or (
                message["type"] == "subscribe" and message["channel"] == channel
            ):
                return


def _sleep_until_woken(pubsub: Any | None, seconds: float, waiter_id: str | None) -> None:
    """Sleep up to ``seconds``; return early on a wake message that concerns ``waiter_id``.

    A release that frees a lock or a semaphore slot grants it to the head registered waiter
    for a moment (``lua/_lock.lua``, ``lua/_semaphore.lua``) and its message names that
    waiter (``to``). Only the named waiter can take the key then, so a message naming
    another one does not end the sleep — with several waiters on one key, every one of them
    would otherwise wake on every release and run an admission only the head could win,
    competing for the CPU with the winner at the very moment the key is idle. It shortens
    the sleep to when that grant would lapse unused (``grant_ms``), so a waiter asks again if
    the named one is gone. A message naming nobody (an ordered-lock cursor, a lock or slot
    nobody was registered for, a forced release) wakes every waiter. A message naming the
    waiter in its other form (``waiter_forms``) names it: the grant is its grant.
    """
    if pubsub is None:
        time.sleep(seconds)
        return
    end = time.monotonic() + seconds
    forms = waiter_forms(waiter_id)
    with unavailable_on_connection_error():
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            message = pubsub.get_message(timeout=left)
            if message is None or message["type"] != "message":
                continue
            granted_to, grant_ms = _grant(message.get("data"))
            if granted_to is None or granted_to in forms:
                return
            end = min(end, time.monotonic() + grant_ms / 1000 + MIN_PAUSE)


def waiter_forms(waiter_id: str | None) -> frozenset[str]:
    """The two forms of one waiter: ``<id>`` (a parked execution) and ``wait:<id>`` (one of
    its deliveries waiting in-process). The scripts treat them as one entry in a line
    (``other_form`` in ``lua/_common.lua``): a grant to either is the waiter's."""
    if not waiter_id:
        return frozenset()
    if waiter_id.startswith(WAITING_PREFIX):
        return frozenset({waiter_id, waiter_id[len(WAITING_PREFIX) :]})
    return frozenset({waiter_id, f"{WAITING_PREFIX}{waiter_id}"})


def _grant(data: Any) -> tuple[str | None, float]:
    """``(to, grant_ms)`` of a wake message, ``(None, 0)`` when it names no waiter."""
    try:
        message = json.loads(data)
    except (TypeError, ValueError):
        return None, 0.0
    if not isinstance(message, dict) or not message.get("to"):
        return None, 0.0
    return str(message["to"]), float(message.get("grant_ms") or 0.0)


# -- the waiter registry ---------------------------------------------------------------------


def register_waiter(
    coordinator: Coordinator, claim: Claim, waiter_id: str, ttl: float = 86400.0
) -> bool:
    """Park ``waiter_id`` on ``claim``'s key: the next release that frees it returns the id
    in ``Released.woken``. (``admit(..., waiter_id=...)`` registers atomically on refusal,
    which is what workers should use.) False for the rate limit, which never releases."""
    name = REGISTRY[claim.primitive].claim_waiters_key(claim, coordinator.prefix)
    if name is None:
        return False
    score: float | None = claim.position.nonce if isinstance(claim, OrderedLockClaim) else None
    with unavailable_on_connection_error(key=claim.key, primitive=claim.primitive):
        client = coordinator.client
        if score is None:
            seconds, micros = server_time(client, name)
            score = seconds * 1000 + micros / 1000  # ms to the µs, as lua/_common.lua
        pipe = client.pipeline(transaction=False)
        pipe.zadd(name, {waiter_id: score})
        pipe.pexpire(name, lock.seconds_to_ms(ttl))
        pipe.execute()
    return True


def move_waiter(coordinator: Coordinator, claim: Claim, from_id: str, to_id: str) -> None:
    """Give ``to_id`` the place ``from_id`` had in ``claim``'s waiter order (a worker
    delivery that waited in-process and now parks keeps its turn), dropping ``from_id``.
    ``to_id`` must already be registered (the parking admission registered it)."""
    name = REGISTRY[claim.primitive].claim_waiters_key(claim, coordinator.prefix)
    if name is None:
        return
    with unavailable_on_connection_error(key=claim.key, primitive=claim.primitive):
        score = coordinator.client.zscore(name, from_id)
        pipe = coordinator.client.pipeline(transaction=False)
        if score is not None and score >= 0:
            pipe.zadd(name, {to_id: score}, xx=True)
        pipe.zrem(name, from_id)
        pipe.execute()


def unregister_waiter(coordinator: Coordinator, claim: Claim, waiter_id: str) -> list[str]:
    """Take ``waiter_id`` out of ``claim``'s waiter order (a wait that ended unadmitted, a
    worker delivery that stopped waiting in-process and parked under its own id instead).
    A lock or semaphore slot the last release handed to ``waiter_id``, still unused, goes on
    to the next waiter (``lua/lock_leave.lua``, ``lua/semaphore_leave.lua``); returns that
    waiter's id in a list (else ``[]``): a parked one must be re-enqueued like any woken
    waiter."""
    name = REGISTRY[claim.primitive].claim_waiters_key(claim, coordinator.prefix)
    if name is None:
        return []
    with unavailable_on_connection_error(key=claim.key, primitive=claim.primitive):
        if isinstance(claim, LockClaim):
            keys = lock.release_keys(claim, coordinator.prefix)
            handed_on = scripts_for(coordinator.client).call("lock_leave", keys, [waiter_id])
            return [handed_on] if handed_on else []
        if isinstance(claim, SemaphoreClaim):
            keys = semaphore.release_keys(claim, coordinator.prefix)
            handed_on = scripts_for(coordinator.client).call(
                "semaphore_leave", [keys[0], keys[2]], [waiter_id]
            )
            return [handed_on] if handed_on else []
        coordinator.client.zrem(name, waiter_id)
    return []


def leave(coordinator: Coordinator, claims: Iterable[Claim], waiter_id: str) -> list[str]:
    """``unregister_waiter`` for every claim, best effort: a wait ending on an outage
    leaves what it can (its registrations expire with their zsets). Returns the waiters
    the keys were handed on to."""
    handed_on: list[str] = []
    for claim in claims:
        try:
            handed_on += unregister_waiter(coordinator, claim, waiter_id)
        except CoordinationUnavailable:
            logger.warning("could not leave the waiters of %s %s", claim.primitive, claim.key)
    return handed_on


def waiters(coordinator: Coordinator, claim: Claim) -> list[str]:
    """Parked waiter ids of ``claim``'s key, first to be woken first."""
    name = REGISTRY[claim.primitive].claim_waiters_key(claim, coordinator.prefix)
    if name is None:
        return []
    with unavailable_on_connection_error(key=claim.key, primitive=claim.primitive):
        # a lock's hand-off grant sorts first (negative score): not a waiter
        return list(coordinator.client.zrangebyscore(name, 0, "+inf"))
