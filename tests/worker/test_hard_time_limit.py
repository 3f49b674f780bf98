"""A body longer than Celery's hard time limit, with no soft limit to stop it cleanly, fails
after ``REACTOR_LOST_DELIVERY_LIMIT`` kills (docs/operations.md, "Celery time limits" and
"Lost deliveries").

A real prefork worker with ``CELERY_TASK_TIME_LIMIT = 2`` and no soft limit: the pool kills the
process running the 4 s body and acknowledges the message as failed, so nothing is sent again
until the sweep finds the execution's heartbeat stale. Before the lost-delivery guard, the
sweep sent it again, the body was killed again, and so on without end (the execution stayed
``running``, its first step never undone); now the third kill at that step is the last.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from reactor_app.status import ExecutionStatus
from tests.worker.lost_delivery_reactors import DeadlyReactor, ran
from tests.worker.promise_reactors import ledger
from tests.worker.test_lost_deliveries import settled

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

LIMIT = 3
WORKER_SETTINGS = {
    "CELERY_TASK_TIME_LIMIT": 2,
    "CELERY_TASK_SOFT_TIME_LIMIT": None,
    "REACTOR_SWEEP_INTERVAL": 1,
    "REACTOR_SWEEP_AFTER": 3,
    "REACTOR_EXECUTION_CLAIM_TTL": 1,
    "REACTOR_LOST_DELIVERY_LIMIT": LIMIT,
}


def test_a_body_past_the_hard_time_limit_fails_after_the_limit_of_kills(worker: Any) -> None:
    order = uuid.uuid4().hex
    execution = DeadlyReactor.run_async(order=order, plan={"s1": {"sleep": 4}})
    # each kill costs the limit, then the sweep's wait for a stale heartbeat
    ended = settled(execution, within=120)

    assert_failed_at_the_limit(ended, order)
    # killed by the pool: Celery's own report of each of them
    assert worker.process.read_log().count("TimeLimitExceeded") >= LIMIT


def assert_failed_at_the_limit(ended: Any, order: str) -> None:
    """``s1`` ran ``LIMIT`` times, then failed with ``DeliveryLost``; its compensate ran and
    ``s0`` was undone."""
    assert ended.status == ExecutionStatus.FAILED, ended.error
    assert (ended.error["type"], ended.error["step"]) == ("DeliveryLost", "s1")
    assert ran(order, "s1", "body") == LIMIT
    assert ledger(order) == [
        "enter:s0",
        "do:s0",
        *["enter:s1"] * LIMIT,
        "compensate:s1",
        "undo:s0",
    ]
