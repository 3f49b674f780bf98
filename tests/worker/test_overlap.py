"""SC-005 at scale: the worker path protects a step exactly like the in-process path.

The in-process suite runs 4 processes x 50 executions on one account; here 40 executions on one
account go through two real worker processes, parking and waking on the key, and their
``charge`` bodies (recorded enter/exit times) never overlap while ``audit`` bodies do — on a
prefork worker (two processes), on a threads-pool worker (two threads of one process), and on
gevent and eventlet workers (two greenlets of one process).
"""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app.testing import assert_not_locked
from tests.worker.helpers import overlapping
from tests.worker.reactors import PaymentReactor, records

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# Many waiters on one key: parks are routine here, so the ceiling must not end them.
WORKER_SETTINGS = {"REACTOR_CONTENTION_CEILING": 500, "REACTOR_CONTENTION_BACKOFF": [0.2, 1.0]}

EXECUTIONS = 40


#: pools whose tasks are greenlets of one process: two executions' holds in one process
GREEN = ("gevent", "eventlet")


@pytest.fixture(scope="module", params=["prefork", "threads", *GREEN])
def celery_worker_pool(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def celery_worker_settings(celery_worker_pool: str) -> dict[str, Any]:
    """On a green pool with the Redis broker, Celery fetches new messages only every 2 s once
    a prefetch of one per slot is used up (a plain Celery task shows it too): a larger
    prefetch keeps the slots busy (docs/operations.md, "Pools")."""
    if celery_worker_pool in GREEN:
        return {**WORKER_SETTINGS, "CELERY_WORKER_PREFETCH_MULTIPLIER": 4}
    return dict(WORKER_SETTINGS)


def test_forty_executions_on_one_key_through_two_workers_never_overlap(worker: Any) -> None:
    executions = [PaymentReactor.run_async(account_id=77, hold=0.02) for _ in range(EXECUTIONS)]
    for execution in executions:
        assert execution.wait(timeout=240).ok

    charges = records("charge")
    assert len(charges) == EXECUTIONS
    assert overlapping(charges) == []
    audits = records("audit")
    assert len({(r["pid"], r["thread"]) for r in audits}) >= 2, "only one worker slot ran"
    assert overlapping(audits) != []  # the unlocked step did run concurrently
    tokens = [r["token"] for r in sorted(charges, key=lambda r: r["start"])]
    assert tokens == sorted(tokens) and len(set(tokens)) == EXECUTIONS
    assert_not_locked("acct:77")
