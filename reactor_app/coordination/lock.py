"""Exclusive lock: one owner at a time per key, re-entrant, with fencing tokens (§2.6, §2.7).

Key layout (``K`` = the user key, always inside the hash tag):

* ``{prefix}:lock:{K}`` — hash ``owner, count, step, execution, reactor, acquired_at (ms),
  token``; its PX expiry is the lease. Deleted when the outermost hold is released.
* ``{prefix}:lock:{K}:fence`` — the last fencing token issued, never expired. A fresh
  acquisition issues ``max(last + 1, Redis TIME in µs)``, so tokens strictly increase per key
  across releases — and across a restart or failover that lost this key, as long as the Redis
  clock has not gone back by more than the outage (docs/coordination.md, "Guarantees").
* ``{prefix}:waiters:{K}:lock`` — zset of parked waiter ids (score: registration ms).

The owner is the root execution id, so every part of one execution tree re-enters its own
lock; the nesting ``count`` frees the key only when the outermost hold is released. A
re-entry keeps the token and never shortens the lease.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from reactor_app.coordination.claims import Hold, LockClaim
from reactor_app.coordination.keys import key
from reactor_app.coordination.redis import get_client, unavailable_on_connection_error
from reactor_app.coordination.reports import to_datetime

# -- the interface's flags (see coordination.primitives.Primitive) ---------------------------
PRIMITIVE = "lock"
#: an owned hold until released
HOLDS = True
#: a refusal's retry_after is only the holder's lease left, an upper bound
HINTED = False
UNCAPPED_WAITS = False
CHARGES = False
HOLD_NOUN = "lock"
NONE_HELD = "its lock is free"


def seconds_to_ms(seconds: float) -> int:
    """A duration in whole milliseconds, at least 1 (Redis refuses a zero PX)."""
    return max(1, round(float(seconds) * 1000))


def hold_key(user_key: str, prefix: str | None = None) -> str:
    return key(PRIMITIVE, user_key, prefix=prefix)


def fence_key(user_key: str, prefix: str | None = None) -> str:
    return key(PRIMITIVE, user_key, "fence", prefix=prefix)


def waiters_key(user_key: str, prefix: str | None = None) -> str:
    return key("waiters", user_key, PRIMITIVE, prefix=prefix)


# -- script argument encoding (see lua/admit.lua, release.lua, extend.lua) -------------------


def admit_keys(claim: LockClaim, prefix: str) -> list[str]:
    return [
        hold_key(claim.key, prefix),
        fence_key(claim.key, prefix),
        waiters_key(claim.key, prefix),
    ]


def admit_spec(claim: LockClaim) -> dict[str, Any]:
    return {"ttl_ms": seconds_to_ms(claim.ttl)}


def release_keys(claim: LockClaim, prefix: str) -> list[str]:
    return [hold_key(claim.key, prefix), waiters_key(claim.key, prefix)]


def release_spec(hold: Hold) -> dict[str, Any]:
    # the admission's token: a hold its owner took again since (under a newer token) is not
    # this release's to free (lua/_lock.lua, lock_release)
    return {"token": str(hold.token)} if hold.token is not None else {}


def extend_keys(claim: LockClaim, prefix: str) -> list[str]:
    return [hold_key(claim.key, prefix)]


def extend_spec(hold: Hold, owner: str) -> dict[str, Any]:
    assert isinstance(hold.claim, LockClaim)
    return {"owner": owner, "token": hold.token, "ttl_ms": seconds_to_ms(hold.claim.ttl)}


def wake_channel(claim: LockClaim, prefix: str) -> str:
    """Release PUBLISHes on the hold key's name when the lock is freed."""
    return hold_key(claim.key, prefix)


def claim_waiters_key(claim: LockClaim, prefix: str) -> str:
    return waiters_key(claim.key, prefix)


# -- state --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LockState:
    """A snapshot of one lock. Times are epoch seconds; ``ttl`` is seconds left."""

    key: str
    held: bool
    owner: str | None = None
    step: str | None = None
    execution: str | None = None
    reactor: str | None = None
    count: int = 0
    ttl: float | None = None
    token: int | None = None
    acquired_at: float | None = None
    last_token: int | None = None  # the fence: the latest token issued (since any lost keys)


