"""Live limits: the effective value of a named limit, settings or an operator's override.

Named limits are declared in settings — semaphores in ``REACTOR_LIMITS`` (``{"name":
{"limit": 5}}``, used as ``with_semaphore(key, limit="name")``), rate limits in
``REACTOR_RATE_LIMITS`` (``with_rate_limit("name")``). An operator may override one without a
deploy (the admin's Limits page, ``operator.limits``); the database row is the record, and the
value every process obeys is published to one Redis hash:

* ``{prefix}:limits`` — hash ``"<primitive>:<name>" -> json {"value": {...}, "by", "at",
  "reason"}``; ``value`` is ``{"limit": n}`` for a semaphore and a ``REACTOR_RATE_LIMITS``
  entry (``{"limit", "period"}`` or ``{"limits"}``) for a rate limit. Two more fields order
  the publishers (``SEQUENCE_FIELD``, ``PUBLISHED_FIELD``: see ``publish``).

Why a client-side copy and not a read inside the admission scripts: on a Redis Cluster the
hash lives in one slot and the scripts of other slots could not read it; and the limit already
travels with every admission as an argument (``semaphore.admit_spec``, the rate-limit
windows), so the scripts never read it. Each process keeps a copy of the hash and
reads it again at most every ``REFRESH_SECONDS`` (0.1) when asked for a limit: one HGETALL
per process per tenth of a second at most, no database query and no extra round trip on the
admissions in between, and a change is seen everywhere within ``REFRESH_SECONDS`` (the 1 s
promise of docs/coordination.md, with room for the delivery of a woken execution).

The overrides are those of the configured Redis and ``REACTOR_KEY_PREFIX``: a ``Coordinator``
built with another client or prefix still reads them there (a named limit is a setting of the
deployment, not of one client).

A copy that cannot be refreshed (Redis unreachable) keeps its last values: the admission that
asked will meet the same outage and report it itself. The hash is rewritten whole by every
change (``publish``, ordered by tickets so that a set read earlier never lands over one read
later), so a lost hash (a restarted Redis without persistence) is healed by the next change
or by the workers' periodic ``republish`` from the database (``engine.sweeper``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis as redis_py

from reactor_app import bounds, forks
from reactor_app.conf import reactor_settings
from reactor_app.coordination.keys import current_prefix
from reactor_app.coordination.redis import get_client, unavailable_on_connection_error
from reactor_app.coordination.scripts import scripts_for
from reactor_app.exceptions import ConfigurationError

#: the primitives whose named limits can be overridden
PRIMITIVES = ("semaphore", "rate_limit")
#: how stale a process's copy of the overrides may be, in seconds
REFRESH_SECONDS = 0.1
#: fields of the hash that are no override (``lua/limits_publish.lua``): the last ticket
#: handed to a publisher, and the ticket of the set published
SEQUENCE_FIELD = "\0sequence"
PUBLISHED_FIELD = "\0published"


def hash_key(prefix: str | None = None) -> str:
    """The Redis hash of the published overrides (no hash tag: it is read on its own)."""
    return f"{current_prefix(prefix)}:limits"


def field_name(primitive: str, name: str) -> str:
    return f"{primitive}:{name}"


@dataclass(frozen=True)
class Override:
    """One published override, as every process sees it."""

    primitive: str
    name: str
    value: dict[str, Any]
    by: str = ""
    at: float | None = None  # epoch seconds
    reason: str = ""


# -- the process's copy --------------------------------------------------------------------


class _Copy:
    """The overrides as last read, per (client, prefix), re-read at most every
    ``REFRESH_SECONDS``. Replaced whole, so readers on other threads never see half of one."""

    def __init__(self) -> None:
        self._by_source: dict[tuple[int, str], tuple[float, dict[str, Override]]] = {}
        self._guard = threading.Lock()

    def get(self, client: Any, prefix: str) -> dict[str, Override]:
        source = (id(client), prefix)
        known = self._by_source.get(source)
        now = time.monotonic()
        if known is not None and now - known[0] < REFRESH_SECONDS:
            return known[1]
        with self._guard:  # one reader refreshes; the others keep the copy they had
            known = self._by_source.get(source)
            if known is not None and time.monotonic() - known[0] < REFRESH_SECONDS:
                return known[1]
            # stamped when asked, not when answered: the copy is at most REFRESH_SECONDS older
            # than the hash whatever the round trip took
            asked = time.monotonic()
            try:
                raw = client.hgetall(hash_key(prefix))
            except redis_py.exceptions.RedisError:
                if known is None:
                    raise
                # keep the last values; the admission meets the outage and reports it
                self._by_source[source] = (time.monotonic(), known[1])
                return known[1]
            overrides = _parse(raw)
            self._by_source[source] = (asked, overrides)
            return overrides

    def forget(self) -> None:
        with self._guard:
            self._by_source.clear()

    def after_fork(self) -> None:
        """A forked child starts with a fresh lock (the parent may have held it while forking:
        Celery's prefork pool) and no copy (its clients are new connections anyway)."""
        self._guard = threading.Lock()
        self._by_source = {}


_copy = _Copy()
forks.after_in_child(_copy.after_fork)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _parse(raw: Mapping[Any, Any]) -> dict[str, Override]:
    overrides = {}
    for field, payload in raw.items():
        if _text(field).startswith("\0"):
            continue  # the publishers' tickets (SEQUENCE_FIELD, PUBLISHED_FIELD)
        primitive, _, name = _text(field).partition(":")
        try:
            data = json.loads(_text(payload))
            value = dict(data["value"])
        except (ValueError, KeyError, TypeError):
            continue  # not ours to read (never written by publish): ignored, not fatal
        overrides[field_name(primitive, name)] = Override(
            primitive=primitive,
            name=name,
            value=value,
            by=str(data.get("by") or ""),
            at=data.get("at"),
            reason=str(data.get("reason") or ""),
        )
    return overrides


def overrides(*, client: Any = None, prefix: str | None = None) -> dict[str, Override]:
    """Every published override (``"<primitive>:<name>" -> Override``), from this process's
    copy (at most ``REFRESH_SECONDS`` old)."""
    client = client if client is not None else get_client()
    with unavailable_on_connection_error():
        return _copy.get(client, current_prefix(prefix))


def read_published(*, client: Any = None, prefix: str | None = None) -> dict[str, Override]:
    """The published overrides read from Redis now (not this process's copy)."""
    client = client if client is not None else get_client()
    with unavailable_on_connection_error():
        return _parse(client.hgetall(hash_key(current_prefix(prefix))))


def override_for(
    primitive: str, name: str, *, client: Any = None, prefix: str | None = None
) -> Override | None:
    return overrides(client=client, prefix=prefix).get(field_name(primitive, name))


def forget_copy() -> None:
    """Drop this process's copy (the next read goes to Redis): after a ``publish`` here, and
    for tests that switch servers."""
    _copy.forget()


# -- publishing (operator.limits calls it with the database's rows) ------------------------


def publish(
    current: Mapping[str, Override] | Callable[[], Mapping[str, Override]],
    *,
    client: Any = None,
    prefix: str | None = None,
) -> bool:
    """Replace the published overrides with ``current`` — or with what ``current()`` returns,
    read after this publish took its ticket (``lua/limits_publish.lua``) — in one script:
    readers see the old set or the new one, never a mix. False when a set read under a later
    ticket was published already (this one is older, and dropped).

    Pass the reader, not what it read: concurrent changes publish concurrently, and only a set
    read *after* the ticket is known to hold every change whose publisher took an earlier one
    (the database's rows: ``LimitOverride.objects.publish``). So the set published last is
    never older than one it replaced, whatever order the publishers' writes arrive in."""
    client = client if client is not None else get_client()
    name = hash_key(prefix)
    with unavailable_on_connection_error(key=name):
        ticket = int(client.hincrby(name, SEQUENCE_FIELD, 1))
    found = current() if callable(current) else current
    mapping = {
        field_name(o.primitive, o.name): json.dumps(
            {"value": o.value, "by": o.by, "at": o.at, "reason": o.reason}, sort_keys=True
        )
        for o in found.values()
    }
    with unavailable_on_connection_error(key=name):
        written = scripts_for(client).call(
            "limits_publish", [name], [ticket, json.dumps(mapping, sort_keys=True)]
        )
    forget_copy()
    return bool(int(written))


# -- the values settings give ----------------------------------------------------------------


def semaphore_value(limit: Any, where: str) -> int:
    """A semaphore limit as an int, or ``ValueError`` naming ``where`` it came from."""
    return bounds.count_within(limit, f"{where}: a semaphore limit")


def configured_semaphore_limit(name: str) -> int:
    """``REACTOR_LIMITS[name]`` (``{"limit": n}`` or just ``n``); ``ConfigurationError`` for an
    unknown name or a bad entry."""
    configured = reactor_settings.LIMITS
    if name not in configured:
        known = ", ".join(sorted(configured)) or "none are configured"
        raise ConfigurationError(
            f"unknown named limit {name!r}: add it to REACTOR_LIMITS (known: {known}), e.g. "
            f'REACTOR_LIMITS = {{"{name}": {{"limit": 5}}}}',
            setting="LIMITS",
        )
    entry = configured[name]
    limit = entry.get("limit") if isinstance(entry, Mapping) else entry
    try:
        return semaphore_value(limit, f"REACTOR_LIMITS[{name!r}]")
    except ValueError as exc:
        raise ConfigurationError(str(exc), setting="LIMITS") from exc


def semaphore_limit(name: str, *, client: Any = None, prefix: str | None = None) -> int:
    """The effective limit of the named semaphore limit: the override, else settings."""
    override = override_for("semaphore", name, client=client, prefix=prefix)
    if override is not None:
        try:
            return semaphore_value(override.value.get("limit"), f"override of {name!r}")
        except ValueError:
            pass  # validated when it was set; a hand-written bad value falls back to settings
    return configured_semaphore_limit(name)


def rate_limit_config(
    name: str, configured: Mapping[str, Any], *, client: Any = None, prefix: str | None = None
) -> Mapping[str, Any]:
    """The effective ``REACTOR_RATE_LIMITS[name]`` entry: the override's windows over the
    configured entry (whose other keys, such as ``strategy``, stay), else the entry."""
    override = override_for("rate_limit", name, client=client, prefix=prefix)
    if override is None:
        return configured
    windows = {k: v for k, v in override.value.items() if k in ("limit", "period", "limits")}
    if isinstance(windows.get("limits"), Mapping):
        windows["limits"] = period_keys(windows["limits"])
    rest = {k: v for k, v in configured.items() if k not in ("limit", "period", "limits")}
    return {**rest, **windows}


def period_keys(limits: Mapping[str, Any]) -> dict[str | float, Any]:
    """``{"second": 3, "90": 10}`` → ``{"second": 3, 90.0: 10}``: a window of a number of
    seconds travels through JSON as a string key."""
    found: dict[str | float, Any] = {}
    for period, limit in limits.items():
        try:
            found[float(period)] = limit
        except (TypeError, ValueError):
            found[period] = limit
    return found
