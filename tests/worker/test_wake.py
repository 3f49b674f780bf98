"""Wake on release: a parked execution is re-enqueued by the release that frees its key.

The worker's park backoff is long (20 s base: at least 10 s with jitter), so every parked
waiter that runs sooner was woken by a release, not by its backoff requeue. The test asserts
that only; the measured release → start latencies are printed (``-s``) for the record.
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest
from django.utils import timezone

from reactor_app.models import ContentionState, CoordinationEvent, StepRun
from reactor_app.status import CoordinationEventKind, StepRunKind, StepRunStatus
from reactor_app.write_behind import flush
from tests.worker.helpers import overlapping, wait_until
from tests.worker.reactors import PaymentReactor, records

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# parked waiters are under test (the in-delivery wait has its own tests: test_worker_wait)
WORKER_SETTINGS = {
    "REACTOR_CONTENTION_BACKOFF": [20.0, 40.0],
    "REACTOR_CONTENTION_CEILING": 20,
    "REACTOR_WORKER_WAIT": 0,
}


def test_parked_waiters_are_woken_by_the_release(worker: Any) -> None:
    started = timezone.now()
    # held long enough that every waiter reaches the gate and parks while it is held, on a
    # loaded machine too (a waiter arriving once the chain has ended would just run)
    first = PaymentReactor.run_async(account_id=11, hold=3.0)
    wait_until(lambda: records("enter:charge"), 20, message="the first never entered charge")
    waiters = [PaymentReactor.run_async(account_id=11, hold=0.3) for _ in range(4)]
    wait_until(
        lambda: ContentionState.objects.filter(execution__in=waiters).count() == 4,
        20,
        message="the waiters did not all park",
    )

    for execution in [first, *waiters]:
        assert execution.wait(timeout=60).ok
    elapsed = (timezone.now() - started).total_seconds()

    charges = sorted(records("charge"), key=lambda r: r["start"])
    assert len(charges) == 5 and overlapping(charges) == []
    latencies_ms = []
    for execution in waiters:
        state = ContentionState.objects.get(execution=execution, step="charge")
        ran = StepRun.objects.get(
            execution=execution,
            step="charge",
            kind=StepRunKind.RUN,
            status=StepRunStatus.SUCCEEDED,
        )
        # resumed before its backoff requeue would have fired
        assert ran.started_at < state.next_attempt_at, (ran.started_at, state.next_attempt_at)
        mine = next(c for c in charges if c["execution"] == str(execution.id))
        previous = max((c for c in charges if c["end"] <= mine["start"]), key=lambda c: c["end"])
        latencies_ms.append((mine["start"] - previous["end"]) / 1e6)
    released = CoordinationEvent.objects.filter(
        key="acct:11", kind=CoordinationEventKind.RELEASED
    ).count()
    assert released == 5
    print(
        f"\nwake on release: release -> next body start, ms: "
        f"{sorted(round(x, 1) for x in latencies_ms)}; median "
        f"{statistics.median(latencies_ms):.1f} ms; chain of 5 in {elapsed:.2f}s"
    )


def test_a_release_hands_the_key_past_a_parked_waiter_that_was_cancelled(worker: Any) -> None:
    """A parked execution cancelled while it waits must not be handed the key when the holder
    releases it: a grant to it would keep the key idle for ``HANDOFF_GRANT_MS`` (3 s), nobody
    coming, while the next waiter sleeps until its 10-20 s backoff. Its cancel's delivery
    leaves the line (``engine.leftovers.leave_lines``); a finished entry left anyway would be
    passed over by the release (``engine.finished_waiters``, checked at the gate in
    tests/concurrency/test_waiter_identity.py). The ``released`` event names whom the freed
    key went to: the second waiter, first in line once the cancelled one is gone."""
    first = PaymentReactor.run_async(account_id=13, hold=3.0)
    wait_until(lambda: records("enter:charge"), 20, message="the first never entered charge")
    gone = PaymentReactor.run_async(account_id=13, hold=0.1)
    wait_until(
        lambda: ContentionState.objects.filter(execution=gone).exists(),
        20,
        message="the first waiter did not park",
    )
    survivor = PaymentReactor.run_async(account_id=13, hold=0.1)
    wait_until(
        lambda: ContentionState.objects.filter(execution=survivor).exists(),
        20,
        message="the second waiter did not park",
    )
    gone.cancel("not needed")
    assert gone.wait(timeout=30).status == "cancelled"
    assert not records("charge"), "the first released the key before the cancel ended"

    assert first.wait(timeout=30).ok
    assert survivor.wait(timeout=60).ok
    flush()
    released = CoordinationEvent.objects.get(
        key="acct:13", kind=CoordinationEventKind.RELEASED, execution_id=first.id
    )
    assert released.detail.get("handed_to") == [str(survivor.id)], released.detail
