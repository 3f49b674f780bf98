"""A reactor-level ordered lock orders worker runs by enqueue, not by delivery
(docs/design.md §1.4)."""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app.testing import assert_ordered_lock
from tests.worker.reactors import EnqueueOrderedReactor, records

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = {"REACTOR_CONTENTION_BACKOFF": [0.5, 2.0]}


def test_runs_pass_the_line_in_enqueue_order(worker: Any) -> None:
    executions = [EnqueueOrderedReactor.run_async(key="k", n=n) for n in range(8)]
    # The position is taken at enqueue, before any worker saw the run.
    nonces = [execution.context["ordered"][""]["nonce"] for execution in executions]
    assert nonces == sorted(nonces) and len(set(nonces)) == 8
    for execution in executions:
        assert execution.wait(timeout=90).ok
    assert [entry["n"] for entry in records("passed")] == list(range(8))
    assert_ordered_lock("queue:k", last_completed=nonces[-1], first_failed=None)


def test_a_run_async_rolled_back_with_its_transaction_leaves_no_position_in_the_line() -> None:
    """The position is taken once the execution's row is committed: a ``run_async`` inside a
    transaction that rolls back must not leave a position nobody will run — every later run
    of the line would wait a whole poison-pill timeout for it."""
    from django.db import transaction

    from reactor_app.coordination.ordered_lock import ordered_state
    from reactor_app.models import Execution

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        EnqueueOrderedReactor.run_async(key="rolled-back", n=0)
        raise Rollback
    assert not Execution.objects.filter(reactor=EnqueueOrderedReactor.path()).exists()
    line = ordered_state("queue:rolled-back")
    # no epoch: nothing was ever assigned on this line
    assert (line.epoch, line.next, line.positions) == (None, 1, [])


def test_a_run_the_sweeper_took_first_keeps_no_second_position() -> None:
    """The position is taken after the commit; if the sweeper took the committed row first (a
    caller's transaction older than ``REACTOR_SWEEP_AFTER`` leaves it stale at once), that run
    is already on its way and takes its own position: the enqueue step must not add another,
    nor overwrite the row's state."""
    from django.db import transaction
    from django.utils import timezone

    from reactor_app.coordination.ordered_lock import ordered_state
    from reactor_app.models import Execution

    with transaction.atomic():
        execution = EnqueueOrderedReactor.run_async(key="swept", n=0)
        # what the sweeper's compare-and-set on the heartbeat does when it wins
        Execution.objects.filter(pk=execution.pk).update(heartbeat_at=timezone.now())
    line = ordered_state("queue:swept")
    assert (line.epoch, line.next, line.positions) == (None, 1, [])
    assert not Execution.objects.get(pk=execution.pk).context["ordered"]