def _text(value: str | None) -> str | None:
    return value or None


def lock_state(user_key: str, *, client: Any = None, prefix: str | None = None) -> LockState:
    """Read one lock (one round trip)."""
    client = client or get_client()
    with unavailable_on_connection_error(key=user_key, primitive=PRIMITIVE):
        pipe = client.pipeline(transaction=False)
        pipe.hgetall(hold_key(user_key, prefix))
        pipe.pttl(hold_key(user_key, prefix))
        pipe.get(fence_key(user_key, prefix))
        fields, ttl_ms, fence = pipe.execute()
    last_token = int(fence) if fence else None
    if not fields:
        return LockState(key=user_key, held=False, last_token=last_token)
    return LockState(
        key=user_key,
        held=True,
        owner=fields.get("owner"),
        step=_text(fields.get("step")),
        execution=_text(fields.get("execution")),
        reactor=_text(fields.get("reactor")),
        count=int(fields.get("count") or 0),
        ttl=ttl_ms / 1000 if ttl_ms and ttl_ms > 0 else None,
        token=int(fields["token"]) if fields.get("token") else None,
        acquired_at=int(fields["acquired_at"]) / 1000 if fields.get("acquired_at") else None,
        last_token=last_token,
    )


# -- the holding primitive's side (see coordination.primitives.Holding) ----------------------


def holders(
    user_key: str, *, client: Any = None, prefix: str | None = None
) -> dict[str, dict[str, Any]]:
    """The owner of the lock and its attribution; empty when it is free."""
    lock = lock_state(user_key, client=client, prefix=prefix)
    if not lock.held:
        return {}
    return {
        lock.owner or "": {
            "step": lock.step,
            "execution": lock.execution,
            "reactor": lock.reactor,
            "token": lock.token,
            "count": lock.count,
        }
    }


def hold_claim(user_key: str, limit: int | None = None) -> LockClaim:
    return LockClaim(user_key)


def force_release_keys(user_key: str, prefix: str) -> list[str]:
    return [hold_key(user_key, prefix), waiters_key(user_key, prefix)]


def live_key(user_key: str, prefix: str) -> str:
    """The hold hash: the hold is live while it names the owner."""
    return hold_key(user_key, prefix)


def index_read(pipe: Any, user_key: str, owner: str, prefix: str) -> None:
    pipe.hgetall(hold_key(user_key, prefix))
    pipe.pttl(hold_key(user_key, prefix))


def index_row(
    user_key: str, owner: str, first: Any, second: Any, now_ms: int
) -> dict[str, Any] | None:
    fields, ttl_ms = first, second
    if not fields or fields.get("owner") != owner:
        return None
    return {
        "primitive": PRIMITIVE,
        "key": user_key,
        "owner": owner,
        "step": fields.get("step") or None,
        "execution": fields.get("execution") or None,
        "reactor": fields.get("reactor") or None,
        "acquired_at": int(fields["acquired_at"]) / 1000 if fields.get("acquired_at") else None,
        "ttl_left": ttl_ms / 1000 if ttl_ms and ttl_ms > 0 else None,
        "count": int(fields.get("count") or 0),
        "token": int(fields["token"]) if fields.get("token") else None,
    }


# -- the operator's view (see coordination.primitives.Primitive.inspect) ---------------------


def inspect(
    user_key: str, *, limit: int | None = None, client: Any = None, prefix: str | None = None
) -> dict[str, Any]:
    lock = lock_state(user_key, client=client, prefix=prefix)
    return {
        "lock": {
            **asdict(lock),
            "acquired_at": to_datetime(lock.acquired_at),
            "level": ("step" if lock.step else "reactor") if lock.held else None,
        }
    }


def summary(report: dict[str, Any]) -> str:
    lock = report["lock"]
    if not lock["held"]:
        return "free"
    where = f"step {lock['step']}" if lock["step"] else "reactor level"
    return f"held by {lock['execution'] or lock['owner']} ({where}), x{lock['count']}"


def attributed(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [report["lock"]] if report["lock"]["held"] else []
