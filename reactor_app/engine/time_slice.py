"""A worker delivery's share of its Celery task's time limit (docs/operations.md, "Celery time
limits").

A project's ``CELERY_TASK_SOFT_TIME_LIMIT`` (or ``_TIME_LIMIT``) bounds one Celery task, and a
delivery of ``reactor_app.run_execution`` runs as many steps as it can. Without a slice, a
workflow of short steps whose delivery outlasted the limit had the step running at that moment
fail with ``SoftTimeLimitExceeded`` — and the whole saga was rolled back for a time limit no
step exceeded. So:

* **At a unit boundary** (before a step, a map element, a rollback hook) a delivery that has
  used half of its limit, and ran a body already, starts nothing more: the execution parks
  with a requeue at once (``StepOutcome.retry_in = 0``, nothing counted as contention or as an
  attempt; a reactor-level lock stays held, as across any park) and goes on in a fresh
  delivery. A rollback stops as a killed delivery would (``DeliveryTimeUp``): the next one goes
  on from the hooks it counted (``engine.rollback_progress``).
* **A body cut off by the soft limit** after an earlier body of the same delivery did not
  have the whole limit: it is not its failure. The delivery ends the same way and the step
  runs again in the next one, where it starts first — the at-least-once rule of a body whose
  delivery was killed (docs/reactors-and-steps.md).
* **A body cut off although it started first** had the whole limit: that attempt failed
  (``TaskTimeLimitExceeded``, retryable by the step's policy; a retry, even one due at once,
  starts a new delivery).
* **An undo or compensate cut off** after other work runs again in the next delivery; one that
  started its delivery is reported as not undone, as a hook that raised.
* **An in-delivery wait** for a contended key (``REACTOR_WORKER_WAIT``) is cut short at the
  delivery's share: the execution parks as after any wait.
* **Anywhere else** (the engine's own code — also between a body and its checkpoint, in a
  ``where=`` predicate and in a declaration's key, cost or ``fair_by`` function, which are no
  body's failure; ``limit_behind`` finds the limit inside the error such a function's failure
  is reported as): the delivery ends as if its worker had been killed there
  (``DeliveryTimeUp``), and is sent again at once; the next delivery takes over from the last
  checkpoint as after a crash.
* **In the caller's process** (``Reactor.run()`` inside a Celery task of the caller's) there
  is no slice: ``SoftTimeLimitExceeded`` is an error like any other (``stops_delivery``).

The prefork pool enforces both of Celery's limits, gevent the hard one, eventlet, solo and
threads neither; a configured limit slices deliveries on every pool, which costs a requeue per
slice and nothing else (``tests/worker/test_eventlet_time_limit.py``: on eventlet a body past
the hard limit runs to its end, and the slice still holds).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

__all__ = [
    "SHARE",
    "DeliveryTimeUp",
    "SoftTimeLimitExceeded",
    "TimeSlice",
    "cut_off",
    "limit_behind",
    "stops_delivery",
    "task_limits",
    "time_slice",
]

#: the share of its time limit after which a delivery starts no further unit of work
SHARE = 0.5


class DeliveryTimeUp(Exception):
    """The Celery task's soft time limit ran out outside a step body: the delivery stops where
    it is, like a killed one, and the execution is sent again at once (``engine.delivery``)."""


@dataclass
class TimeSlice:
    """The clock of one delivery against its task's time limit."""

    #: seconds: the earlier of the task's soft and hard limits
    limit: float
    #: the soft limit, named in errors (None: only a hard limit is set)
    soft: float | None = None
    started: float = field(default_factory=time.monotonic)
    #: a body (or hook) of this delivery has returned or raised: the next unit is not its first
    worked: bool = False

    @property
    def named(self) -> float:
        """The limit an error names: the soft one (what cuts a body off), else the hard one."""
        return self.soft or self.limit

    def left(self) -> float:
        """Seconds until this delivery has used its share (0 once it has)."""
        return max(0.0, self.limit * SHARE - (time.monotonic() - self.started))

    def spent(self) -> bool:
        """Past its share, with a unit of work done: start no further unit in this delivery."""
        return self.worked and time.monotonic() - self.started >= self.limit * SHARE


def time_slice(hard: float | None, soft: float | None) -> TimeSlice | None:
    """The slice of a delivery whose task has these limits (None: no limit, no slice)."""
    limits = [value for value in (hard, soft) if value]
    if not limits:
        return None
    return TimeSlice(limit=float(min(limits)), soft=float(soft) if soft else None)


def task_limits(task: Any) -> tuple[float | None, float | None]:
    """``(hard, soft)`` as Celery's worker applies them to this task's request: the message's
    own limits, else the task's, else the app's ``task_time_limit``/``task_soft_time_limit``."""
    request_limits = getattr(task.request, "timelimit", None) or (None, None)
    hard, soft = request_limits
    conf = task.app.conf
    hard = hard or getattr(task, "time_limit", None) or conf.task_time_limit
    soft = soft or getattr(task, "soft_time_limit", None) or conf.task_soft_time_limit
    return _seconds(hard), _seconds(soft)


def _seconds(value: Any) -> float | None:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 else None


def cut_off(exc: BaseException) -> bool:
    """Whether ``exc`` is Celery's soft time limit running out."""
    return isinstance(exc, SoftTimeLimitExceeded)


def stops_delivery(clock: TimeSlice | None, exc: BaseException) -> bool:
    """Whether ``exc`` ends a worker delivery for lack of time (``clock``: the delivery's
    slice). In the caller's process (no slice) Celery's exception, raised in a task of the
    caller's own, is an error like any other: nothing would resume a run left where it is."""
    return isinstance(exc, DeliveryTimeUp) or (clock is not None and cut_off(exc))


def limit_behind(clock: TimeSlice | None, error: BaseException) -> BaseException | None:
    """The task's time limit ``error`` was raised from, when it ends the delivery, else None:
    a declaration's key, cost or ``fair_by`` function is user code the DSL reports the failure
    of as ``CoordinationKeyError`` (``RateLimitCostError``) — a soft limit landing in it is
    not that function's failure, and must not fail the step for good."""
    cause = error.__cause__
    return cause if cause is not None and stops_delivery(clock, cause) else None
