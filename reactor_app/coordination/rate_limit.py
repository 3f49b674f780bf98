"""Rate limit: at most ``limit`` admissions per window per key, several windows at once (§2.6).

Key layout (``K`` = the user key, inside the hash tag; ``W`` = window seconds as text):

* ``{prefix}:rate_limit:{K}:W`` — sliding strategy (the default): a zset of admissions,
  ``member -> admission time (epoch µs)``; a member is ``"<µs>-<seq>"`` for a cost of 1 and
  ``"<µs>-<seq>*<cost>"`` for a weighted admission. An admission at ``t`` counts (its cost)
  while ``now < t + window``, so no window of that length ever charges more than ``limit``,
  and a refusal knows exactly when enough cost leaves (``retry_after``).
* ``{prefix}:rate_limit:{K}:W:cost`` — sliding strategy: hash ``{cost, n}``, the running total
  cost of the zset's members and how many members it accounts for. Admission adds to it and
  the purge of expired members subtracts their costs, so a check is O(log n + expired) for
  any cost; when ``n`` disagrees with the zset (the hash expired, or an older release of this
  library admitted without it) the total is rebuilt from the members once. The zset and this
  hash live a window past the newest member, set a quarter of a window longer than that so
  that the admissions within the spare set no lifetimes (docs/coordination.md, "How long a
  window's keys live").
* ``{prefix}:rate_limit:{K}:W:fixed`` — fixed strategy: a counter (``INCRBY cost``) that
  expires at the window's epoch-aligned end. Constant memory for very large limits; a burst of
  up to twice the limit can straddle a window edge.
* ``{prefix}:rate_limit:{K}:seq`` — a sequence making sliding-window members unique.
* ``{prefix}:rate_limit:{K}:windows`` — hash ``label -> json {seconds, limit, strategy}``,
  written by every admission (the limits travel with it), so operators see the window counts
  against their limits without typing them; it lives as long as the longest window's keys.

Every window of a claim is checked, and all are charged, in one atomic admission; a charge is
only spent on work that is about to run (nothing is charged when anything else refuses).
Named limits come from ``REACTOR_RATE_LIMITS`` (see ``named_windows``), unless an operator
overrides one live (``coordination.live_limits``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

from reactor_app import bounds
from reactor_app.conf import reactor_settings
from reactor_app.coordination import live_limits
from reactor_app.coordination.claims import Hold, RateLimitClaim, RateWindow
from reactor_app.coordination.keys import key
from reactor_app.coordination.redis import get_client, server_time, unavailable_on_connection_error
from reactor_app.exceptions import ConfigurationError, RateLimitCostError

# -- the interface's flags (see coordination.primitives.Primitive) ---------------------------
PRIMITIVE = "rate_limit"
#: a quota, not an owned hold
HOLDS = False
#: a refusal's retry_after is exactly when enough of the window frees
HINTED = True
UNCAPPED_WAITS = False
#: an admission spends its charge for good
CHARGES = True

#: named periods and their length in seconds
PERIODS: dict[str, float] = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0}


def parse_period(period: str | float | timedelta) -> float:
    """Window length in seconds of ``"second" | "minute" | "hour" | "day"`` or a number of
    seconds (or a ``timedelta``). Raises ``ValueError`` with the accepted forms."""
    if isinstance(period, timedelta):
        period = period.total_seconds()
    if isinstance(period, str):
        name = period.strip().lower()
        if name in PERIODS:
            return PERIODS[name]
        raise ValueError(
            f"unknown rate-limit period {period!r}: use one of {sorted(PERIODS)} "
            "or a number of seconds"
        )
    if isinstance(period, bool) or not isinstance(period, (int, float)):
        raise ValueError(
            f"a rate-limit period must be one of {sorted(PERIODS)} or a number of seconds, "
            f"got {period!r}"
        )
    return bounds.seconds_within(period, "a rate-limit period")


def seconds_text(seconds: float) -> str:
    """``60.0 -> "60"``, ``0.5 -> "0.5"``: the window's part of key names and labels."""
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


