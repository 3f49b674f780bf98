"""The checks of the coordination decorators' options (``dsl.coordination``), each raising a
``DefinitionError`` that names the decorator and the option and says what to give instead.

Split from ``dsl.coordination`` so that the decorators read as the declarations they build; the
ranges of the durations and counts a script will see are ``reactor_app.bounds``'.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from reactor_app import bounds
from reactor_app.coordination.claims import RateWindow
from reactor_app.coordination.rate_limit import parse_period
from reactor_app.dsl.declarations import CONTENTION_STRATEGIES, KeyFunction
from reactor_app.exceptions import DefinitionError


def wait_option(owner: str, option: str, value: Any) -> float:
    """A wait in seconds, 0 or more. Waits are measured by the waiting process and never reach
    a script, so ``float("inf")`` is a wait without end (``reactor_app.bounds``)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and value >= 0:
        return float(value)
    raise DefinitionError(
        f"{owner}: {option} must be a number of seconds >= 0, got {value!r}",
        owner=owner,
        option=option,
    )


def lifetime_option(owner: str, option: str, value: Any) -> float:
    """A duration a script keeps (a lease, a quiet period): within ``reactor_app.bounds``."""
    try:
        return bounds.seconds_within(value, option)
    except ValueError as exc:
        raise DefinitionError(f"{owner}: {exc}", owner=owner, option=option) from None


def count_option(owner: str, option: str, value: Any, what: str | None = None) -> int:
    """A limit or a cost: a whole number within ``reactor_app.bounds``."""
    try:
        return bounds.count_within(value, what or option)
    except ValueError as exc:
        raise DefinitionError(f"{owner}: {exc}", owner=owner, option=option) from None


def strategy_option(owner: str, primitive: str, value: Any) -> str:
    choices = CONTENTION_STRATEGIES[primitive]
    if value not in choices:
        raise DefinitionError(
            f"{owner}: on_contention must be one of {', '.join(map(repr, choices))}, got {value!r}",
            owner=owner,
            option="on_contention",
        )
    return str(value)


def key_function(owner: str, key: Any) -> KeyFunction:
    if not callable(key):
        raise DefinitionError(
            f"{owner}: the first argument must be a key function such as "
            f"lambda args: f\"acct:{{args['account_id']}}\", got {key!r}",
            owner=owner,
            option="key",
        )
    try:
        signature = inspect.signature(key)
    except (TypeError, ValueError):  # some builtins and C callables have none to inspect
        return key  # type: ignore[no-any-return]
    try:
        signature.bind({})
    except TypeError as exc:
        # Checked now, not when the first run calls it: it is called with one mapping.
        raise DefinitionError(
            f"{owner}: the key function {getattr(key, '__name__', key)!r} must accept one "
            f"argument (the arguments or inputs mapping), but its signature is {signature} "
            f"({exc})",
            owner=owner,
            option="key",
        ) from exc
    return key  # type: ignore[no-any-return]


def windows_option(owner: str, limits: Mapping[Any, Any]) -> tuple[RateWindow, ...]:
    if not isinstance(limits, Mapping) or not limits:
        raise DefinitionError(
            f"{owner}: limits must be a non-empty dict such as {{'second': 3, 'minute': 100}}",
            owner=owner,
            option="limits",
        )
    windows = []
    for period, limit in limits.items():
        try:
            seconds = parse_period(period)
        except (ValueError, TypeError) as exc:
            raise DefinitionError(f"{owner}: {exc}", owner=owner, option="limits") from exc
        limit = count_option(owner, "limits", limit, f"the limit for {period!r}")
        windows.append(RateWindow(seconds=seconds, limit=limit, label=str(period)))
    return tuple(sorted(windows, key=lambda w: w.seconds))


def fair_by_option(owner: str, fair_by: Any) -> KeyFunction:
    """A ``fair_by`` function, checked now as a key function is (it is called the same way)."""
    if not callable(fair_by):
        raise DefinitionError(
            f"{owner}: fair_by must be a function of the arguments naming the waiter's group, "
            f"such as lambda args: args['tenant'], got {fair_by!r}",
            owner=owner,
            option="fair_by",
        )
    return key_function(owner, fair_by)


def bool_option(owner: str, option: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise DefinitionError(
            f"{owner}: {option} must be True or False, got {value!r}", owner=owner, option=option
        )
    return value
