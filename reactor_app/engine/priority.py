"""An execution's priority (``run_async(priority=...)``, ``run(priority=...)``): checked at the
call, kept in its state so that every later delivery and child waits with it, and sent as the
Celery message's priority on the broker's own scale (docs/coordination.md, "Priority and fair
sharing")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from celery import current_app

from reactor_app.engine.state import ExecutionState
from reactor_app.exceptions import InputValidationError

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor

#: broker URL schemes of kombu's Redis transport (priority 0 served first)
REDIS_SCHEMES = frozenset({"redis", "rediss", "sentinel"})


def in_process_context(priority: int | None, inputs_shown: str | None = None) -> dict[str, Any]:
    """The starting state of a ``run(priority=...)`` in the caller's process: the priority
    its units wait with (``ExecutionRun.priority``), and every child it dispatches; and
    whether its row keeps only a display copy of its inputs (``Origin.inputs_shown``)."""
    state = ExecutionState()
    state.origin.priority = priority
    state.origin.inputs_shown = inputs_shown
    return state.to_json()


#: the range of ``run_async(priority=...)`` (the ``django.tasks`` API's), higher first
MIN_PRIORITY, MAX_PRIORITY = -100, 100


def checked_priority(
    reactor: type[Reactor], priority: Any, *, call: str = "run_async"
) -> int | None:
    """``priority`` if it is an int in ``MIN_PRIORITY..MAX_PRIORITY`` (None: the default, 0),
    else ``InputValidationError`` — raised at the ``call``, before anything is stored."""
    if priority is None:
        return None
    if isinstance(priority, bool) or not isinstance(priority, int):
        problem = f"must be an int, got {priority!r}"
    elif not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        problem = f"must be between {MIN_PRIORITY} and {MAX_PRIORITY}, got {priority}"
    else:
        return priority
    raise InputValidationError(
        f"{call} of {reactor.__qualname__}: priority {problem}",
        reactor=reactor.path(),
        step=None,
        field_errors={"priority": problem},
    )


def celery_priority(priority: int) -> int:
    """A priority (-100 lowest to 100 highest) as the Celery message's, on the broker's own 0
    to 9 scale: 9 is the highest on AMQP, but the Redis transport serves its priority lists
    from 0 up, so there 0 is the highest."""
    step = round((priority - MIN_PRIORITY) * 9 / (MAX_PRIORITY - MIN_PRIORITY))
    scheme = urlsplit(str(current_app.conf.broker_url or "")).scheme
    return 9 - step if scheme.split("+")[0] in REDIS_SCHEMES else step


def message_priority(priority: int | None) -> int | None:
    """The Celery message priority of an execution of ``priority`` (its state's), or None for
    the default: such a message is sent as every other execution's is."""
    return celery_priority(priority) if priority else None


def stored_message_priority(context: dict[str, Any] | None) -> int | None:
    """``message_priority`` of an execution whose stored state is ``context``: for the messages
    sent for a row read back (a sweep's, a requeue after an outage, a cancel's), so a broker
    that orders by priority serves each of them as it served the first."""
    return message_priority(ExecutionState.peek(context).origin.priority)
