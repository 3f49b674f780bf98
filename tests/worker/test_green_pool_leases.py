"""A body that computes without yielding, on a green pool: its lease lapses, and the step fails.

A step's holds are renewed while its body runs, by the renewal thread (``coordination.renewal``).
On prefork that is an OS thread: a body computing for seconds still lets it run (the
interpreter hands the GIL over every few milliseconds), and the lease holds. On a gevent (or
eventlet) worker, threads are greenlets of the one process, and a body that never yields — no
I/O, no sleep — starves them: no renewal goes out, and the lock's lease runs out in Redis
while the body still runs, as under a stalled process. The engine cannot stop a body it does
not run; what it must do is not report that body's work as done under the lock.

Here the computing comes last in the body, so nothing yields between it and the check after
the body, and the renewer never gets to find the lease gone. That check reads the renewal's
clock (``Renewal.raise_if_lost``: no renewal for a whole lease is a lost lease, whether or not
the renewer said so), so the step fails with ``LeaseLost``, is compensated, and the steps
before it are undone (docs/operations.md, "Pools"). Without the clock check, the run
succeeded on gevent.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from reactor_app.models import CoordinationEvent
from reactor_app.status import ExecutionStatus
from tests.worker.lost_delivery_reactors import SHORT_LEASE, DeadlyShortLease
from tests.worker.promise_reactors import ledger
from tests.worker.test_lost_deliveries import settled

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

#: the body computes for this long: well past its lease, and past the renewals a third of it
SPIN = SHORT_LEASE * 2.5


@pytest.fixture(scope="module", params=["prefork", "gevent", "eventlet"])
def celery_worker_pool(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_body_computing_past_its_lease_keeps_it_on_prefork_and_loses_it_on_green_pools(
    worker: Any, celery_worker_pool: str
) -> None:
    order = uuid.uuid4().hex
    execution = DeadlyShortLease.run_async(order=order, plan={"s1": {"spin": SPIN}})
    ended = settled(execution, within=60)
    kinds = list(
        CoordinationEvent.objects.filter(execution_id=execution.id, primitive="lock")
        .order_by("id")
        .values_list("kind", flat=True)
    )

    if celery_worker_pool == "prefork":
        # the renewal thread ran beside the body: the lease held, the run succeeded
        assert ended.status == ExecutionStatus.SUCCEEDED, ended.error
        assert ledger(order) == ["enter:s0", "do:s0", "enter:s1", "do:s1", "enter:s2", "do:s2"]
        assert "lease_lost" not in kinds, kinds
        return
    # on a green pool nothing renewed it: the body's work is not taken as done under the lock
    assert ended.status == ExecutionStatus.FAILED, ended.error
    assert (ended.error["type"], ended.error["step"]) == ("LeaseLost", "s1"), ended.error
    assert ledger(order) == ["enter:s0", "do:s0", "enter:s1", "do:s1", "compensate:s1", "undo:s0"]
    assert "lease_lost" in kinds, kinds