def period_label(period: str | float | timedelta, seconds: float) -> str:
    if isinstance(period, str):
        return period.strip().lower()
    for name, length in PERIODS.items():
        if length == seconds:
            return name
    return seconds_text(seconds)


def _limit(value: Any, where: str) -> int:
    return bounds.count_within(value, f"{where}: a rate limit")


def windows_from(
    limit: int | None = None,
    period: str | float | timedelta | None = None,
    limits: Mapping[str | float, int] | None = None,
) -> tuple[RateWindow, ...]:
    """Windows of ``limit=, period=`` or of ``limits={"second": 3, "minute": 100}``, sorted by
    length. Raises ``ValueError`` naming the problem."""
    if limits is not None:
        if limit is not None or period is not None:
            raise ValueError("give either limit= and period=, or limits=, not both")
        if not isinstance(limits, Mapping) or not limits:
            raise ValueError("limits= must be a non-empty dict of period -> limit")
        windows = []
        for window_period, window_limit in limits.items():
            seconds = parse_period(window_period)
            windows.append(
                RateWindow(
                    seconds=seconds,
                    limit=_limit(window_limit, f"limits[{window_period!r}]"),
                    label=period_label(window_period, seconds),
                )
            )
        seen = [w.seconds for w in windows]
        if len(set(seen)) != len(seen):
            raise ValueError(f"limits= names the same window length twice: {limits!r}")
        return tuple(sorted(windows, key=lambda w: w.seconds))
    if limit is None or period is None:
        raise ValueError("a rate limit needs limit= and period= (or limits=)")
    seconds = parse_period(period)
    return (
        RateWindow(
            seconds=seconds, limit=_limit(limit, "limit="), label=period_label(period, seconds)
        ),
    )


def named_config(name: str) -> Mapping[str, Any]:
    configured = reactor_settings.RATE_LIMITS
    if name not in configured:
        known = ", ".join(sorted(configured)) or "none are configured"
        raise ConfigurationError(
            f"unknown named rate limit {name!r}: add it to REACTOR_RATE_LIMITS "
            f"(known: {known}), e.g. REACTOR_RATE_LIMITS = "
            f'{{"{name}": {{"limit": 100, "period": "second"}}}}',
            setting="RATE_LIMITS",
        )
    config = configured[name]
    if not isinstance(config, Mapping):
        raise ConfigurationError(
            f"REACTOR_RATE_LIMITS[{name!r}] must be a dict, got {config!r}", setting="RATE_LIMITS"
        )
    return config


def named_windows(name: str, *, live: bool = True) -> tuple[RateWindow, ...]:
    """The windows of ``REACTOR_RATE_LIMITS[name]`` (``{"limit", "period"}`` or
    ``{"limits": {...}}``) — or of an operator's live override of it (``live_limits``);
    ``ConfigurationError`` for an unknown name or a bad entry. ``live=False``: settings only
    (``manage.py check``, which must not need Redis)."""
    config = named_config(name)
    if live:
        config = live_limits.rate_limit_config(name, config)
    try:
        return windows_from(
            limit=config.get("limit"), period=config.get("period"), limits=config.get("limits")
        )
    except ValueError as exc:
        raise ConfigurationError(
            f"REACTOR_RATE_LIMITS[{name!r}] is invalid: {exc}", setting="RATE_LIMITS"
        ) from exc


def named_claim(name: str, key_: str | None = None) -> RateLimitClaim:
    """The claim of a named limit; its key is the name unless given (``strategy`` optional)."""
    config = named_config(name)
    strategy = config.get("strategy", "sliding")
    if strategy not in ("sliding", "fixed"):
        raise ConfigurationError(
            f"REACTOR_RATE_LIMITS[{name!r}]['strategy'] must be 'sliding' or 'fixed'",
            setting="RATE_LIMITS",
        )
    return RateLimitClaim(
        key=key_ or name, windows=named_windows(name), strategy=strategy, limit_name=name
    )


