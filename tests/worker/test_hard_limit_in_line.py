"""A hard time limit in a step of a strict ordered line: the step runs again in its place.

A delivery stopped by Celery's hard time limit has not failed its step: the next delivery runs
the step again (the at-least-once rule of a killed delivery, docs/operations.md, "Lost
deliveries"). But the stop is not always a clean kill. On prefork the pool first sends the
child SIGTERM, which raises ``SystemExit`` in it, and only 0.1 s later SIGKILL; on gevent the
limit is a ``gevent.Timeout`` raised in the task. Either unwinds through the engine, whose
step gate then released its holds as a *failure* — and a failure ends a strict ordered line.
The step's own next run was then skipped (``ordered_lock_chain_failed``), the run reported
succeeded without it, and every later execution skipped the step too, until an operator reset
the line. Now such a stop releases the step as a retry: its place in line stays, the next
delivery runs it there, and the line goes on. A line the whole run stands in
(``DeadlyOrderedRun``) was failed the same way by its reactor-level gate; the run now keeps
what it holds there, as a killed delivery would, for the delivery that takes over.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from reactor_app.status import ExecutionStatus
from tests.worker.lost_delivery_reactors import DeadlyOrdered, DeadlyOrderedRun, ran
from tests.worker.promise_reactors import ledger
from tests.worker.test_hard_time_limit import WORKER_SETTINGS as HARD_LIMIT_SETTINGS
from tests.worker.test_lost_deliveries import settled

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = dict(HARD_LIMIT_SETTINGS)

ALL_DONE = ["enter:s0", "do:s0", "enter:s1", "do:s1", "enter:s2", "do:s2"]


@pytest.fixture(scope="module", params=["prefork", "gevent"])
def celery_worker_pool(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("reactor", [DeadlyOrdered, DeadlyOrderedRun], ids=["step", "reactor"])
def test_a_run_stopped_by_the_hard_limit_goes_on_in_its_place_and_the_line_goes_on(
    worker: Any, reactor: Any
) -> None:
    line = uuid.uuid4().hex
    order = uuid.uuid4().hex
    # s1's first run sleeps past the 2 s hard limit; its second is quick
    execution = reactor.run_async(
        order=order, plan={"line": line, "s1": {"sleep": 4, "sleep_runs": 1}}
    )
    ended = settled(execution, within=120)

    assert ended.status == ExecutionStatus.SUCCEEDED, ended.error
    assert ran(order, "s1", "body") == 2
    assert ledger(order) == ["enter:s0", "do:s0", "enter:s1", *ALL_DONE[2:]]
    # the next execution in the same line runs its s1: the line did not fail
    after = uuid.uuid4().hex
    next_one = reactor.run_async(order=after, plan={"line": line})
    assert settled(next_one, within=60).status == ExecutionStatus.SUCCEEDED
    assert ledger(after) == ALL_DONE
