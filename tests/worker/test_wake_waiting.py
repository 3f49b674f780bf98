"""Wake on release with the in-delivery wait on (``REACTOR_WORKER_WAIT``, the default 1 s).

A parked execution woken by a release is granted the key as ``<id>``; its delivery asks as
``wait:<id>``, as every worker delivery asks first. That ask is admitted by the grant (one
waiter, two forms: docs/coordination.md, "One entry per waiter"): the woken execution runs
milliseconds after the release, not after its in-process wait ran out — which used to add
``REACTOR_WORKER_WAIT`` to every parked hand-off. The park backoff is long (20 s), so every
waiter that runs sooner was woken by a release. The release → next body start latencies are
printed (``-s``) for the record; the admission on the first ask itself is asserted at the gate
(tests/concurrency/test_waiter_identity.py).
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import LockClaim
from reactor_app.models import ContentionState, CoordinationEvent, StepRun
from reactor_app.status import CoordinationEventKind, StepRunKind, StepRunStatus
from reactor_app.write_behind import flush
from tests.worker.helpers import overlapping, wait_until
from tests.worker.reactors import PaymentReactor, records

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = {
    "REACTOR_CONTENTION_BACKOFF": [20.0, 40.0],
    "REACTOR_CONTENTION_CEILING": 20,
    "REACTOR_WORKER_WAIT": 1.0,
}


def test_woken_parked_waiters_run_without_waiting_out_the_in_delivery_wait(worker: Any) -> None:
    first = PaymentReactor.run_async(account_id=12, hold=4.0)
    wait_until(lambda: records("enter:charge"), 20, message="the first never entered charge")
    waiters = [PaymentReactor.run_async(account_id=12, hold=0.2) for _ in range(3)]
    wait_until(
        lambda: ContentionState.objects.filter(execution__in=waiters).count() == 3,
        30,
        message="the waiters did not all park (their in-delivery wait is 1 s, the hold 4 s)",
    )
    for execution in [first, *waiters]:
        assert execution.wait(timeout=90).ok
    flush()
    charges = sorted(records("charge"), key=lambda r: r["start"])
    assert len(charges) == 4 and overlapping(charges) == []
    latencies_ms = []
    for execution in waiters:
        state = ContentionState.objects.get(execution=execution, step="charge")
        ran = StepRun.objects.get(
            execution=execution,
            step="charge",
            kind=StepRunKind.RUN,
            status=StepRunStatus.SUCCEEDED,
        )
        # resumed before its backoff requeue would have fired: woken by a release
        assert ran.started_at < state.next_attempt_at, (ran.started_at, state.next_attempt_at)
        mine = next(c for c in charges if c["execution"] == str(execution.id))
        previous = max((c for c in charges if c["end"] <= mine["start"]), key=lambda c: c["end"])
        latencies_ms.append((mine["start"] - previous["end"]) / 1e6)
    # nobody is left in the key's line
    assert Coordinator().waiters(LockClaim("acct:12")) == []
    # Each waiter parked once and its woken delivery was admitted on its first ask: a refusal
    # by its own grant (the key granted to "<id>", asked for as "wait:<id>") would have sent
    # it into a second wait and a second park.
    parks = CoordinationEvent.objects.filter(
        execution__in=waiters, kind=CoordinationEventKind.PARKED
    )
    assert sorted(str(e.execution_id) for e in parks) == sorted(str(w.id) for w in waiters)
    assert [ContentionState.objects.get(execution=w, step="charge").attempts for w in waiters] == [
        1,
        1,
        1,
    ]
    print(
        f"\nwake on release, in-delivery wait on: release -> next body start, ms: "
        f"{sorted(round(x, 1) for x in latencies_ms)}; median "
        f"{statistics.median(latencies_ms):.1f} ms"
    )
