"""Celery's time limits on an eventlet worker: none is enforced; the engine's slicing still is.

Celery's eventlet pool runs a task with no timeout at all: unlike the gevent pool (a
``gevent.Timeout`` for the hard limit, ``test_gevent_time_limit``) and prefork (both limits),
it neither raises the soft limit nor enforces the hard one. So on eventlet a body longer than
``CELERY_TASK_TIME_LIMIT`` runs to its end — nothing cuts it, so no delivery is lost and the
lost-delivery guard never fails it. What does hold is the engine's own slice of a delivery
(``engine.time_slice``), which reads the configured limit whatever the pool: a delivery that
has used half of it starts no further step, and the run goes on in a fresh delivery
(docs/operations.md, "Celery time limits").

With ``REACTOR_LOST_DELIVERY_LIMIT`` at 1, a single delivery lost at ``s1`` would fail the run
with ``DeliveryLost``: the body past the limit finishing, and the run succeeding, shows that
nothing cut it.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from reactor_app.status import ExecutionStatus
from tests.worker.lost_delivery_reactors import DeadlyLocked, ran
from tests.worker.promise_reactors import ledger
from tests.worker.test_lost_deliveries import settled
from tests.worker.test_time_limits import deliveries

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

HARD = 2
WORKER_SETTINGS = {
    "CELERY_TASK_TIME_LIMIT": HARD,
    "CELERY_TASK_SOFT_TIME_LIMIT": None,
    "REACTOR_SWEEP_INTERVAL": 1,
    "REACTOR_SWEEP_AFTER": 3,
    "REACTOR_EXECUTION_CLAIM_TTL": 1,
    "REACTOR_LOST_DELIVERY_LIMIT": 1,
}


@pytest.fixture(scope="module")
def celery_worker_pool() -> str:
    return "eventlet"


def test_a_body_past_the_hard_time_limit_on_eventlet_runs_to_its_end(worker: Any) -> None:
    order = uuid.uuid4().hex
    execution = DeadlyLocked.run_async(order=order, plan={"s1": {"sleep": HARD + 1.5}})
    ended = settled(execution, within=60)

    assert ended.status == ExecutionStatus.SUCCEEDED, ended.error
    # the locked body ran once, past the limit, and was not cut: no loss, nothing undone
    assert ran(order, "s1", "body") == 1
    assert ledger(order) == ["enter:s0", "do:s0", "enter:s1", "do:s1", "enter:s2", "do:s2"]
    log = worker.process.read_log()
    assert "Hard time limit" not in log and "TimeLimitExceeded" not in log
    # the engine's slice held: the delivery that ran s1 had used its share, so s2 ran in
    # the next one
    assert deliveries(worker, execution) >= 2
