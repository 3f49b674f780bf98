"""Places in line of executions waiting in the database: kept alive by the sweep.

An ordered position is passed over once it has been silent for ``poison_pill_timeout``: that
is the bound on how long a dead head can stall its line. A running head heartbeats from the
renewal thread and an in-process waiter's every attempt is a sign of life, but an execution
waiting in the database shows none: a ``run_async`` whose position was taken at enqueue sits
in the broker's queue, a parked execution waits for its requeue. A queue that backed up for
longer than the timeout (a deploy, a worker outage, a burst bigger than the fleet) let the
first of those deliveries to reach its admission pass every earlier position over, and the
line ran out of the order it promises — enqueue order, for a reactor-level lock.

So each sweep (``engine.sweeper``) vouches for them: the positions an execution keeps in its
state (``ExecutionState.ordered``) are heartbeated on its behalf while it is

* pending and due (a run deferred with ``run_after`` is not waited for: past the timeout its
  place is passed over, and it takes a new one when it runs), or
* parked.

A running execution is left out (its delivery heartbeats; a vanished delivery is re-enqueued
by the same sweep after ``REACTOR_SWEEP_AFTER``), and so is one that ended: a head it left is
completed by ``engine.stranded_positions`` or passed over at the pill. The heartbeat names the
exact position (nonce and epoch): one completed, passed over or reset meanwhile is not
revived. The line's lifetime (the declaration's ``ttl``) is left as it is.

The bound this gives: a waiting position is silent for at most one sweep interval
(``REACTOR_SWEEP_INTERVAL``, or the external sweep's cadence) plus a sweep's own duration. A
``poison_pill_timeout`` shorter than that can still pass one over; its execution then takes a
new place at the back of the line and records an ``ordered_skipped`` event
(``by: "poison_pill"``, ``engine.gate``). docs/coordination.md, "Losing a place in line".
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db.models import Q
from django.utils import timezone
from redis.exceptions import RedisError

from reactor_app.coordination import ordered_lock
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import OrderedPosition
from reactor_app.engine.state import ExecutionState
from reactor_app.exceptions import ReactorError
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus

logger = logging.getLogger(__name__)


def keep_waiting_positions(now: datetime | None = None) -> int:
    """Heartbeat the ordered positions of executions queued (pending and due) or parked, on
    their behalf (module docstring). Returns how many positions were still in line."""
    now = now or timezone.now()
    waiting = (
        Execution.objects.filter(
            Q(status=ExecutionStatus.PENDING, heartbeat_at__lte=now)
            | Q(status=ExecutionStatus.PARKED),
            context__has_key="ordered",
        )
        .exclude(context__ordered={})
        .only("id", "context")
    )
    coordinator = Coordinator()
    kept = 0
    for execution in waiting.iterator():
        for slot, entry in ExecutionState.peek(execution.context).ordered.items():
            try:
                position = OrderedPosition(nonce=int(entry["nonce"]), epoch=int(entry["epoch"]))
                kept += ordered_lock.vouch(
                    str(entry["key"]),
                    position,
                    client=coordinator.client,
                    prefix=coordinator.prefix,
                )
            except (KeyError, TypeError, ValueError):
                logger.warning("execution %s keeps an unreadable position %r", execution.id, slot)
            except (ReactorError, RedisError):
                logger.warning(
                    "could not keep the place of execution %s in line %r",
                    execution.id,
                    entry.get("key"),
                    exc_info=True,
                )
    return kept
