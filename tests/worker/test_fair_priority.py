"""Fair sharing (``fair_by``) and priority on real workers, one Redis server.

The scenarios (``tests.worker.fair_priority_reactors``) hold the key while every execution
parks in its line, then release it: from there the workers and the admission scripts alone
decide the order, which each body records into Redis as it is admitted. Nothing is timed.
The in-delivery wait is off (``REACTOR_WORKER_WAIT = 0``) and the park backoff long, so every
execution runs because a release granted it its turn. ``REACTOR_FAIR_BACKLOG`` sizes tenant
``a``'s backlog: 30 here, the issue's 200 in ``make soak`` (and in ``bench/fair_share.py``).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.worker.fair_priority_reactors import (
    FairWholeReactor,
    UrgentStepReactor,
    fair_backlog,
    priority_line,
)

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

BACKLOG = int(os.environ.get("REACTOR_FAIR_BACKLOG", "30"))
#: the park backoff (at least half of it, with jitter) outlasts the parking of the whole
#: backlog: a backoff requeue firing meanwhile would crowd the workers just as the releases
#: wake the head of the line, and a woken delivery that comes later than its grant (3 s) loses
#: its turn to whoever asks next. Still the safety net for such a lapsed grant.
BACKOFF = float(max(60, BACKLOG))

WORKER_SETTINGS = {
    "REACTOR_CONTENTION_BACKOFF": [BACKOFF, 2 * BACKOFF],
    "REACTOR_CONTENTION_CEILING": 50,
    "REACTOR_WORKER_WAIT": 0,
}


def test_a_small_tenant_behind_a_large_backlog_finishes_within_its_first_turns(
    worker: Any,
) -> None:
    """Tenant ``a`` queues the backlog, tenant ``b`` 5 behind it, limit 2: ``b``'s 5 are
    admitted within the first ~15 admissions (turn by turn: a, b, a, b, ...), not after
    ``a``'s backlog."""
    line, order = fair_backlog(BACKLOG, timeout=4 * BACKOFF)

    assert sorted(order) == sorted(line)
    # the line as parked is turn by turn — one a and one b a turn while b has executions
    # in it (which of the two first is the tie-break of equal turns: the waiter ids)
    turns = [sorted(label[0] for label in line[index : index + 2]) for index in (0, 2, 4, 6, 8)]
    assert turns == [["a", "b"]] * 5, line[:10]
    last_b = max(index for index, label in enumerate(order) if label.startswith("b"))
    print(f"\nfair_by: b's 5 done within the first {last_b + 1} of {len(order)} admissions")
    # granted within the first 10; two run at a time, so a body may record a little after
    # the one granted next
    assert last_b < 15, order[:15]


def test_higher_priority_executions_parked_behind_others_are_admitted_first(
    worker: Any,
) -> None:
    """Six at the default priority, then three at priority 50, all parked on one lock: the
    three run first, then the six — each group in its order in the line."""
    line, order = priority_line(low=6, high=3)

    assert order == line
    assert [label.split("-")[0] for label in order] == ["high"] * 3 + ["low"] * 6


def test_fair_turns_at_reactor_level(worker: Any) -> None:
    """The same semaphore around a whole reactor: a, b, a, b, ... while b waits."""
    line, order = fair_backlog(20, reactor=FairWholeReactor)
    turns = [sorted(label[0] for label in line[index : index + 2]) for index in (0, 2, 4, 6, 8)]
    assert turns == [["a", "b"]] * 5, line[:10]
    last_b = max(index for index, label in enumerate(order) if label.startswith("b"))
    assert last_b < 15, order[:15]


def test_priority_at_step_level(worker: Any) -> None:
    """A step-level lock: the execution's priority orders its step's wait too."""
    line, order = priority_line(low=4, high=2, reactor=UrgentStepReactor)
    assert order == line
    assert [label.split("-")[0] for label in order] == ["high"] * 2 + ["low"] * 4
