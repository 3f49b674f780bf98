"""Live coordination state, shaped for operators: the one place the admin and the API read Redis.

Redis is the source of truth for holds (docs/design.md §4), so nothing here copies state into
the ORM.
``live_holds`` lists every lock and semaphore hold with its attribution (owning step or the
reactor level, execution, acquisition time, TTL left, nesting count, fencing token);
``inspect_key`` answers "what is the state of this key?" for any of the five primitives.
The operator verbs (force release, ordered-lock skip and reset) live in ``operations``.

Everything is read through ``reactor_app.coordination`` (``state``, the live-holds index, and
each primitive module's ``inspect``); this module only filters, normalises times to aware
datetimes and labels the level of each hold.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.utils.dateparse import parse_datetime

from reactor_app.coordination import holds_index, primitives, semaphore
from reactor_app.coordination import state as coordination_state
from reactor_app.coordination.reports import to_datetime
from reactor_app.datetimes import from_epoch

#: the primitives an operator can inspect, in admission order (docs/design.md §2.1)
PRIMITIVES = primitives.NAMES
#: primitives whose holds are "held" (listed as live holds and force-releasable)
HOLDING_PRIMITIVES = primitives.HOLDING
#: how a listing of live holds may be ordered (without a key prefix, which lists by key)
HOLD_ORDERINGS = holds_index.ORDERINGS
#: hold levels: a step's own hold, or one taken around the whole reactor run
LEVELS = ("step", "reactor")


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
        "limit": raw.get("limit"),  # a semaphore's, as its latest admission declared it
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


@dataclass
class HoldsPage:
    """One page of live holds for operators: rows, the next cursor, totals from the index."""

    rows: list[dict[str, Any]]
    next_cursor: str | None
    totals: dict[str, int]
    #: how many holds match, when it is known without reading them all (else None)
    count: int | None


#: filters the index answers in O(page) (the others read on until the page is full)
INDEXED_FILTERS = ("key_prefix", "primitive")


def hold_page(
    *,
    limit: int = 50,
    cursor: str | None = None,
    key: str | None = None,
    key_prefix: str | None = None,
    primitive: str | None = None,
    step: str | None = None,
    level: str | None = None,
    reactor: str | None = None,
    execution: str | None = None,
    ordering: str | None = None,
) -> HoldsPage:
    """A page of live holds from the live-holds index (``coordination.holds_index``, sharded
    by hash slot on a Redis Cluster), in ``ordering`` — acquisition time (the default) or
    time left, either way; by key under a ``key_prefix`` — continuing after ``cursor``.

    Raises ``ValueError`` for a bad cursor or ordering and ``CoordinationUnavailable`` when
    Redis cannot be reached.
    """
    filters = {
        "key": key,
        "primitive": primitive,
        "step": step,
        "level": level,
        "reactor": reactor,
        "execution": str(execution) if execution else None,
    }
    found = holds_index.page(
        limit=limit, cursor=cursor, key_prefix=key_prefix, ordering=ordering, **filters
    )
    narrowed = {k for k, v in filters.items() if v} | ({"key_prefix"} if key_prefix else set())
    count: int | None = None
    if not narrowed:
        count = sum(found.totals.values())
    elif narrowed == {"primitive"} and primitive:
        count = found.totals.get(primitive, 0)
    elif cursor is None and found.next_cursor is None:
        count = len(found.rows)
    return HoldsPage(
        rows=[_hold(raw) for raw in found.rows],
        next_cursor=found.next_cursor,
        totals=found.totals,
        count=count,
    )


def semaphore_occupancy(holds: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per semaphore key: how many owners hold a slot, and who (from ``live_holds`` rows)."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for hold in holds:
        if hold["primitive"] == semaphore.PRIMITIVE:
            by_key.setdefault(hold["key"], []).append(hold)
    return [
        {
            "key": key,
            "held": len(holders),
            "limit": next((h["limit"] for h in holders if h.get("limit")), None),
            "holders": holders,
        }
        for key, holders in sorted(by_key.items())
    ]


# -- one key ---------------------------------------------------------------------------------


def inspect_key(primitive: str, key: str, *, limit: int | None = None) -> dict[str, Any]:
    """The live state of one key of one primitive, as plain data (see the admin template):
    ``{"primitive", "key"}`` and what the primitive's module reports (``Primitive.inspect``).

    ``limit`` is the semaphore limit to compute availability against (default: the one the
    latest admission stored).
    Raises ``ValueError`` for an unknown primitive and ``CoordinationUnavailable`` when Redis
    cannot be reached.
    """
    if primitive not in primitives.REGISTRY:
        raise ValueError(f"unknown primitive {primitive!r}: use one of {', '.join(PRIMITIVES)}")
    report: dict[str, Any] = {"primitive": primitive, "key": key}
    report.update(primitives.get(primitive).inspect(key, limit=limit))
    return report


# Here rather than with the serializers: the admin uses it too, and must not need DRF.
def blocker_data(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """The stored blocker snapshot with ``since`` as a datetime (stored as epoch seconds or
    ISO text, depending on who wrote it)."""
    if not raw:
        return None
    since = raw.get("since")
    if isinstance(since, int | float):
        since = from_epoch(since)
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
