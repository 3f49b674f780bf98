"""Ordered lock: executions pass one at a time, in the order their positions were assigned.

A position (``nonce``, dense per epoch: 1, 2, 3 ...) is assigned when the run starts (reactor
level) or when the execution first reaches the step (step level — so the step form orders by
*arrival at the step*), and is reused across retries and parks. A direct ``Step.call``
passes ``claims.UNASSIGNED`` instead: ``admit.lua`` assigns the place in the admission's own
round trip and answers it. Admission passes only the head (``cursor + 1``). Key layout
(``K`` = the user key, inside the hash tag):

* ``{prefix}:ordered_lock:{K}`` — hash ``epoch`` (ms; a new one after a reset or expiry),
  ``next`` (last nonce assigned), ``cursor`` (last completed nonce), ``first_failed`` (strict
  mode), ``in_flight`` (the admitted head).
* ``{prefix}:ordered_lock:{K}:positions`` — zset ``nonce -> last heartbeat (ms)``.
* ``{prefix}:ordered_lock:{K}:holders`` — hash ``nonce -> holder json`` (attribution).
* ``{prefix}:waiters:{K}:ordered_lock`` — zset ``waiter id -> nonce`` of parked waiters.

All expire after ``ttl`` seconds without activity. Rules, all enforced in Lua:

* a head whose heartbeat is older than ``poison_pill_timeout`` is passed over (the cursor
  moves past it) by the position behind it; every admission attempt is a heartbeat, and the
  running head heartbeats from the renewal thread;
* the cursor advances only on a terminal outcome: release with ``success``/``failure``, or an
  admission that ends in ``ChainFailed`` or ``PeriodHit`` (the work is skipped, so the position
  is complete); ``retry``/``park`` keep the position;
* strict mode: after a failure, every later position gets ``ChainFailed`` until ``reset``;
* a position from an earlier epoch, or one already passed, is refused with
  ``detail["stale"] = True``: the caller must assign a new position.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from reactor_app.coordination.claims import Hold, Holder, OrderedLockClaim, OrderedPosition
from reactor_app.coordination.keys import current_prefix, key
from reactor_app.coordination.lock import seconds_to_ms
from reactor_app.coordination.redis import (
    get_client,
    pipeline_with_time,
    unavailable_on_connection_error,
)
from reactor_app.coordination.scripts import Status, holder_json, scripts_for

# -- the interface's flags (see coordination.primitives.Primitive) ---------------------------
PRIMITIVE = "ordered_lock"
#: a gate, not an owned hold (a position is kept by outcome, not by a lease)
HOLDS = False
#: a refusal's retry_after is when to come back: when the head would count as dead, at least
#: every third of the poison-pill timeout (this position's heartbeat stays fresh)
HINTED = True
#: a line moves on its own: waits in it are capped only by REACTOR_ORDERED_WAIT_CEILING
UNCAPPED_WAITS = True
CHARGES = False
#: seconds the line's state survives without activity (at least this less 1/64: the line's
#: lifetimes are set only when they move by more, lua/_ordered.lua)
DEFAULT_TTL = 86400.0


def state_key(user_key: str, prefix: str | None = None) -> str:
    return key(PRIMITIVE, user_key, prefix=prefix)


def positions_key(user_key: str, prefix: str | None = None) -> str:
    return key(PRIMITIVE, user_key, "positions", prefix=prefix)


def holders_key(user_key: str, prefix: str | None = None) -> str:
    return key(PRIMITIVE, user_key, "holders", prefix=prefix)


def waiters_key(user_key: str, prefix: str | None = None) -> str:
    return key("waiters", user_key, PRIMITIVE, prefix=prefix)


def line_keys(user_key: str, prefix: str | None = None) -> list[str]:
    """The group every ordered-lock script takes: state, positions, holders, waiters."""
    return [
        state_key(user_key, prefix),
        positions_key(user_key, prefix),
        holders_key(user_key, prefix),
        waiters_key(user_key, prefix),
    ]


# -- script argument encoding ----------------------------------------------------------------


def admit_keys(claim: OrderedLockClaim, prefix: str) -> list[str]:
    return line_keys(claim.key, prefix)


def admit_spec(claim: OrderedLockClaim) -> dict[str, Any]:
    return {
        "nonce": claim.position.nonce,
        "epoch": claim.position.epoch,
        "ppt_ms": seconds_to_ms(claim.poison_pill_timeout),
        "strict": bool(claim.strict),
        "ttl_ms": seconds_to_ms(claim.ttl),
    }


release_keys = admit_keys


def release_spec(hold: Hold) -> dict[str, Any]:
    claim = hold.claim
    assert isinstance(claim, OrderedLockClaim)
    return {
        "nonce": claim.position.nonce,
        "epoch": claim.position.epoch,
        "strict": bool(claim.strict),
        "ttl_ms": seconds_to_ms(claim.ttl),
    }


def wake_channel(claim: OrderedLockClaim, prefix: str) -> str:
    """The cursor advancing (or a reset) is PUBLISHed on the state key's name."""
    return state_key(claim.key, prefix)


