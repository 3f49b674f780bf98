"""Operator verbs on live limits: override a named limit, remove the override, and the view of
every named limit with its effective value and origin (docs/coordination.md, "Live limits").

``set_override`` / ``remove_override`` change the ``LimitOverride`` row and record a
``limit_changed`` ``CoordinationEvent`` (who, old → new, reason) in one transaction; once it
commits, the whole set of overrides is published to Redis (``coordination.live_limits``),
where every process reads it within ``REFRESH_SECONDS``. Executions parked on the limit are
then woken, once every process has the new value (``WAKE_AFTER``): a raised limit admits
them then, not when their backoff runs out or a holder releases. A semaphore limit that is
not raised wakes nobody (each would only park again, and parks count towards
``REACTOR_CONTENTION_CEILING``); one raised by n slots wakes the parked among the first n of
each key's line, head first — the admission scripts give the new slots to the line's head
in its order whoever asks (``lua/_semaphore.lua``), so the rest would only park again.
Permission checks belong to the callers (the admin views, the API); nothing here knows about
requests.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from reactor_app import bounds
from reactor_app.conf import reactor_settings
from reactor_app.coordination import live_limits
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import WAITING_PREFIX, SemaphoreClaim
from reactor_app.coordination.rate_limit import named_config, windows_from
from reactor_app.dsl.declarations import SemaphoreDeclaration
from reactor_app.dsl.registry import lookup
from reactor_app.engine.enqueueing import enqueue_quietly
from reactor_app.exceptions import (
    ConfigurationError,
    CoordinationUnavailable,
    ReactorNotRegistered,
)
from reactor_app.models import ContentionState, LimitOverride
from reactor_app.status import CoordinationEventKind
from reactor_app.storable import text_problem
from reactor_app.tracking import record_coordination

logger = logging.getLogger(__name__)

PRIMITIVES = live_limits.PRIMITIVES
#: seconds after a change that the executions parked on the limit are woken: by then every
#: process has read the new value (``live_limits.REFRESH_SECONDS``), with a little margin
WAKE_AFTER = live_limits.REFRESH_SECONDS + 0.05
#: the largest limit an operator may type: the largest a declaration may give
#: (``reactor_app.bounds``), which the scripts keep exact and write back for operators (a
#: semaphore's ``\0limit`` field) as the same whole number
MAX_LIMIT = bounds.LARGEST_COUNT


class InvalidLimit(ValueError):
    """The operator's input is not a limit (the message says what is expected)."""


# -- parsing what an operator types ----------------------------------------------------------

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


# -- the view --------------------------------------------------------------------------------


@dataclass(frozen=True)
class NamedLimit:
    """One named limit as the Coordination page shows it."""

    primitive: str
    name: str
    configured: dict[str, Any] | None  # None: settings no longer name it
    override: LimitOverride | None
    #: what the processes read from Redis (None: no override published)
    published: live_limits.Override | None

    @property
    def effective(self) -> dict[str, Any] | None:
        if self.published is not None:
            return self.published.value
        return self.configured

    @property
    def origin(self) -> str:
        if self.published is not None:
            at = datetime.fromtimestamp(self.published.at or 0, tz=UTC)
            return f"override by {self.published.by or 'unknown'} at {at:%Y-%m-%d %H:%M:%S} UTC"
        return "settings"

    @property
    def in_sync(self) -> bool:
        """The published override is the database's (False: a publish failed, or Redis lost
        the hash; the next change or the workers' sweep publishes it again)."""
        if self.override is None:
            return self.published is None
        return self.published is not None and self.published.value == self.override.value

    def as_dict(self) -> dict[str, Any]:
        return {
            "primitive": self.primitive,
            "name": self.name,
            "settings": self.configured,
            "effective": self.effective,
            "effective_text": describe(self.primitive, self.effective),
            "settings_text": describe(self.primitive, self.configured),
            "origin": self.origin,
            "overridden": self.override is not None,
            "reason": self.override.reason if self.override else "",
            "in_sync": self.in_sync,
        }


