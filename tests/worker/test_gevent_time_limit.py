"""Celery's hard time limit on a gevent worker: the same end as on prefork.

On the prefork pool the hard limit ends the pool process (``test_hard_time_limit``: SIGTERM,
then SIGKILL 0.1 s later). A gevent
worker runs its tasks as greenlets of one process, and there the hard limit is a
``gevent.Timeout`` raised *inside* the task at its next switch — a ``BaseException`` that
unwinds through the engine's own code (its ``finally`` blocks, a gate's exit with the holds it
releases) rather than a process that vanishes. Celery then acknowledges the message as failed,
as on prefork, and only the sweep sends the execution again. The run must end the same way:
the body cut at each of ``REACTOR_LOST_DELIVERY_LIMIT`` deliveries, then failed with
``DeliveryLost``, compensated, and the earlier step undone — under a step-level lock too,
which each cut delivery gives back as the timeout unwinds through its gate, and which nothing
keeps once the run has ended (docs/operations.md, "Celery time limits"). The same when the
timeout lands inside a PostgreSQL statement, out of the driver's wait; the worker then runs its
next execution as usual.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection

from reactor_app.models import CoordinationEvent
from reactor_app.status import ExecutionStatus
from reactor_app.testing import coordination_state
from tests.worker.helpers import wait_until
from tests.worker.lost_delivery_reactors import DeadlyLocked, DeadlyReactor
from tests.worker.test_hard_time_limit import LIMIT, assert_failed_at_the_limit
from tests.worker.test_hard_time_limit import WORKER_SETTINGS as HARD_LIMIT_SETTINGS
from tests.worker.test_lost_deliveries import settled

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = dict(HARD_LIMIT_SETTINGS)


@pytest.fixture(scope="module")
def celery_worker_pool() -> str:
    return "gevent"


@pytest.mark.parametrize("reactor", [DeadlyReactor, DeadlyLocked], ids=["plain", "locked"])
def test_a_body_past_the_hard_time_limit_on_gevent_fails_after_the_limit_of_cuts(
    worker: Any, reactor: Any
) -> None:
    order = uuid.uuid4().hex
    execution = reactor.run_async(order=order, plan={"s1": {"sleep": 4}})
    ended = settled(execution, within=120)

    assert_failed_at_the_limit(ended, order)
    # gevent's pool reports the limit it raised in the task (prefork's kills the process)
    assert worker.process.read_log().count("Hard time limit") >= LIMIT
    left = [h for h in coordination_state().holds() if h["execution"] == str(execution.id)]
    assert left == [], left
    if reactor is DeadlyLocked:
        # each cut delivery gave its lock back as the timeout unwound through the step's gate,
        # as a retry: the delivery stopped, the step did not fail (a failure would end a strict
        # ordered line: test_hard_limit_in_line)
        cut = [("acquired", False), ("released", "retry")] * LIMIT
        wait_until(lambda: len(lock_events(execution)) >= len(cut), 10, interval=0.2)
        assert lock_events(execution)[: len(cut)] == cut, lock_events(execution)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a statement gevent can leave")
def test_a_hard_time_limit_inside_a_database_statement_on_gevent_leaves_the_worker_sound(
    worker: Any,
) -> None:
    """The timeout lands while the body waits on PostgreSQL (``pg_sleep``), so it unwinds out
    of the driver mid-statement, with the step's lock held. The run still ends as on prefork,
    and the worker's next execution, in the same process, runs on a sound connection.
    (SQLite's statements run in C without a switch: gevent cannot cut one.)"""
    order = uuid.uuid4().hex
    execution = DeadlyLocked.run_async(order=order, plan={"s1": {"query": 4}})
    ended = settled(execution, within=120)

    assert_failed_at_the_limit(ended, order)
    cut = [("acquired", False), ("released", "retry")] * LIMIT
    wait_until(lambda: len(lock_events(execution)) >= len(cut), 10, interval=0.2)
    assert lock_events(execution)[: len(cut)] == cut, lock_events(execution)
    after = DeadlyReactor.run_async(order=uuid.uuid4().hex, plan={})
    assert settled(after, within=60).status == ExecutionStatus.SUCCEEDED


def lock_events(execution: Any) -> list[tuple[str, Any]]:
    """The execution's lock events, oldest first: an acquisition with whether it re-entered, a
    release with its outcome (the history is written behind the work, so it may lag)."""
    events = CoordinationEvent.objects.filter(execution_id=execution.id, primitive="lock")
    return [
        (kind, detail.get("reentrant") if kind == "acquired" else detail.get("outcome"))
        for kind, detail in events.order_by("id").values_list("kind", "detail")
    ]