def claim_waiters_key(claim: OrderedLockClaim, prefix: str) -> str:
    return waiters_key(claim.key, prefix)


# -- operations -------------------------------------------------------------------------------


def assign_position(
    user_key: str,
    holder: Holder,
    ttl: float = DEFAULT_TTL,
    *,
    client: Any = None,
    prefix: str | None = None,
) -> OrderedPosition:
    """Take the next place in the line of ``user_key``."""
    client = client or get_client()
    reply = scripts_for(client).run(
        "ordered_position",
        line_keys(user_key, current_prefix(prefix)),
        [holder_json(holder), seconds_to_ms(ttl)],
        key=user_key,
        primitive=PRIMITIVE,
    )
    return OrderedPosition(nonce=int(reply.data["nonce"]), epoch=int(reply.data["epoch"]))


def heartbeat(claim: OrderedLockClaim, *, client: Any = None, prefix: str | None = None) -> bool:
    """Say the position is alive; False when it was reset, completed, skipped or passed over."""
    return _beat(claim.key, claim.position, seconds_to_ms(claim.ttl), client, prefix)


def vouch(
    user_key: str, position: OrderedPosition, *, client: Any = None, prefix: str | None = None
) -> bool:
    """``heartbeat`` on a waiting execution's behalf, the line's lifetime left as it is (the
    sweep, for an execution queued or parked in the database: ``engine.waiting_positions``,
    which does not know the declaration's ttl)."""
    return _beat(user_key, position, 0, client, prefix)


def _beat(
    user_key: str, position: OrderedPosition, ttl_ms: int, client: Any, prefix: str | None
) -> bool:
    """One ``heartbeat.lua`` call (``ttl_ms`` 0: keep the line's lifetime)."""
    client = client or get_client()
    reply = scripts_for(client).run(
        "heartbeat",
        line_keys(user_key, current_prefix(prefix)),
        [position.nonce, position.epoch, ttl_ms],
        key=user_key,
        primitive=PRIMITIVE,
    )
    return reply.status is Status.OK


@dataclass(frozen=True)
class Position:
    """One waiting (or running) position; ``heartbeat_age`` in seconds."""

    nonce: int
    heartbeat_age: float
    owner: str | None = None
    execution: str | None = None
    step: str | None = None
    reactor: str | None = None


@dataclass(frozen=True)
class OrderedLockState:
    """A snapshot of one line. ``next`` is the nonce the next arrival will get;
    ``last_completed`` the cursor; ``head`` the position allowed to run now."""

    key: str
    epoch: int | None
    next: int
    last_completed: int
    head: int | None
    in_flight: int | None
    first_failed: int | None
    positions: list[Position] = field(default_factory=list)


