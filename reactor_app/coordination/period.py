"""Dedup period: exactly one success per bucket per key, never two bodies at once (§2.6).

Buckets are computed inside Lua from Redis ``TIME``: calendar-aligned UTC buckets for
``"second" "minute" "hour" "day" "week"`` (ISO, starting Monday) ``"month" "year"``, and
epoch-aligned buckets for a whole number of seconds.

Key layout (``K`` = the user key, inside the hash tag; ``E`` = ``every`` as text):

* ``{prefix}:period:{K}:E`` — the *done* mark: hash ``bucket (start, epoch s), by (execution
  id or owner), at (ms)``, expiring at the bucket's end.
* ``{prefix}:period:{K}:E:reserved`` — the *in-flight* reservations: hash ``bucket start ->
  json {owner, count, unit, step, execution, reactor, acquired_at ms, expires ms}``. One entry
  per bucket (two only around a bucket edge); each carries its own lease, like a semaphore's.
* ``{prefix}:waiters:{K}:period:E`` — zset of parked waiter ids (score: registration ms).

Admission (atomic with the other claims) answers ``PeriodHit`` when the bucket is done, a
``Refused`` with status ``PERIOD_IN_FLIGHT`` (``retry_after`` = the reservation's lease left)
when another owner's reservation is live, and otherwise reserves the bucket for the holder.
Release marks it done on ``"success"`` and frees it on any other outcome; a holder that dies
frees it when its lease (``ttl``) lapses. The renewal thread keeps a live holder's reservation
(``Coordinator.extend`` / ``lua/extend.lua``). A success whose bucket is already over by then
needs no mark, and a newer bucket's mark is never replaced. See docs/coordination.md.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from reactor_app import bounds
from reactor_app.coordination.claims import Hold, PeriodClaim
from reactor_app.coordination.keys import key
from reactor_app.coordination.lock import seconds_to_ms
from reactor_app.coordination.redis import get_client, unavailable_on_connection_error
from reactor_app.coordination.reports import to_datetime
from reactor_app.coordination.scripts import Status, scripts_for

# -- the interface's flags (see coordination.primitives.Primitive) ---------------------------
PRIMITIVE = "period"
#: a gate, not an owned hold (its reservation is renewed, but kept by no park)
HOLDS = False
#: a refusal's retry_after is only the reservation's lease left, an upper bound
HINTED = False
UNCAPPED_WAITS = False
CHARGES = False

#: calendar-aligned units (UTC); "week" is the ISO week, starting on Monday
UNITS = ("second", "minute", "hour", "day", "week", "month", "year")


def validate_every(value: Any) -> str | int:
    """Normalise ``every``: a unit name of ``UNITS`` or a positive whole number of seconds
    (an int, an integral float or a ``timedelta``). Raises ``ValueError`` explaining the forms."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, str):
        name = value.strip().lower()
        if name in UNITS:
            return name
        raise ValueError(
            f"with_period(every={value!r}) is not a known unit: use one of "
            f"{', '.join(UNITS)} (calendar-aligned, UTC) or a whole number of seconds"
        )
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            f"with_period(every=...) must be a unit name ({', '.join(UNITS)}) or a whole "
            f"number of seconds, got {value!r}"
        )
    if not 0 < value <= bounds.LONGEST_SECONDS or not float(value).is_integer():
        # the upper bound: a bucket of 10**16 s or more was marked done where no admission
        # found it again, so the work ran once per call (reactor_app.bounds)
        raise ValueError(
            f"with_period(every={value!r}) must be a whole number of seconds from 1 to "
            f"{bounds.LONGEST_TEXT} (buckets are aligned on the Unix epoch)"
        )
    return int(value)


def every_text(every: str | int) -> str:
    return str(validate_every(every))


def mark_key(user_key: str, every: str | int, prefix: str | None = None) -> str:
    return key(PRIMITIVE, user_key, every_text(every), prefix=prefix)


def reservations_key(user_key: str, every: str | int, prefix: str | None = None) -> str:
    return key(PRIMITIVE, user_key, every_text(every), "reserved", prefix=prefix)


def waiters_key(user_key: str, every: str | int, prefix: str | None = None) -> str:
    return key("waiters", user_key, PRIMITIVE, every_text(every), prefix=prefix)


