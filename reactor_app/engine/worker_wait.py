"""A worker delivery's in-process wait before it parks: woken only when the key is its turn.

``Gate._admit_or_park`` calls ``wait_for_turn`` after a first admission was refused: the
delivery is registered in the key's waiter order as ``wait:<execution id>`` and waits here, for
up to ``REACTOR_WORKER_WAIT``, for the release that lets it in.

What differs from ``Coordinator.admit_waiting`` (the synchronous caller's wait, which re-asks
on every wake message) is who wakes. A release that frees a lock grants it to the head waiter
for a moment (``release.lua``) and its wake message names that waiter (``to``). With several
deliveries of one key waiting — the contended case this exists for — every one of them used to
wake on every release and run an admission that only the head could win; on a small machine
those losing admissions compete for the CPU with the winner at the very moment the key is idle.
Here a waiter that is not named keeps sleeping: until it is named, until a message names
nobody (a semaphore slot, an ordered-lock cursor, a forced release), or until the grant it saw
would have lapsed unused (``grant_ms``), when it asks again in case the named waiter is gone.

1. Subscribe to the refusing claim's wake channel (confirmed), then ask once more: the
   release may have come between the refusal and the subscription.
2. Sleep until a message that concerns this waiter, the refusal's ``retry_after``, or the
   budget's end; then ask again. Loop until admitted, the budget is spent (the last refusal is
   returned and the caller parks), or a stale ordered position is reported.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from reactor_app.coordination.admission import MIN_PAUSE, Coordinator
from reactor_app.coordination.claims import AdmissionResult, Claim, Holder, Refused
from reactor_app.coordination.redis import unavailable_on_connection_error


def wait_for_turn(
    coordinator: Coordinator,
    claims: Sequence[Claim],
    holder: Holder,
    refused: Refused,
    *,
    budget: float,
    waiter_id: str,
) -> AdmissionResult:
    """Admit ``claims`` for ``waiter_id`` within ``budget`` seconds of now, after ``refused``."""
    claims = list(claims)
    deadline = time.monotonic() + max(budget, 0.0)
    result: AdmissionResult = refused
    with unavailable_on_connection_error(key=refused.claim.key, primitive=refused.claim.primitive):
        pubsub = coordinator.client.pubsub()
    subscribed: set[str] = set()
    try:
        while True:
            assert isinstance(result, Refused)
            channel = coordinator.wake_channel(result.claim)
            if channel is not None and channel not in subscribed:
                Coordinator._subscribe(pubsub, channel, deadline)
                subscribed.add(channel)
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return result
                pause = remaining
                if result.retry_after is not None:
                    pause = min(remaining, max(result.retry_after, MIN_PAUSE))
                _sleep_until_concerned(pubsub if subscribed else None, pause, waiter_id)
            result = coordinator.admit(claims, holder, waiter_id=waiter_id)
            if not isinstance(result, Refused) or result.detail.stale:
                return result
    finally:
        with unavailable_on_connection_error():
            pubsub.close()


def _sleep_until_concerned(pubsub: Any | None, seconds: float, waiter_id: str) -> None:
    """Sleep up to ``seconds``; return early on a wake message that concerns ``waiter_id``.

    A message granting the key to another waiter (``{"to": ..., "grant_ms": ...}``) does not
    end the sleep, but shortens it to when that grant would lapse unused."""
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


def _grant(data: Any) -> tuple[str | None, float]:
    """``(to, grant_ms)`` of a wake message, ``(None, 0)`` when it names no waiter."""
    try:
        message = json.loads(data)
    except (TypeError, ValueError):
        return None, 0.0
    if not isinstance(message, dict) or not message.get("to"):
        return None, 0.0
    return str(message["to"]), float(message.get("grant_ms") or 0.0)