def live_claim(claim: RateLimitClaim) -> RateLimitClaim:
    """The claim with its named limit's windows as they are now (an operator's override,
    ``coordination.live_limits``): read at every admission, so a unit already waiting obeys
    a change too. A cost the new windows could never admit is a ``RateLimitCostError``, as it
    is when the claim is made."""
    if claim.limit_name is None:
        return claim
    windows = named_windows(claim.limit_name)
    if windows == claim.windows:
        return claim
    for window in windows:
        if claim.cost > window.limit:
            raise RateLimitCostError(
                f"rate limit {claim.key!r} now allows {window.limit} per {window.label} (an "
                f"operator's override), so a cost of {claim.cost} could never be admitted; "
                "the work did not run",
                key=claim.key,
                primitive=PRIMITIVE,
                cause="cost above the window's limit",
                cost=claim.cost,
                limit=window.limit,
                period=window.label,
            )
    return replace(claim, windows=windows)


# -- key layout ------------------------------------------------------------------------------


def sequence_key(user_key: str, prefix: str | None = None) -> str:
    return key(PRIMITIVE, user_key, "seq", prefix=prefix)


def window_key(
    user_key: str, seconds: float, strategy: str = "sliding", prefix: str | None = None
) -> str:
    parts = [seconds_text(seconds)] + (["fixed"] if strategy == "fixed" else [])
    return key(PRIMITIVE, user_key, *parts, prefix=prefix)


def cost_key(user_key: str, seconds: float, prefix: str | None = None) -> str:
    """The running total cost of a sliding window (see the module docstring)."""
    return key(PRIMITIVE, user_key, seconds_text(seconds), "cost", prefix=prefix)


def _cost_keys(claim: RateLimitClaim, prefix: str) -> list[str]:
    if claim.strategy == "fixed":
        return []
    return [cost_key(claim.key, w.seconds, prefix) for w in claim.windows]


def member_cost(member: str | bytes) -> int:
    """The cost a sliding-window member carries (``"<µs>-<seq>*<cost>"``; 1 without ``*``)."""
    text = member.decode() if isinstance(member, bytes) else member
    _, star, cost = text.rpartition("*")
    return int(cost) if star and cost.isdigit() else 1


# -- script argument encoding ----------------------------------------------------------------


def windows_key(user_key: str, prefix: str | None = None) -> str:
    return key(PRIMITIVE, user_key, "windows", prefix=prefix)


def admit_keys(claim: RateLimitClaim, prefix: str) -> list[str]:
    return [
        sequence_key(claim.key, prefix),
        *[window_key(claim.key, w.seconds, claim.strategy, prefix) for w in claim.windows],
        windows_key(claim.key, prefix),
        *_cost_keys(claim, prefix),
    ]


def admit_spec(claim: RateLimitClaim) -> dict[str, Any]:
    if not claim.windows:
        raise ValueError(f"rate limit on {claim.key!r} has no windows")
    return {
        "strategy": claim.strategy,
        "stored": True,  # the windows hash follows the window keys
        "cost": int(claim.cost),  # the running-total keys (sliding) follow the windows hash
        "windows": [
            {"ms": max(1, round(w.seconds * 1000)), "limit": int(w.limit), "label": w.label}
            for w in claim.windows
        ],
    }


def release_keys(claim: RateLimitClaim, prefix: str) -> list[str]:
    return [
        *[window_key(claim.key, w.seconds, claim.strategy, prefix) for w in claim.windows],
        *_cost_keys(claim, prefix),
    ]


def release_spec(hold: Hold) -> dict[str, Any]:
    assert isinstance(hold.claim, RateLimitClaim)
    spec: dict[str, Any] = {
        "strategy": hold.claim.strategy,
        "cost": int(hold.claim.cost),
        "w": len(hold.claim.windows),
    }
    member = getattr(hold, "detail", {}).get("member")
    if member:
        spec["member"] = member
    return spec