def bucket_bounds(every: str | int, at: float) -> tuple[int, int]:
    """Start and end (epoch seconds) of the bucket holding ``at`` — the Python twin of
    ``lua/_calendar.lua`` (the Lua side is what admission uses; tests keep them equal)."""
    every = validate_every(every)
    second = int(at // 1)
    sizes = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
    size = every if isinstance(every, int) else sizes.get(every)
    if size:
        start = second // size * size
        return start, start + size
    moment = datetime.fromtimestamp(second, tz=UTC)
    day = moment.replace(hour=0, minute=0, second=0)
    if every == "week":
        begin = day - timedelta(days=day.weekday())
        end = begin + timedelta(days=7)
    elif every == "month":
        begin = day.replace(day=1)
        end = (begin + timedelta(days=32)).replace(day=1)
    else:  # year
        begin = day.replace(month=1, day=1)
        end = begin.replace(year=begin.year + 1)
    return int(begin.timestamp()), int(end.timestamp())


# -- script argument encoding ----------------------------------------------------------------


def admit_keys(claim: PeriodClaim, prefix: str) -> list[str]:
    return [
        mark_key(claim.key, claim.every, prefix),
        reservations_key(claim.key, claim.every, prefix),
        waiters_key(claim.key, claim.every, prefix),
    ]


def admit_spec(claim: PeriodClaim) -> dict[str, Any]:
    return {"every": every_text(claim.every), "ttl_ms": seconds_to_ms(claim.ttl)}


release_keys = admit_keys


def release_spec(hold: Hold) -> dict[str, Any]:
    assert isinstance(hold.claim, PeriodClaim)
    spec: dict[str, Any] = {"every": every_text(hold.claim.every)}
    detail = getattr(hold, "detail", {})
    if detail.get("bucket") is not None and detail.get("bucket_end") is not None:
        spec["bucket"] = detail["bucket"]
        spec["bucket_end"] = detail["bucket_end"]
    return spec


def extend_keys(claim: PeriodClaim, prefix: str) -> list[str]:
    return [reservations_key(claim.key, claim.every, prefix)]


def extend_spec(hold: Hold, owner: str) -> dict[str, Any]:
    assert isinstance(hold.claim, PeriodClaim)
    bucket = getattr(hold, "detail", {}).get("bucket")
    if bucket is None:
        raise ValueError("a period reservation is renewed with the bucket its admission took")
    return {"owner": owner, "bucket": int(bucket), "ttl_ms": seconds_to_ms(hold.claim.ttl)}


def wake_channel(claim: PeriodClaim, prefix: str) -> str:
    """Release PUBLISHes on the reservations key's name when a reservation ends."""
    return reservations_key(claim.key, claim.every, prefix)


def claim_waiters_key(claim: PeriodClaim, prefix: str) -> str:
    return waiters_key(claim.key, claim.every, prefix)


# -- state --------------------------------------------------------------------------------


def current_bucket(
    every: str | int, *, at: float | None = None, client: Any = None
) -> tuple[int, int]:
    """The bucket (start, end epoch s) holding ``at``, or the Redis time now, computed by the
    same Lua calendar admission uses."""
    client = client or get_client()
    reply = scripts_for(client).run(
        "period_bucket", [], [every_text(every), "" if at is None else repr(float(at))]
    )
    if reply.status is not Status.OK:
        raise ValueError(f"unknown period unit {every!r}")
    return int(reply.data["bucket"]), int(reply.data["bucket_end"])


def period_marked(
    user_key: str, every: str | int, *, client: Any = None, prefix: str | None = None
) -> str | None:
    """Who marked the current bucket (execution id, else owner), or None when unmarked."""
    client = client or get_client()
    start, _ = current_bucket(every, client=client)
    with unavailable_on_connection_error(key=user_key, primitive=PRIMITIVE):
        bucket, marked_by = client.hmget(mark_key(user_key, every, prefix), "bucket", "by")
    if bucket is None or int(float(bucket)) != start:
        return None
    return marked_by or "?"


def period_reserved(
    user_key: str, every: str | int, *, client: Any = None, prefix: str | None = None
) -> dict[str, Any] | None:
    """The live reservation of the current bucket (owner, count, step, execution, reactor,
    acquired_at ms, ttl s), or None when the bucket is not in flight."""
    client = client or get_client()
    start, _ = current_bucket(every, client=client)
    with unavailable_on_connection_error(key=user_key, primitive=PRIMITIVE):
        seconds, micros = client.time()
        raw = client.hget(reservations_key(user_key, every, prefix), str(start))
    if raw is None:
        return None
    entry: dict[str, Any] = json.loads(raw)
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    left_ms = int(entry.get("expires", 0)) - now_ms
    if left_ms <= 0:
        return None  # its holder died: the next admission frees it
    entry["ttl"] = left_ms / 1000
    return entry


# -- the operator's view (see coordination.primitives.Primitive.inspect) ---------------------


def inspect(
    user_key: str, *, limit: int | None = None, client: Any = None, prefix: str | None = None
) -> dict[str, Any]:
    """Every calendar unit's current bucket: who marked it, who runs it now."""
    marks = [
        {
            "every": every,
            "marked_by": period_marked(user_key, every, client=client, prefix=prefix),
            # the run holding the current bucket now (neither done nor free yet)
            "in_flight": _in_flight(period_reserved(user_key, every, client=client, prefix=prefix)),
        }
        for every in UNITS
    ]
    return {
        "marks": marks,
        "marked": [m for m in marks if m["marked_by"]],
        "in_flight": [m for m in marks if m["in_flight"]],
    }


def _in_flight(reservation: dict[str, Any] | None) -> dict[str, Any] | None:
    """A reservation as the report shows it: who runs the bucket, for how long yet."""
    if reservation is None:
        return None
    return {
        "owner": reservation.get("owner"),
        "execution": reservation.get("execution") or None,
        "step": reservation.get("step") or None,
        "reactor": reservation.get("reactor") or None,
        "acquired_at": to_datetime(reservation["acquired_at"] / 1000)
        if reservation.get("acquired_at")
        else None,
        "ttl": reservation.get("ttl"),
    }


def summary(report: dict[str, Any]) -> str:
    parts = [f"{m['every']} marked by {m['marked_by']}" for m in report["marked"]]
    parts += [
        f"{m['every']} in flight ({m['in_flight']['execution'] or m['in_flight']['owner']})"
        for m in report["in_flight"]
    ]
    return ", ".join(parts) or "no current bucket marked or in flight"


def attributed(report: dict[str, Any]) -> list[dict[str, Any]]:
    return []  # the in-flight reservations are shown as text, without links
