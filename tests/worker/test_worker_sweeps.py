"""The workers sweep by themselves: no beat, no cron, no manual ``reactor_sweep``.

An execution left ``running`` by a delivery that vanished (its message gone with it) is
re-enqueued by the sweep timer every worker process runs (``engine.sweeper``), once its
heartbeat is older than ``REACTOR_SWEEP_AFTER``; and the holds a parked execution keeps are
renewed by the same sweep for as long as it stays parked. On every pool: a threads-pool worker
(its tasks run in the worker's own process, and Celery sends it no ``worker_process_init``, as
a gevent or eventlet one) never swept before ``reactor_app.tasks`` started its timer on
``worker_ready``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.engine.dispatch import _worker_context
from reactor_app.engine.state import ExecutionState
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from reactor_app.testing import coordination_state
from tests.worker.helpers import wait_until
from tests.worker.reactors import records
from tests.worker.trust_reactors import StrandReactor

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = {"REACTOR_SWEEP_INTERVAL": 1, "REACTOR_SWEEP_AFTER": 2}


@pytest.fixture(scope="module", params=["prefork", "threads", "solo", "gevent", "eventlet"])
def celery_worker_pool(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_an_execution_whose_delivery_vanished_is_swept_by_the_workers(worker: Any) -> None:
    stale = timezone.now() - timedelta(seconds=30)
    execution = Execution.objects.start(
        reactor=StrandReactor.path(),
        inputs={"key": "w1"},
        status=ExecutionStatus.RUNNING,
        started_at=stale,
        heartbeat_at=stale,
        context=_worker_context(),
    )
    # no task was ever sent: only a sweep can bring it back
    result = execution.wait(timeout=30)
    assert result.ok, result.error
    assert [r["execution"] for r in records("strand")] == [str(execution.id)]


def test_the_holds_a_parked_execution_keeps_are_renewed_while_it_stays_parked(
    worker: Any,
) -> None:
    parked = Execution.objects.start(
        reactor=StrandReactor.path(),
        inputs={"key": "w2"},
        status=ExecutionStatus.PARKED,
        heartbeat_at=timezone.now(),
        context=_worker_context(),
    )
    owner = str(parked.id)  # a root: holds are owned by its own id
    kept = Coordinator().admit([LockClaim("kept:w2", ttl=3)], Holder(owner=owner))
    assert isinstance(kept, Admitted)
    token = kept.holds[0].token
    state = ExecutionState.from_json(parked.context)
    state.continuation.kept_holds = [{"primitive": "lock", "key": "kept:w2", "token": token}]
    # due back in an hour (a long rate-limit wait, say): far beyond the lock's 3 s ttl
    state.continuation.requeue_at = (timezone.now() + timedelta(hours=1)).isoformat()
    Execution.objects.filter(pk=parked.pk).update(context=state.to_json())

    wait_until(
        lambda: (coordination_state().lock("kept:w2").ttl or 0) > 60,
        15,
        message="no sweep lengthened the parked execution's kept lock",
    )
    lock = coordination_state().lock("kept:w2")
    assert lock.owner == owner and lock.token == token