def _int(value: str | None) -> int | None:
    return int(value) if value not in (None, "") else None


def ordered_state(
    user_key: str, *, client: Any = None, prefix: str | None = None
) -> OrderedLockState:
    client = client or get_client()
    with unavailable_on_connection_error(key=user_key, primitive=PRIMITIVE):
        state_name = state_key(user_key, prefix)

        def fill(pipe: Any) -> None:
            pipe.hgetall(state_name)
            pipe.zrange(positions_key(user_key, prefix), 0, -1, withscores=True)
            pipe.hgetall(holders_key(user_key, prefix))

        (seconds, micros), (state, beats, holders) = pipeline_with_time(client, state_name, fill)
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    last_assigned = _int(state.get("next")) or 0
    cursor = _int(state.get("cursor")) or 0
    positions = []
    for nonce_text, beat_ms in sorted(beats, key=lambda item: int(item[0])):
        info = json.loads(holders.get(nonce_text) or "{}")
        positions.append(
            Position(
                nonce=int(nonce_text),
                heartbeat_age=(now_ms - beat_ms) / 1000,
                owner=info.get("owner"),
                execution=info.get("execution"),
                step=info.get("step"),
                reactor=info.get("reactor"),
            )
        )
    return OrderedLockState(
        key=user_key,
        epoch=_int(state.get("epoch")),
        next=last_assigned + 1,
        last_completed=cursor,
        head=cursor + 1 if last_assigned > cursor else None,
        in_flight=_int(state.get("in_flight")),
        first_failed=_int(state.get("first_failed")),
        positions=positions,
    )


def peek(user_key: str, *, client: Any = None, prefix: str | None = None) -> Position | None:
    """The head of the line (the position allowed to run now), or None when nobody waits."""
    state = ordered_state(user_key, client=client, prefix=prefix)
    if state.head is None:
        return None
    for position in state.positions:
        if position.nonce == state.head:
            return position
    # the head has no registration left: it is passed over at the next admission
    return Position(nonce=state.head, heartbeat_age=float("inf"))


def skip(
    user_key: str, ttl: float = DEFAULT_TTL, *, client: Any = None, prefix: str | None = None
) -> int | None:
    """Operator action: complete the head without running it; returns the skipped nonce."""
    client = client or get_client()
    reply = scripts_for(client).run(
        "ordered_skip",
        line_keys(user_key, current_prefix(prefix)),
        [seconds_to_ms(ttl)],
        key=user_key,
        primitive=PRIMITIVE,
    )
    return int(reply.data["skipped"]) if reply.status is Status.OK else None


def reset(
    user_key: str, ttl: float = DEFAULT_TTL, *, client: Any = None, prefix: str | None = None
) -> int:
    """Operator action: start a new epoch (empty line, failure cleared); returns the epoch.
    Holders of older positions are refused as stale and must re-assign."""
    client = client or get_client()
    reply = scripts_for(client).run(
        "ordered_reset",
        line_keys(user_key, current_prefix(prefix)),
        [seconds_to_ms(ttl)],
        key=user_key,
        primitive=PRIMITIVE,
    )
    return int(reply.data["epoch"])


# -- the operator's view (see coordination.primitives.Primitive.inspect) ---------------------


def inspect(
    user_key: str, *, limit: int | None = None, client: Any = None, prefix: str | None = None
) -> dict[str, Any]:
    return {"ordered": asdict(ordered_state(user_key, client=client, prefix=prefix))}


def summary(report: dict[str, Any]) -> str:
    ordered = report["ordered"]
    return (
        f"head {ordered['head'] or '-'}, next {ordered['next']}, "
        f"last completed {ordered['last_completed']}, first failed "
        f"{ordered['first_failed'] or '-'}, {len(ordered['positions'])} waiting"
    )


def attributed(report: dict[str, Any]) -> list[dict[str, Any]]:
    return list(report["ordered"]["positions"])
