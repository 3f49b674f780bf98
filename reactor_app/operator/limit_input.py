"""What an operator types for a live limit, checked before anything is stored: the override
value (``parse_value``, ``describe`` back), the limit's name (``check_named``), and who and why
(``check_who_and_why``). Split from ``operator.limits``, whose verbs store and publish what
these accept; the admin's form, the API's serializer and the verbs themselves call them, and
every refusal is an ``InvalidLimit`` whose message says what is expected.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from reactor_app import bounds
from reactor_app.coordination import live_limits
from reactor_app.coordination.rate_limit import named_config, windows_from
from reactor_app.exceptions import ConfigurationError
from reactor_app.models import LimitOverride
from reactor_app.storable import text_problem

PRIMITIVES = live_limits.PRIMITIVES
#: the largest limit an operator may type: the largest a declaration may give
#: (``reactor_app.bounds``), which the scripts keep exact and write back for operators (a
#: semaphore's ``\0limit`` field) as the same whole number
MAX_LIMIT = bounds.LARGEST_COUNT


class InvalidLimit(ValueError):
    """The operator's input is not a limit (the message says what is expected)."""


_WINDOW = re.compile(r"^\s*(\d+)\s*(?:/|per)\s*([\w.]+)\s*$")


def parse_value(primitive: str, name: str, text: Any) -> dict[str, Any]:
    """The override value of ``text``: ``"5"`` for a semaphore; ``"3/second, 100/minute"``
    (or ``"100"`` for a limit with one window, which keeps its period) for a rate limit.
    Raises ``InvalidLimit`` naming the expected form."""
    if primitive not in PRIMITIVES:
        raise InvalidLimit(f"only {' and '.join(PRIMITIVES)} limits can be overridden")
    configured = configured_value(primitive, name)  # InvalidLimit for an unknown name
    raw = str(text if text is not None else "").strip()
    if primitive == "semaphore":
        if not _whole(raw):
            raise InvalidLimit(
                f"a semaphore limit is a whole number from 1 to {MAX_LIMIT}, got {raw!r}"
            )
        return {"limit": int(raw)}
    if raw.isascii() and raw.isdigit():
        periods = _periods(configured)
        if len(periods) != 1:
            raise InvalidLimit(
                f"{name!r} has {len(periods)} windows: give each, e.g. '3/second, 100/minute'"
            )
        raw = f"{raw}/{periods[0]}"
    limits: dict[str, int] = {}
    for part in raw.split(","):
        match = _WINDOW.match(part)
        if not match:
            raise InvalidLimit(
                f"a rate limit is 'limit/period' pairs such as '3/second, 100/minute' "
                f"(period: second, minute, hour, day or seconds), got {raw!r}"
            )
        if not _whole(match.group(1)):
            raise InvalidLimit(f"a rate limit is from 1 to {MAX_LIMIT} per period, got {part!r}")
        count, period = int(match.group(1)), match.group(2)
        if period in limits:
            raise InvalidLimit(f"the period {period!r} is given twice")
        limits[period] = count
    value = {"limits": limits}
    try:
        windows_from(limits=live_limits.period_keys(limits))
    except ValueError as exc:
        raise InvalidLimit(str(exc)) from exc
    return value


def _whole(text: str) -> bool:
    """``text`` is a limit: ASCII digits (``str.isdigit`` also takes "²", which ``int``
    refuses) of a number from 1 to ``MAX_LIMIT``."""
    digits = text.isascii() and text.isdigit() and len(text) <= len(str(MAX_LIMIT)) + 20
    return digits and 1 <= int(text) <= MAX_LIMIT  # (a longer text is no limit: int() not tried)


def _periods(configured: Mapping[str, Any]) -> list[str]:
    if configured.get("limits"):
        return [str(p) for p in configured["limits"]]
    return [str(configured.get("period"))]


def configured_value(primitive: str, name: str) -> dict[str, Any]:
    """What settings give ``name``; ``InvalidLimit`` when settings do not name it."""
    try:
        if primitive == "semaphore":
            return {"limit": live_limits.configured_semaphore_limit(name)}
        config = named_config(name)
    except ConfigurationError as exc:
        raise InvalidLimit(exc.message) from exc
    return {k: v for k, v in config.items() if k in ("limit", "period", "limits")}


def check_named(primitive: str, name: str, *, removing: bool = False) -> None:
    """``InvalidLimit`` unless settings name the limit — or, ``removing`` its override, one is
    recorded: a name a deploy dropped from settings keeps its override (listed, "settings:
    -") until it is removed, and a later deploy that brings the name back must not find a
    forgotten override in force."""
    try:
        configured_value(primitive, name)
    except InvalidLimit:
        if not (removing and (primitive, name) in LimitOverride.objects.current()):
            raise


def describe(primitive: str, value: Mapping[str, Any] | None) -> str:
    """``5`` / ``3/second, 100/minute``: a value as an operator types it."""
    if not value:
        return "-"
    if primitive == "semaphore":
        return str(value.get("limit"))
    if value.get("limits"):
        return ", ".join(f"{n}/{p}" for p, n in value["limits"].items())
    return f"{value.get('limit')}/{value.get('period')}"


def check_who_and_why(by: Any, reason: Any) -> None:
    """``InvalidLimit`` unless ``by`` and ``reason`` are text the override's row and its audit
    event can hold: ``by`` at most as long as ``LimitOverride.set_by``, neither with a NUL or
    a lone surrogate. The API's serializer and the admin's form already refuse those; a direct
    call used to reach the ``INSERT`` with them and fail there (``DataError``)."""
    longest = LimitOverride._meta.get_field("set_by").max_length or 0
    for what, text in (("by", by), ("reason", reason)):
        if not isinstance(text, str):
            raise InvalidLimit(f"{what} must be text, got {type(text).__name__}")
        problem = text_problem(text)
        if problem:
            raise InvalidLimit(f"{what} holds {problem}, which the database cannot store")
    if len(by) > longest:
        raise InvalidLimit(f"by is {len(by)} characters long; at most {longest}")