def wake_channel(claim: RateLimitClaim, prefix: str) -> None:
    """Nothing is ever released: a window frees itself, at the exact ``retry_after``."""
    return None


def claim_waiters_key(claim: RateLimitClaim, prefix: str) -> None:
    return None


# -- state --------------------------------------------------------------------------------


def rate_limit_count(
    user_key: str,
    window: str | float | timedelta,
    *,
    strategy: str = "sliding",
    client: Any = None,
    prefix: str | None = None,
) -> int:
    """Units charged now in the window of that length (label or seconds): the number of
    admissions, or the sum of their costs for a weighted limit."""
    client = client or get_client()
    seconds = parse_period(window)
    name = window_key(user_key, seconds, strategy, prefix)
    with unavailable_on_connection_error(key=user_key, primitive=PRIMITIVE):
        if strategy == "fixed":
            return int(client.get(name) or 0)
        now_seconds, micros = server_time(client, name)
        now_us = now_seconds * 1_000_000 + micros
        # an operator's read: summing the members is exact and needs no script
        members = client.zrangebyscore(name, f"({now_us - round(seconds * 1_000_000)}", "+inf")
        return sum(member_cost(m) for m in members)


def stored_windows(
    user_key: str, *, client: Any = None, prefix: str | None = None
) -> list[tuple[str, float, int, str]]:
    """``(label, seconds, limit, strategy)`` of the windows the latest admissions of
    ``user_key`` declared, shortest first (empty when none was admitted recently)."""
    client = client or get_client()
    with unavailable_on_connection_error(key=user_key, primitive=PRIMITIVE):
        raw = client.hgetall(windows_key(user_key, prefix))
    windows = []
    for label, text in raw.items():
        data = json.loads(text)
        windows.append(
            (label, float(data["seconds"]), int(data["limit"]), str(data.get("strategy", "")))
        )
    return sorted(windows, key=lambda w: w[1])


# -- the operator's view (see coordination.primitives.Primitive.inspect) ---------------------

#: the windows reported for a key that no stored admission or named limit describes
STANDARD_WINDOWS = ("second", "minute", "hour", "day")


def reported_windows(
    user_key: str, *, client: Any = None, prefix: str | None = None
) -> list[tuple[str, float, int | None, str]]:
    """``(label, seconds, limit, strategy)`` of the windows to report for ``user_key``: those
    its latest admissions stored in Redis, else those of the named limit of that name
    (``REACTOR_RATE_LIMITS``), else the standard periods without a known limit."""
    stored = stored_windows(user_key, client=client, prefix=prefix)
    if stored:
        return [(label, seconds, limit, strategy) for label, seconds, limit, strategy in stored]
    if user_key in reactor_settings.RATE_LIMITS:
        try:
            return [(w.label, w.seconds, w.limit, "sliding") for w in named_windows(user_key)]
        except Exception:  # a broken named limit must not hide the counts
            pass
    return [(label, parse_period(label), None, "sliding") for label in STANDARD_WINDOWS]


def inspect(
    user_key: str, *, limit: int | None = None, client: Any = None, prefix: str | None = None
) -> dict[str, Any]:
    return {
        "windows": [
            {
                "window": label,
                "seconds": seconds,
                "count": rate_limit_count(
                    user_key, seconds, strategy=strategy, client=client, prefix=prefix
                ),
                "limit": window_limit,
            }
            for label, seconds, window_limit, strategy in reported_windows(
                user_key, client=client, prefix=prefix
            )
        ]
    }


def summary(report: dict[str, Any]) -> str:
    return ", ".join(
        f"{w['count']}{'/' + str(w['limit']) if w['limit'] else ''} per {w['window']}"
        for w in report["windows"]
    )


def attributed(report: dict[str, Any]) -> list[dict[str, Any]]:
    return []  # a charge names nobody