def named_limits() -> list[NamedLimit]:
    """Every named limit of settings and every override, with what is in force. Raises
    ``CoordinationUnavailable`` when Redis (the published values) cannot be read."""
    published = live_limits.overrides()
    rows = LimitOverride.objects.current()
    names: set[tuple[str, str]] = set(rows)
    names |= {("semaphore", n) for n in reactor_settings.LIMITS}
    names |= {("rate_limit", n) for n in reactor_settings.RATE_LIMITS}
    found = []
    for primitive, name in sorted(names):
        try:
            configured: dict[str, Any] | None = configured_value(primitive, name)
        except InvalidLimit:
            configured = None
        found.append(
            NamedLimit(
                primitive=primitive,
                name=name,
                configured=configured,
                override=rows.get((primitive, name)),
                published=published.get(live_limits.field_name(primitive, name)),
            )
        )
    return found


# -- the verbs -------------------------------------------------------------------------------


def set_override(
    primitive: str, name: str, value: Any, *, by: str, reason: str = ""
) -> dict[str, Any]:
    """Override ``name`` with ``value`` (operator text, see ``parse_value``, or an already
    parsed dict). Returns ``{"old", "new", "woken"}``; ``InvalidLimit`` for bad input,
    ``CoordinationUnavailable`` when the change is saved but could not be published."""
    _check_who_and_why(by, reason)
    text = describe(primitive, value) if isinstance(value, Mapping) else value
    parsed = parse_value(primitive, name, text)
    with transaction.atomic():
        # an upsert: concurrent first overrides of one name both succeed, the last one wins
        old = LimitOverride.objects.put(
            primitive, name, value=parsed, reason=reason, set_by=by, set_at=timezone.now()
        )
        _audit(primitive, name, "set", old, parsed, by=by, reason=reason)
    was = old if old is not None else _configured_or_none(primitive, name)
    woken = _publish_and_wake(
        primitive,
        name,
        wake=_may_admit_more(primitive, was, parsed),
        raised_by=_raised_by(primitive, was, parsed),
    )
    logger.warning("%s overrode %s limit %r: %s -> %s", by, primitive, name, old, parsed)
    return {"old": old, "new": parsed, "woken": woken}


def remove_override(primitive: str, name: str, *, by: str, reason: str = "") -> dict[str, Any]:
    """Back to settings. Returns ``{"old", "new", "woken"}`` (``old`` None: there was none)."""
    _check_who_and_why(by, reason)
    if primitive not in PRIMITIVES:
        raise InvalidLimit(f"only {' and '.join(PRIMITIVES)} limits can be overridden")
    with transaction.atomic():
        row = LimitOverride.objects.locked(primitive, name)
        if row is None:
            return {"old": None, "new": None, "woken": []}
        old = row.value
        row.delete()
        try:
            configured: dict[str, Any] | None = configured_value(primitive, name)
        except InvalidLimit:
            configured = None
        _audit(primitive, name, "removed", old, configured, by=by, reason=reason)
    woken = _publish_and_wake(
        primitive,
        name,
        wake=_may_admit_more(primitive, old, configured),
        raised_by=_raised_by(primitive, old, configured),
    )
    logger.warning("%s removed the override of %s limit %r (was %s)", by, primitive, name, old)
    return {"old": old, "new": configured, "woken": woken}


def _check_who_and_why(by: Any, reason: Any) -> None:
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


def republish() -> None:
    """Publish the database's overrides to Redis (after a lost hash, or a failed publish)."""
    LimitOverride.objects.publish()


def _audit(
    primitive: str,
    name: str,
    action: str,
    old: Any,
    new: Any,
    *,
    by: str,
    reason: str,
) -> None:
    try:
        settings_value: dict[str, Any] | None = configured_value(primitive, name)
    except InvalidLimit:
        settings_value = None
    record_coordination(
        CoordinationEventKind.LIMIT_CHANGED,
        primitive=primitive,
        key=name,
        durable=True,  # an operator action's audit row exists when the action returns
        by=by,
        action=action,
        old=old,
        new=new,
        reason=reason,
        settings=settings_value,
    )


def _configured_or_none(primitive: str, name: str) -> dict[str, Any] | None:
    try:
        return configured_value(primitive, name)
    except InvalidLimit:
        return None


def _may_admit_more(
    primitive: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
) -> bool:
    """Whether a change from ``old`` to ``new`` can admit an execution parked on the limit.
    A semaphore limit that is not raised cannot: its parked executions, woken, would only be
    refused and parked again — each park counting towards ``REACTOR_CONTENTION_CEILING``. A
    rate limit's windows do not compare simply: any change wakes them."""
    if primitive != "semaphore":
        return True
    if new is None:
        return False  # settings no longer name it: nothing is admitted under it
    try:
        return old is None or int(new["limit"]) > int(old["limit"])
    except (KeyError, TypeError, ValueError):
        return True


