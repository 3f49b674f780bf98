"""Testing helpers for projects that use ``reactor_app`` (and for its own test suite).

* ``coordination_state()`` — live coordination state (locks, semaphores, rate limits, period
  marks, ordered locks) read through the coordination layer's own readers;
* ``assert_*`` — assertions on that state whose failure messages describe what was found;
* ``reactor_app.testing.pytest_plugin`` — fixtures for a real Redis, a clean key space per
  test and a real Celery worker process (``pytest_plugins = [...]`` in your conftest);
* ``within_freshness_bound(read)`` — read tracking rows (written behind the work) once they are
  there, within the freshness bound;
* ``WorkerProcess`` — start and stop a real ``celery -A <app> worker`` from Python;
* ``History`` — record each coordination operation's invocation and outcome (``ok``, ``fail``
  or ``info``: unknown) from threads and processes; ``check(operations, model)`` decides
  whether one legal sequential order explains them (a linearizability checker) against
  ``MutexModel``, ``SemaphoreModel``, ``FencedRegisterModel``, ``RateLimitModel`` or
  ``PeriodModel``, and shows a minimal violating sub-history when none does; a ``ClockWatch``
  around the recording tells it how far the server's clock stepped ahead meanwhile.

Everything here reads; nothing changes coordination state.
"""

from __future__ import annotations

from reactor_app.testing.assertions import (
    assert_held_by_step,
    assert_locked,
    assert_not_locked,
    assert_ordered_lock,
    assert_period_marked,
    assert_period_not_marked,
    assert_rate_limit_count,
    assert_semaphore_count,
    assert_token_greater,
)
from reactor_app.testing.clock_watch import ClockWatch
from reactor_app.testing.history import History, Operation, load, operations
from reactor_app.testing.linearizability import CheckResult, Violation, check, linearizable
from reactor_app.testing.sequential_models import (
    FencedRegisterModel,
    MutexModel,
    PeriodModel,
    RateLimitModel,
    SemaphoreModel,
)
from reactor_app.testing.state import (
    CoordinationState,
    LockState,
    OrderedLockState,
    SemaphoreHolder,
    SemaphoreState,
    coordination_state,
)
from reactor_app.testing.tracking import within_freshness_bound
from reactor_app.testing.workers import WorkerProcess

__all__ = [
    "CheckResult",
    "ClockWatch",
    "CoordinationState",
    "FencedRegisterModel",
    "History",
    "LockState",
    "MutexModel",
    "Operation",
    "OrderedLockState",
    "PeriodModel",
    "RateLimitModel",
    "SemaphoreHolder",
    "SemaphoreModel",
    "SemaphoreState",
    "Violation",
    "WorkerProcess",
    "assert_held_by_step",
    "assert_locked",
    "assert_not_locked",
    "assert_ordered_lock",
    "assert_period_marked",
    "assert_period_not_marked",
    "assert_rate_limit_count",
    "assert_semaphore_count",
    "assert_token_greater",
    "check",
    "coordination_state",
    "linearizable",
    "load",
    "operations",
    "within_freshness_bound",
]
