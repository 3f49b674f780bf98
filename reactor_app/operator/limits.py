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
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone

from reactor_app import isolation
from reactor_app.conf import reactor_settings
from reactor_app.coordination import live_limits
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import WAITING_PREFIX, SemaphoreClaim
from reactor_app.dsl.declarations import SemaphoreDeclaration
from reactor_app.dsl.registry import lookup
from reactor_app.engine.enqueueing import enqueue_quietly
from reactor_app.exceptions import (
    CoordinationUnavailable,
    ReactorNotRegistered,
)
from reactor_app.models import ContentionState, LimitOverride
from reactor_app.operator.limit_input import (
    InvalidLimit,
    check_who_and_why,
    configured_value,
    describe,
    parse_value,
)
from reactor_app.status import CoordinationEventKind
from reactor_app.tracking import record_coordination

logger = logging.getLogger(__name__)

PRIMITIVES = live_limits.PRIMITIVES
#: seconds after a change that the executions parked on the limit are woken: by then every
#: process has read the new value (``live_limits.REFRESH_SECONDS``), with a little margin
WAKE_AFTER = live_limits.REFRESH_SECONDS + 0.05
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
    check_who_and_why(by, reason)
    text = describe(primitive, value) if isinstance(value, Mapping) else value
    parsed = parse_value(primitive, name, text)
    with isolation.atomic():
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
    check_who_and_why(by, reason)
    if primitive not in PRIMITIVES:
        raise InvalidLimit(f"only {' and '.join(PRIMITIVES)} limits can be overridden")
    with isolation.atomic():
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