def _raised_by(
    primitive: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
) -> int | None:
    """How many slots a semaphore limit gained (None: unknown — a rate limit, no old value)."""
    if primitive != "semaphore" or old is None or new is None:
        return None
    try:
        return max(int(new["limit"]) - int(old["limit"]), 0)
    except (KeyError, TypeError, ValueError):
        return None


def _publish_and_wake(
    primitive: str, name: str, *, wake: bool = True, raised_by: int | None = None
) -> list[str]:
    """Publish the committed overrides, then (``wake``) wake what is parked on the limit:
    every execution parked on a rate limit; on a semaphore raised by ``raised_by`` slots,
    those parked among the first ``raised_by`` of each key's line, head first (and any not in
    a line at all). The first of them to ask grants the new slots to the head of the line —
    itself, and whoever else is there — and re-enqueues the others it granted
    (``lua/_semaphore.lua``, ``semaphore_fill``): waking the whole line would crowd the
    workers with deliveries that can only park again, ahead of the heads' own."""
    try:
        republish()
    except CoordinationUnavailable:
        logger.exception("limit override of %r saved but not published", name)
        raise
    if not wake:
        return []
    if primitive == "semaphore":
        parked = _heads_first(_parked_by_key(primitive, name), raised_by)
    else:
        parked = parked_on(primitive, name)
    for execution_id in parked:
        # once every process's copy has been read again (a delivery woken at once could
        # still be refused by a worker's old copy, and park again for its whole backoff)
        enqueue_quietly(execution_id, countdown=WAKE_AFTER)
    return parked


def parked_on(primitive: str, name: str) -> list[str]:
    """Ids of the executions parked on the named limit: on a rate limit, those parked on its
    key (the name); on a semaphore, those parked on a semaphore declared with the name (or
    whose reactor this process cannot load: waking one too many only parks it again)."""
    return [execution_id for _, execution_id in _parked_by_key(primitive, name)]


def _parked_by_key(primitive: str, name: str) -> list[tuple[str, str]]:
    """``(key, execution id)`` of what ``parked_on`` lists."""
    if primitive == "rate_limit":
        rows = ContentionState.objects.active().matching(primitive=primitive, key=name)
        return [(row.key, str(row.execution_id)) for row in rows]
    uses: dict[str, bool | set[str]] = {}
    found = []
    for row in ContentionState.objects.active().matching(primitive="semaphore"):
        path = row.execution.reactor
        if path not in uses:
            uses[path] = _steps_using(path, name)
        steps = uses[path]
        if steps is True or (isinstance(steps, set) and (row.step or "") in steps):
            found.append((row.key, str(row.execution_id)))
    return found


def _heads_first(parked: list[tuple[str, str]], raised_by: int | None) -> list[str]:
    """The parked executions to wake for a raised semaphore, in line order (see
    ``_publish_and_wake``): the parked among the first ``raised_by`` waiters of each key's
    line (every parked one in line order when ``raised_by`` is unknown), then those in no
    line at all (a lost registration: woken, each asks again). A line that cannot be read
    wakes all of its key's."""
    by_key: dict[str, list[str]] = {}
    for key, execution_id in parked:
        by_key.setdefault(key, []).append(execution_id)
    coordinator = Coordinator()
    found: list[str] = []
    for key, ids in by_key.items():
        try:
            line = coordinator.waiters(SemaphoreClaim(key, limit=1))
        except CoordinationUnavailable:
            found += ids
            continue
        if raised_by is None:
            found += [w for w in line if w in ids]
        else:
            # a parked-form entry is an execution id: one still parking (its row not written
            # yet) is woken too, so the head of the line is never left to its backoff
            found += [w for w in line[:raised_by] if not w.startswith(WAITING_PREFIX)]
        found += [w for w in ids if w not in line and w not in found]
    return found


def _steps_using(path: str, name: str) -> bool | set[str]:
    """The steps (``""``: the reactor itself) of reactor ``path`` whose semaphore is declared
    with ``limit=name``; True when the reactor cannot be loaded here."""
    try:
        reactor = lookup(path)
    except ReactorNotRegistered:
        return True
    owners = [("", reactor.declarations())]
    owners += [(step, spec.declarations) for step, spec in reactor.steps.items()]
    return {
        step
        for step, declarations in owners
        if isinstance(
            declaration := declarations.by_primitive.get("semaphore"), SemaphoreDeclaration
        )
        and declaration.limit == name
    }
