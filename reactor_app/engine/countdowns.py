"""Countdowns a broker can hold: a message due later than ``REACTOR_LONGEST_COUNTDOWN`` is sent
in hops.

A Celery worker holds a message sent with a countdown unacknowledged until it is due, and
brokers bound how long a delivery may stay unacknowledged. RabbitMQ closes the channel of a
consumer that has not acknowledged a delivery within its ``consumer_timeout`` (30 minutes by
default), and the Celery worker stops with an unrecoverable ``PreconditionFailed``; the Redis
transport hands a message left unacknowledged for its ``visibility_timeout`` (1 hour by
default) to another worker, which holds it again, over and over. A ``run_after`` of a day (the
``django.tasks`` backend, ``run_async``), a debounce's quiet period or its ``max_wait``, a park
until a rate limit's window of hours frees a slot can be far longer than either.

So ``engine.enqueueing.enqueue`` sends a countdown longer than ``REACTOR_LONGEST_COUNTDOWN``
(10 minutes by default) as that longest countdown (``capped``), with the time it is due (wall
clock, seconds since the epoch, as Celery's own ETA) in the ``reactor_due`` header and the
message's priority in ``reactor_priority``. The delivery of such a message while it is still
early (``engine.delivery.deliver``) sends it on for what is left, capped again, without reading
the row or taking the claim, and ends; the last hop carries no due time and runs when it
arrives. Nothing is lost with a hop the broker refuses: a deferred row's heartbeat is its due
time, so the sweeper sends it once it is due (after ``REACTOR_SWEEP_AFTER``), as it does a lost
first message.

A worker of an earlier version ignores the header and runs such a message when it arrives, at
the capped countdown: deploy the workers first (CHANGELOG). docs/operations.md, "Long
countdowns", has the operator's view.
"""

from __future__ import annotations

import math
import time
from typing import Any

from reactor_app.conf import reactor_settings

#: the message header holding a capped message's due time (seconds since the epoch)
DUE_HEADER = "reactor_due"
#: the message header holding a capped message's priority (Celery's scale), for its next hop
PRIORITY_HEADER = "reactor_priority"


def capped(countdown: float | None, priority: int | None) -> tuple[float | None, dict[str, Any]]:
    """The countdown to send and the headers that go with it: ``countdown`` itself when the
    broker may hold it, else ``REACTOR_LONGEST_COUNTDOWN`` with the due time (and the
    message's ``priority``) in headers."""
    if countdown is None:  # most messages (a new execution, a wake): no setting read
        return None, {}
    longest = reactor_settings.LONGEST_COUNTDOWN
    if countdown <= longest:
        return countdown, {}
    headers: dict[str, Any] = {DUE_HEADER: time.time() + countdown}
    if priority is not None:
        headers[PRIORITY_HEADER] = priority
    return longest, headers


def due_from(value: Any) -> float | None:
    """The due time a message's ``reactor_due`` header gives, or None (no header, or a value
    that is not a finite number: such a message runs when it arrives)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if number and math.isfinite(value) else None


def priority_from(value: Any) -> int | None:
    """The priority a message's ``reactor_priority`` header gives, or None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def left_until(due: float | None) -> float:
    """Seconds until ``due`` (0 when it is past, or None)."""
    return max(due - time.time(), 0.0) if due is not None else 0.0
