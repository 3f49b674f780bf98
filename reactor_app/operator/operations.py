"""Operator verbs on live coordination state, each leaving an audit event.

* ``force_release`` — free a lock (or a semaphore's slots) whatever its nesting. The former
  holder is not asked: its next renewal finds the hold gone and reports ``LeaseLost``. Parked
  waiters the release pops are re-enqueued at once, as after an ordinary release.
* ``ordered_skip`` — complete the head of an ordered lock's line without running it.
* ``ordered_reset`` — start a new epoch of an ordered lock (empty line, failure cleared).

Every verb records a ``CoordinationEvent`` (``forced_release``, ``ordered_skipped``,
``ordered_reset``) attributed to the hold or position it acted on, with the operator's name in
``detail["by"]``, so the key's timeline and the execution's events show who intervened.
Permission checks belong to the callers (the admin views); nothing here knows about requests.

Each verb checks its texts (the key, the owner, the operator's name) before it touches Redis:
one that Redis cannot take as a key (a lone surrogate) or the audit row cannot store (that, or
a NUL character) is a ``ValueError`` saying which, and nothing is changed — not a release
whose audit row then fails to be written, nor redis-py's ``UnicodeEncodeError``. The admin's
forms cannot send such text; a caller of these functions can.
"""

from __future__ import annotations

import logging
from typing import Any

from reactor_app.coordination import primitives
from reactor_app.coordination import state as coordination_state
from reactor_app.coordination.admission import Coordinator
from reactor_app.engine.enqueueing import wake
from reactor_app.models import Execution
from reactor_app.status import CoordinationEventKind
from reactor_app.storable import text_problem
from reactor_app.tracking import record_coordination

logger = logging.getLogger(__name__)


def _execution_id(value: str | None) -> str | None:
    """The id when that execution row exists (the event's foreign key), else None.

    A hold may name an execution of another database (a shared Redis) or a ``Step.call``
    owner; the event still records the owner, just without the link.
    """
    if not value:
        return None
    try:
        return value if Execution.objects.filter(pk=value).exists() else None
    except Exception:  # not a UUID
        return None


def _check_texts(**texts: str | None) -> None:
    """``ValueError`` naming the first of ``texts`` (None: not given) that Redis or the audit
    row cannot hold (see the module docstring); before anything is changed."""
    for what, text in texts.items():
        if text is None:
            continue
        if not isinstance(text, str):
            raise ValueError(f"{what} must be text, got {type(text).__name__}")
        problem = text_problem(text)
        if problem:
            raise ValueError(
                f"{what} holds {problem}, which the audit event cannot store: nothing was changed"
            )


def _holders_before(primitive: str, key: str, owner: str | None) -> dict[str, dict[str, Any]]:
    """``owner -> attribution`` of the holds about to be removed (read before removing)."""
    holders = primitives.holding(primitive).holders(key)
    return {o: info for o, info in holders.items() if not owner or o == owner}


def force_release(primitive: str, key: str, owner: str | None = None, *, by: str) -> dict[str, Any]:
    """Remove the hold(s) on ``key`` (one owner's, or every holder's when ``owner`` is None).

    Returns ``{"released": [owners], "woken": [waiter ids]}``; an empty ``released`` means
    nothing was held (by that owner). Raises ``ValueError`` for primitives that cannot be
    force-released or for text it cannot act on (``_check_texts``), and
    ``CoordinationUnavailable`` when Redis cannot be reached.
    """
    _check_texts(key=key, owner=owner, by=by)
    if not primitives.holds(primitive):
        raise ValueError(
            f"only locks and semaphores can be force-released, not {primitive!r} "
            "(an ordered lock is skipped or reset instead)"
        )
    before = _holders_before(primitive, key, owner)
    outcome = Coordinator().force_release(primitive, key, owner or None)
    if outcome.woken:
        # the freed key is granted to its head waiter: re-enqueue it now, whatever happens to
        # the audit rows below (a failed write raises), not at its backoff
        wake(outcome.woken)
    for released_owner in outcome.released:
        holder = before.get(released_owner, {})
        record_coordination(
            CoordinationEventKind.FORCED_RELEASE,
            primitive=primitive,
            key=key,
            owner=released_owner,
            step=holder.get("step"),
            reactor=holder.get("reactor"),
            execution_id=_execution_id(holder.get("execution")),
            token=holder.get("token"),
            durable=True,  # an operator action's audit row exists when the action returns
            by=by,
            count=holder.get("count"),
            woken=outcome.woken,
        )
    logger.warning(
        "%s force-released %s %r held by %s", by, primitive, key, ", ".join(outcome.released)
    )
    return {"released": list(outcome.released), "woken": list(outcome.woken)}


def ordered_skip(key: str, *, by: str) -> dict[str, Any]:
    """Pass over the head of ``key``'s line. Returns ``{"skipped": nonce or None}``."""
    _check_texts(key=key, by=by)
    head = Coordinator().peek(key)
    skipped = Coordinator().skip(key)
    if skipped is not None:
        same = head is not None and head.nonce == skipped
        record_coordination(
            CoordinationEventKind.ORDERED_SKIPPED,
            primitive="ordered_lock",
            key=key,
            owner=(head.owner or "") if same and head else "",
            step=head.step if same and head else None,
            reactor=head.reactor if same and head else None,
            execution_id=_execution_id(head.execution if same and head else None),
            durable=True,
            by=by,
            nonce=skipped,
        )
        logger.warning("%s skipped position %s of ordered lock %r", by, skipped, key)
    return {"skipped": skipped}


def ordered_reset(key: str, *, by: str) -> dict[str, Any]:
    """Start a new epoch of ``key``'s line. Returns ``{"epoch": ..., "previous": {...}}``."""
    _check_texts(key=key, by=by)
    previous = coordination_state.ordered_state(key)
    epoch = Coordinator().reset(key)
    summary = {
        "epoch": previous.epoch,
        "next": previous.next,
        "last_completed": previous.last_completed,
        "first_failed": previous.first_failed,
        "waiting": [p.nonce for p in previous.positions],
    }
    record_coordination(
        CoordinationEventKind.ORDERED_RESET,
        primitive="ordered_lock",
        key=key,
        durable=True,
        by=by,
        epoch=epoch,
        previous=summary,
    )
    logger.warning("%s reset ordered lock %r (new epoch %s)", by, key, epoch)
    return {"epoch": epoch, "previous": summary}
