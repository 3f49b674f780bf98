"""Counting semaphore: at most ``limit`` owners per key, each on an expiring lease (§2.6).

Key layout (``K`` = the user key, inside the hash tag):

* ``{prefix}:semaphore:{K}`` — zset ``owner -> lease expiry (epoch ms)``. Every admission first
  purges expired leases, so a crashed holder's slot returns when its lease lapses.
* ``{prefix}:semaphore:{K}:holders`` — hash ``owner -> json {count, step, execution, reactor,
  acquired_at ms}`` (attribution and the re-entrant nesting count).
* ``{prefix}:waiters:{K}:semaphore`` — zset of waiter ids (score: registration ms less the
  priority's head start, or a fair line's turn), and the hand-off grants of freed slots
  (``lua/_semaphore.lua``).
* ``{prefix}:waiters:{K}:semaphore:fair`` — hash ``fair_by group -> next turn`` of a fair line
  (only sent with a claim that has ``fair``).

``limit`` travels with every admission, so a changed limit applies to the very next one (a
named limit is read again for each: ``coordination.live_limits``); the
admission also writes it into the holders hash (field ``LIMIT_FIELD``, which no owner id can
be) so that operators see free slots without being told the limit. An owner holds one slot
however deeply it nests.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from reactor_app.coordination import live_limits
from reactor_app.coordination.claims import Hold, SemaphoreClaim
from reactor_app.coordination.keys import key
from reactor_app.coordination.lock import seconds_to_ms
from reactor_app.coordination.redis import (
    get_client,
    pipeline_with_time,
    unavailable_on_connection_error,
)
from reactor_app.coordination.reports import to_datetime
from reactor_app.exceptions import ConfigurationError, CoordinationUnavailable

# -- the interface's flags (see coordination.primitives.Primitive) ---------------------------
PRIMITIVE = "semaphore"
#: an owned hold until released
HOLDS = True
#: a refusal's retry_after is only a holder's lease left, an upper bound
HINTED = False
UNCAPPED_WAITS = False
CHARGES = False
HOLD_NOUN = "semaphore lease"
NONE_HELD = "no semaphore lease is live on it"
#: the holders-hash field holding the limit of the latest admission (starts with NUL: never
#: an owner id)
LIMIT_FIELD = "\0limit"


def leases_key(user_key: str, prefix: str | None = None) -> str:
    return key(PRIMITIVE, user_key, prefix=prefix)


def holders_key(user_key: str, prefix: str | None = None) -> str:
    return key(PRIMITIVE, user_key, "holders", prefix=prefix)


def waiters_key(user_key: str, prefix: str | None = None) -> str:
    return key("waiters", user_key, PRIMITIVE, prefix=prefix)


# -- script argument encoding ----------------------------------------------------------------


def fair_key(user_key: str, prefix: str | None = None) -> str:
    return key("waiters", user_key, PRIMITIVE, "fair", prefix=prefix)


def release_keys(claim: SemaphoreClaim, prefix: str) -> list[str]:
    return [
        leases_key(claim.key, prefix),
        holders_key(claim.key, prefix),
        waiters_key(claim.key, prefix),
    ]


def live_claim(claim: SemaphoreClaim) -> SemaphoreClaim:
    """The claim with its named limit as it is now (the process's copy of the overrides,
    ``coordination.live_limits``): read at every admission, so an operator's override applies
    to units already waiting, not only to new claims."""
    if claim.limit_name is None:
        return claim
    limit = live_limits.semaphore_limit(claim.limit_name)
    return claim if limit == claim.limit else replace(claim, limit=limit)


def admit_keys(claim: SemaphoreClaim, prefix: str) -> list[str]:
    """The release's keys, and a fair claim's fair hash (the turns of its line's groups)."""
    keys = release_keys(claim, prefix)
    if claim.fair is not None:
        keys.append(fair_key(claim.key, prefix))
    return keys


def admit_spec(claim: SemaphoreClaim) -> dict[str, Any]:
    if claim.limit < 1:
        raise ValueError(f"semaphore limit must be at least 1, got {claim.limit!r}")
    spec: dict[str, Any] = {"limit": int(claim.limit), "ttl_ms": seconds_to_ms(claim.ttl)}
    if claim.fair is not None:
        spec["fair"] = claim.fair
    return spec


def release_spec(hold: Hold) -> dict[str, Any]:
    # only the acquisition admitted (a slot the owner took again since is not this one's)
    spec: dict[str, Any] = {"lease": hold.lease} if hold.lease else {}
    limit = release_limit(hold.claim)
    if limit is not None:
        spec["limit"] = limit
    return spec


def release_limit(claim: Any) -> int | None:
    """A named limit as it is now, for the release (None: not a named limit, or not readable
    now). An operator may lower it below the slots held: a slot freed then is nobody's to take
    yet, and the release must not hand it to the head waiter (``lua/primitives/semaphore.lua``)
    — the waiter would be woken only to be refused and queue again at the back of the line.
    Never a reason not to release: an unreadable limit releases as a number limit does."""
    if not isinstance(claim, SemaphoreClaim) or claim.limit_name is None:
        return None
    try:
        return live_claim(claim).limit
    except (CoordinationUnavailable, ConfigurationError):
        return None


def extend_keys(claim: SemaphoreClaim, prefix: str) -> list[str]:
    return [leases_key(claim.key, prefix), holders_key(claim.key, prefix)]


def extend_spec(hold: Hold, owner: str) -> dict[str, Any]:
    assert isinstance(hold.claim, SemaphoreClaim)
    spec: dict[str, Any] = {"owner": owner, "ttl_ms": seconds_to_ms(hold.claim.ttl)}
    if hold.lease:
        spec["lease"] = hold.lease
    return spec


def wake_channel(claim: SemaphoreClaim, prefix: str) -> str:
    """Release PUBLISHes on the leases key's name when a slot is freed."""
    return leases_key(claim.key, prefix)


def claim_waiters_key(claim: SemaphoreClaim, prefix: str) -> str:
    return waiters_key(claim.key, prefix)


# -- state --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SemaphoreHolder:
    owner: str
    count: int
    step: str | None
    execution: str | None
    reactor: str | None
    acquired_at: float | None  # epoch seconds
    ttl: float  # seconds left on the lease


@dataclass(frozen=True)
class SemaphoreState:
    """A snapshot of one semaphore; ``available`` is None when no limit was given."""

    key: str
    limit: int | None
    held: int
    available: int | None
    holders: list[SemaphoreHolder] = field(default_factory=list)


def semaphore_state(
    user_key: str, limit: int | None = None, *, client: Any = None, prefix: str | None = None
) -> SemaphoreState:
    """Read one semaphore; leases already expired (but not yet purged) are not counted.
    ``limit`` defaults to the one the latest admission stored."""
    client = client or get_client()
    with unavailable_on_connection_error(key=user_key, primitive=PRIMITIVE):
        leases_name = leases_key(user_key, prefix)

        def fill(pipe: Any) -> None:
            pipe.zrange(leases_name, 0, -1, withscores=True)
            pipe.hgetall(holders_key(user_key, prefix))

        (seconds, micros), (leases, infos) = pipeline_with_time(client, leases_name, fill)
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    holders = []
    for owner, expiry_ms in leases:
        if expiry_ms <= now_ms:
            continue
        info = json.loads(infos.get(owner) or "{}")
        holders.append(
            SemaphoreHolder(
                owner=owner,
                count=int(info.get("count", 1)),
                step=info.get("step") or None,
                execution=info.get("execution") or None,
                reactor=info.get("reactor") or None,
                acquired_at=info["acquired_at"] / 1000 if info.get("acquired_at") else None,
                ttl=(expiry_ms - now_ms) / 1000,
            )
        )
    held = len(holders)
    if limit is None and infos.get(LIMIT_FIELD):
        limit = int(infos[LIMIT_FIELD])  # as the latest admission declared it
    available = max(limit - held, 0) if limit is not None else None
    return SemaphoreState(
        key=user_key, limit=limit, held=held, available=available, holders=holders
    )


# -- the holding primitive's side (see coordination.primitives.Holding) ----------------------


def holders(
    user_key: str, *, client: Any = None, prefix: str | None = None
) -> dict[str, dict[str, Any]]:
    """Every owner of a live lease and its attribution (no fencing token: locks only)."""
    state = semaphore_state(user_key, client=client, prefix=prefix)
    return {
        h.owner: {
            "step": h.step,
            "execution": h.execution,
            "reactor": h.reactor,
            "token": None,
            "count": h.count,
        }
        for h in state.holders
    }


def hold_claim(user_key: str, limit: int | None = None) -> SemaphoreClaim:
    return SemaphoreClaim(user_key, limit=int(limit or 1))


def force_release_keys(user_key: str, prefix: str) -> list[str]:
    return [
        leases_key(user_key, prefix),
        holders_key(user_key, prefix),
        waiters_key(user_key, prefix),
    ]


def live_key(user_key: str, prefix: str) -> str:
    """The leases zset: the hold is live while the owner's lease is unexpired."""
    return leases_key(user_key, prefix)


def index_read(pipe: Any, user_key: str, owner: str, prefix: str) -> None:
    pipe.zscore(leases_key(user_key, prefix), owner)
    pipe.hmget(holders_key(user_key, prefix), owner, LIMIT_FIELD)


def index_row(
    user_key: str, owner: str, first: Any, second: Any, now_ms: int
) -> dict[str, Any] | None:
    expiry_ms, (raw_info, raw_limit) = first, second
    if expiry_ms is None or expiry_ms <= now_ms:
        return None
    info = json.loads(raw_info or "{}")
    return {
        "primitive": PRIMITIVE,
        "key": user_key,
        "owner": owner,
        "step": info.get("step") or None,
        "execution": info.get("execution") or None,
        "reactor": info.get("reactor") or None,
        "acquired_at": info["acquired_at"] / 1000 if info.get("acquired_at") else None,
        "ttl_left": (expiry_ms - now_ms) / 1000,
        "count": int(info.get("count", 1)),
        "token": None,
        "limit": int(raw_limit) if raw_limit else None,
    }


# -- the operator's view (see coordination.primitives.Primitive.inspect) ---------------------


def inspect(
    user_key: str, *, limit: int | None = None, client: Any = None, prefix: str | None = None
) -> dict[str, Any]:
    state = semaphore_state(user_key, limit, client=client, prefix=prefix)
    return {
        "semaphore": {
            "limit": state.limit,
            "held": state.held,
            "available": state.available,
            "holders": [
                {**asdict(h), "acquired_at": to_datetime(h.acquired_at)} for h in state.holders
            ],
        }
    }


def summary(report: dict[str, Any]) -> str:
    return f"{report['semaphore']['held']} slot(s) held"


def attributed(report: dict[str, Any]) -> list[dict[str, Any]]:
    return list(report["semaphore"]["holders"])
