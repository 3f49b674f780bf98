"""Live coordination state, shaped for operators: the one place the admin and the API read Redis.

Redis is the source of truth for holds (docs/design.md §4), so nothing here copies state into
the ORM.
``live_holds`` lists every lock and semaphore hold with its attribution (owning step or the
reactor level, execution, acquisition time, TTL left, nesting count, fencing token);
``inspect_key`` answers "what is the state of this key?" for any of the five primitives.
The operator verbs (force release, ordered-lock skip and reset) live in ``actions``.

Everything is read through ``reactor_app.coordination.state``; this module only filters,
normalises times to aware datetimes and labels the level of each hold.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from reactor_app.conf import reactor_settings
from reactor_app.coordination import state as coordination_state

#: the primitives an operator can inspect, in admission order (docs/design.md §2.1)
PRIMITIVES = ("ordered_lock", "period", "lock", "semaphore", "rate_limit")
#: primitives whose holds are "held" (listed as live holds and force-releasable)
HOLDING_PRIMITIVES = ("lock", "semaphore")
#: the rate-limit windows reported for a key no named limit describes
STANDARD_WINDOWS = ("second", "minute", "hour", "day")
#: hold levels: a step's own hold, or one taken around the whole reactor run
LEVELS = ("step", "reactor")


def to_datetime(epoch_seconds: float | None) -> datetime | None:
    if epoch_seconds is None:
        return None
    return datetime.fromtimestamp(float(epoch_seconds), tz=UTC)


def _hold(raw: dict[str, Any]) -> dict[str, Any]:
    step = raw.get("step") or None
    return {
        "primitive": raw["primitive"],
        "key": raw["key"],
        # Reactor-level holds carry no step; a hold taken by Step.call has a step but no
        # execution. Both are still attributable from the hold itself.
        "level": "step" if step else "reactor",
        "step": step,
        "owner": raw.get("owner") or "",
        "execution": raw.get("execution") or None,
        "reactor": raw.get("reactor") or None,
        "acquired_at": to_datetime(raw.get("acquired_at")),
        "ttl_left": raw.get("ttl_left"),
        "count": int(raw.get("count") or 0),
        "token": raw.get("token"),
    }


def live_holds(
    *,
    key: str | None = None,
    primitive: str | None = None,
    step: str | None = None,
    level: str | None = None,
    execution: str | None = None,
) -> list[dict[str, Any]]:
    """Every live lock and semaphore hold, optionally filtered (all filters are exact).

    Raises ``CoordinationUnavailable`` when Redis cannot be reached.
    """
    holds = [_hold(raw) for raw in coordination_state.live_holds()]
    if key:
        holds = [h for h in holds if h["key"] == key]
    if primitive:
        holds = [h for h in holds if h["primitive"] == primitive]
    if step:
        holds = [h for h in holds if h["step"] == step]
    if level:
        holds = [h for h in holds if h["level"] == level]
    if execution:
        holds = [h for h in holds if h["execution"] == str(execution)]
    return holds


def semaphore_occupancy(holds: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per semaphore key: how many owners hold a slot, and who (from ``live_holds`` rows)."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for hold in holds:
        if hold["primitive"] == "semaphore":
            by_key.setdefault(hold["key"], []).append(hold)
    return [
        {"key": key, "held": len(holders), "holders": holders}
        for key, holders in sorted(by_key.items())
    ]


# -- one key ---------------------------------------------------------------------------------


def _windows_for(key: str) -> list[tuple[str, float, int | None]]:
    """``(label, seconds, limit)`` of the windows to report for a rate-limit key: those of the
    named limit of that name (``REACTOR_RATE_LIMITS``), else the standard periods without a
    known limit (limits are not stored in Redis; they travel with each admission)."""
    from reactor_app.coordination import rate_limit

    if key in reactor_settings.RATE_LIMITS:
        try:
            return [(w.label, w.seconds, w.limit) for w in rate_limit.named_windows(key)]
        except Exception:  # a broken named limit must not hide the counts
            pass
    return [(label, rate_limit.parse_period(label), None) for label in STANDARD_WINDOWS]


def inspect_key(primitive: str, key: str, *, limit: int | None = None) -> dict[str, Any]:
    """The live state of one key of one primitive, as plain data (see the admin template).

    ``limit`` is the semaphore limit to compute availability against (not stored in Redis).
    Raises ``ValueError`` for an unknown primitive and ``CoordinationUnavailable`` when Redis
    cannot be reached.
    """
    report: dict[str, Any] = {"primitive": primitive, "key": key}
    if primitive == "lock":
        lock = coordination_state.lock_state(key)
        report["lock"] = {
            **asdict(lock),
            "acquired_at": to_datetime(lock.acquired_at),
            "level": ("step" if lock.step else "reactor") if lock.held else None,
        }
    elif primitive == "semaphore":
        semaphore = coordination_state.semaphore_state(key, limit)
        report["semaphore"] = {
            "limit": semaphore.limit,
            "held": semaphore.held,
            "available": semaphore.available,
            "holders": [
                {**asdict(h), "acquired_at": to_datetime(h.acquired_at)} for h in semaphore.holders
            ],
        }
    elif primitive == "rate_limit":
        report["windows"] = [
            {
                "window": label,
                "seconds": seconds,
                "count": coordination_state.rate_limit_count(key, seconds),
                "limit": window_limit,
            }
            for label, seconds, window_limit in _windows_for(key)
        ]
    elif primitive == "period":
        from reactor_app.coordination.period import UNITS

        marks = [
            {"every": every, "marked_by": coordination_state.period_marked(key, every)}
            for every in UNITS
        ]
        report["marks"] = marks
        report["marked"] = [m for m in marks if m["marked_by"]]
    elif primitive == "ordered_lock":
        ordered = coordination_state.ordered_state(key)
        report["ordered"] = asdict(ordered)
    else:
        raise ValueError(f"unknown primitive {primitive!r}: use one of {', '.join(PRIMITIVES)}")
    return report


# Here rather than with the serializers: the admin uses it too, and must not need DRF.
def blocker_data(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """The stored blocker snapshot with ``since`` as a datetime (stored as epoch seconds or
    ISO text, depending on who wrote it)."""
    if not raw:
        return None
    since = raw.get("since")
    if isinstance(since, int | float):
        since = datetime.fromtimestamp(since, tz=UTC)
    elif isinstance(since, str):
        since = parse_datetime(since)
    ttl = raw.get("ttl", raw.get("ttl_left"))
    return {
        "owner": raw.get("owner"),
        "execution": raw.get("execution") or None,
        "step": raw.get("step") or None,
        "reactor": raw.get("reactor") or None,
        "since": since,
        "ttl": float(ttl) if isinstance(ttl, int | float) else None,
    }
