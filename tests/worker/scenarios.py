"""Worker scenarios shared by the scale-out modules (a Redis Cluster for coordination,
RabbitMQ as broker): each module starts its own worker with its topology and runs these.

* ``contention_parks_then_completes`` — SC-004: the contended execution parks, then completes
  with zero compensations.
* ``forty_on_one_key_never_overlap`` — SC-005 at scale: 40 executions on one key through two
  worker processes, zero overlaps among ``charge`` bodies, fencing tokens increasing.
* ``parked_waiters_are_woken`` — park → wake: with a long park backoff, a waiter that runs
  sooner was re-enqueued by the release (wake-ups go through the coordination Redis and the
  broker's ordinary enqueue, never a broker-specific feature).
* ``a_long_countdown_arrives_in_hops`` — a ``run_after`` longer than
  ``REACTOR_LONGEST_COUNTDOWN`` (the module sets 1 s for the worker and this process) is sent
  on by each early delivery (``engine.countdowns``; the due time travels in a message header,
  which each broker must carry) and runs once, not before it is due.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

from django.utils import timezone

from reactor_app.models import ContentionState, CoordinationEvent, Execution, StepRun
from reactor_app.status import CoordinationEventKind, StepRunKind, StepRunStatus
from reactor_app.testing import assert_not_locked
from tests.worker import task_functions as tasks
from tests.worker.helpers import finished, overlapping, wait_until
from tests.worker.reactors import PaymentReactor, records

EXECUTIONS = 40


def contention_parks_then_completes(account: int) -> list[Execution]:
    first = PaymentReactor.run_async(account_id=account, hold=1.0)
    wait_until(lambda: records("enter:charge"), 30, message="the first never entered charge")
    second = PaymentReactor.run_async(account_id=account, hold=0.05)
    assert first.wait(timeout=60).ok
    assert second.wait(timeout=60).ok

    contention = ContentionState.objects.get(execution=second, step="charge")
    assert contention.primitive == "lock" and contention.key == f"acct:{account}"
    assert contention.attempts >= 1
    kinds = set(CoordinationEvent.objects.filter(execution=second).values_list("kind", flat=True))
    assert {CoordinationEventKind.PARKED, CoordinationEventKind.RESUMED} <= kinds
    assert not StepRun.objects.exclude(kind=StepRunKind.RUN).exists()  # zero rollbacks
    assert records("rollback") == []
    return [first, second]


def forty_on_one_key_never_overlap(account: int) -> list[Execution]:
    executions = [
        PaymentReactor.run_async(account_id=account, hold=0.02) for _ in range(EXECUTIONS)
    ]
    for execution in executions:
        assert execution.wait(timeout=240).ok

    charges = records("charge")
    assert len(charges) == EXECUTIONS
    assert overlapping(charges) == []
    audits = records("audit")
    assert len({r["pid"] for r in audits}) >= 2, "only one worker process ran"
    tokens = [r["token"] for r in sorted(charges, key=lambda r: r["start"])]
    assert tokens == sorted(tokens) and len(set(tokens)) == EXECUTIONS
    assert_not_locked(f"acct:{account}")
    return executions


def parked_waiters_are_woken(account: int, waiters: int = 3) -> list[Execution]:
    # held long enough that every waiter parks while it is held, on a loaded machine too
    first = PaymentReactor.run_async(account_id=account, hold=3.0)
    wait_until(lambda: records("enter:charge"), 30, message="the first never entered charge")
    parked = [PaymentReactor.run_async(account_id=account, hold=0.1) for _ in range(waiters)]
    wait_until(
        lambda: ContentionState.objects.filter(execution__in=parked).count() == waiters,
        30,
        message="the waiters did not all park",
    )
    for execution in [first, *parked]:
        assert execution.wait(timeout=60).ok
    charges = records("charge")
    assert len(charges) == waiters + 1 and overlapping(charges) == []
    for execution in parked:
        state = ContentionState.objects.get(execution=execution, step="charge")
        ran = StepRun.objects.get(
            execution=execution,
            step="charge",
            kind=StepRunKind.RUN,
            status=StepRunStatus.SUCCEEDED,
        )
        # resumed before its backoff requeue would have fired: a release woke it
        assert ran.started_at < state.next_attempt_at, (ran.started_at, state.next_attempt_at)
    return [first, *parked]


def a_long_countdown_arrives_in_hops(worker: Any, delay: float = 3.5) -> None:
    label = uuid.uuid4().hex[:8]
    due = timezone.now() + timedelta(seconds=delay)
    result = tasks.stamped.using(run_after=due).enqueue(label)
    finished(result, timeout=60)
    stamps = [stamp for stamp in records("stamped") if stamp["label"] == label]
    assert len(stamps) == 1, stamps  # once
    assert stamps[0]["at"] >= due.timestamp() * 1e9  # not before it was due
    assert result.started_at >= due
    # the early deliveries, each a hop that did nothing else (Celery logs each return value)
    hops = re.findall(
        rf"'execution_id': '{result.id}', 'outcome': 'deferred'", worker.process.read_log()
    )
    assert len(hops) >= 2, worker.process.log()
