"""Worker-backed executions with real Celery workers: contention parks, crash safety, sweeping.

Claims SC-004 (contention costs zero compensations), SC-005 (the worker path is protected like
the in-process one), SC-008 (a killed holder frees the key, the execution is redelivered and
completes; a redelivery does not re-enter the holds its killed predecessor left), the
contention ceiling, and uncapped ordered-lock waits.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone
from django_celery_results.models import TaskResult

from reactor_app import Reactor
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Holder, LockClaim, OrderedLockClaim
from reactor_app.engine.dispatch import ExecutionClaim
from reactor_app.exceptions import ContentionCeilingExceeded
from reactor_app.models import ContentionState, CoordinationEvent, Execution, StepRun
from reactor_app.status import CoordinationEventKind, ExecutionStatus, StepRunKind, StepRunStatus
from reactor_app.testing import (
    assert_locked,
    assert_not_locked,
    coordination_state,
    within_freshness_bound,
)
from tests.worker.helpers import overlapping, wait_until
from tests.worker.reactors import (
    CrashPeriodAfterAStepReactor,
    CrashPeriodReactor,
    CrashRateLimitReactor,
    CrashReactor,
    LongLeaseCrashReactor,
    OrderedReactor,
    PaymentReactor,
    records,
)

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = {
    # these tests are about the park itself: no in-delivery wait before it
    "REACTOR_WORKER_WAIT": 0,
    "REACTOR_CONTENTION_BACKOFF": [0.3, 1.0],
    "REACTOR_CONTENTION_CEILING": 6,
    # a killed delivery's claim lapses quickly; longer than the crash test's lock TTL (2 s), so
    # the test can watch the lock free before the redelivery re-enters it
    "REACTOR_EXECUTION_CLAIM_TTL": 6,
    "REACTOR_SWEEP_AFTER": 3,
}


def test_run_async_runs_on_a_worker_and_wait_returns_the_result(worker: Any) -> None:
    execution = PaymentReactor.run_async(account_id=1, hold=0.01)
    assert execution.status == ExecutionStatus.PENDING

    result = execution.wait(timeout=30)

    assert result.ok, result.error
    assert result.value == {"charged": 1}
    assert {r["pid"] for r in records("charge")} != {os.getpid()}
    # the execution row is the result: the delivery task's summary is not stored in the
    # result backend too (it would be there within milliseconds of the row's end)
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert not TaskResult.objects.filter(result__contains=str(execution.id)).exists()
        time.sleep(0.05)


def test_contention_parks_then_completes_without_compensation(worker: Any) -> None:
    """SC-004: two worker executions on one step-lock key both complete; the second parked."""
    first = PaymentReactor.run_async(account_id=7, hold=1.0)
    wait_until(lambda: records("enter:charge"), 20, message="the first never entered charge")
    second = PaymentReactor.run_async(account_id=7, hold=0.05)

    assert first.wait(timeout=30).ok
    assert second.wait(timeout=30).ok

    contention = ContentionState.objects.get(execution=second, step="charge")
    assert contention.primitive == "lock"
    assert contention.key == "acct:7"
    assert contention.attempts >= 1
    assert contention.blocker["owner"] == str(first.id)
    kinds = set(
        CoordinationEvent.objects.filter(execution=second, key="acct:7").values_list(
            "kind", flat=True
        )
    )
    assert {CoordinationEventKind.PARKED, CoordinationEventKind.RESUMED} <= kinds
    # zero compensations or undos, anywhere
    assert not StepRun.objects.exclude(kind=StepRunKind.RUN).exists()
    assert records("rollback") == []
    # parks did not consume retries: one attempt ran the body, and it was the first attempt
    ran = StepRun.objects.filter(execution=second, step="charge").exclude(
        status=StepRunStatus.PARKED
    )
    assert [(r.attempt, r.status) for r in ran] == [(1, StepRunStatus.SUCCEEDED)]
    assert (
        StepRun.objects.filter(execution=second, step="charge", status=StepRunStatus.PARKED).count()
        == contention.attempts
    )
    parked = Execution.objects.get(pk=second.pk)
    assert parked.error is None and parked.rollback_failures == []


def test_same_key_step_bodies_never_overlap_through_workers(worker: Any) -> None:
    """SC-005: several executions on one key, two worker processes: zero overlaps."""
    executions = [PaymentReactor.run_async(account_id=5, hold=0.15) for _ in range(6)]
    for execution in executions:
        assert execution.wait(timeout=90).ok

    charges = [r for r in records("charge")]
    assert len(charges) == 6
    assert overlapping(charges) == []
    assert len({r["pid"] for r in records("audit")}) >= 2, "only one worker process ran"
    # every fresh acquisition got a higher fencing token
    tokens = [r["token"] for r in sorted(charges, key=lambda r: r["start"])]
    assert tokens == sorted(tokens) and len(set(tokens)) == 6


def test_contention_ceiling_turns_the_park_into_a_failure(worker: Any) -> None:
    holder = Holder(owner="test-holder")
    coordinator = Coordinator()
    held = coordinator.admit([LockClaim("acct:99", ttl=60)], holder)
    try:
        execution = PaymentReactor.run_async(account_id=99, hold=0.01)
        result = execution.wait(timeout=60)
    finally:
        coordinator.release(held, "success")

    assert result.status == ExecutionStatus.FAILED
    assert isinstance(result.error, ContentionCeilingExceeded)
    assert result.error.attempts == 7  # the seventh refusal is past the ceiling of 6
    assert result.error.key == "acct:99" and result.error.step == "charge"
    assert "7 times" in result.error.message
    # the step that ran before is undone as for any failure; the contended one never ran
    assert [r["step"] for r in records("rollback")] == ["audit"]
    assert not StepRun.objects.filter(
        execution=execution, step="charge", status=StepRunStatus.SUCCEEDED
    ).exists()


def test_ordered_lock_waits_are_not_capped(worker: Any) -> None:
    coordinator = Coordinator()
    holder = Holder(owner="test-head")
    position = coordinator.assign_position("line:1", holder, 600)
    head = OrderedLockClaim("line:1", position, poison_pill_timeout=3, strict=False)
    admitted = coordinator.admit([head], holder)
    stop = threading.Event()

    def keep_head_alive() -> None:
        while not stop.wait(0.5):
            coordinator.heartbeat(head)

    beating = threading.Thread(target=keep_head_alive, daemon=True)
    beating.start()
    try:
        execution = OrderedReactor.run_async(key=1)
        ceiling = WORKER_SETTINGS["REACTOR_CONTENTION_CEILING"]
        # the ContentionState row is written just before the pass persists "parked", so
        # wait for both rather than read the status in between
        wait_until(
            lambda: (
                ContentionState.objects.filter(
                    execution=execution, attempts__gt=ceiling + 1
                ).exists()
                and Execution.objects.filter(
                    pk=execution.pk, status=ExecutionStatus.PARKED
                ).exists()
            ),
            40,
            message="the ordered wait did not park past the ceiling",
        )
    finally:
        stop.set()
        beating.join()
        coordinator.release(admitted, "success")

    result = execution.wait(timeout=30)
    assert result.ok, result.error
    assert ContentionState.objects.get(execution=execution).primitive == "ordered_lock"


def test_killed_holder_frees_the_key_and_the_execution_completes(worker: Any) -> None:
    """SC-008: SIGKILL the worker process inside a locked step; no operator action."""
    execution = CrashReactor.run_async(key="k1")
    entered = wait_until(lambda: records("enter:fragile"), 30)[0]
    assert_locked("crash:k1")
    os.kill(entered["pid"], signal.SIGKILL)
    killed_at = time.monotonic()

    # the lock's TTL (2 s) lapses: the key frees by itself
    wait_until(
        lambda: not coordination_state().lock("crash:k1").held, 10, message="the key never freed"
    )
    freed_after = time.monotonic() - killed_at

    # acks_late + reject_on_worker_lost: the task is redelivered; once the dead delivery's
    # claim lapses, the execution continues from its checkpoint and completes
    result = execution.wait(timeout=60)
    assert result.ok, result.error
    assert result.value["fragile"] == {"entry": 2}
    assert freed_after < 4
    # "before" completed before the crash and was not run again (its checkpoint held)
    assert len([r for r in records("audit") if r["execution"] == str(execution.id)]) == 1
    runs = records("fragile")
    assert [r["entry"] for r in runs] == [2]  # the killed entry never finished
    assert runs[0]["pid"] != entered["pid"]
    assert runs[0]["start"] > entered["start"]


def test_a_redelivery_drops_the_holds_its_killed_predecessor_left(worker: Any) -> None:
    """Holds belong to the root execution, not to a delivery: a redelivery must not re-enter
    the ones a killed delivery left (a 30 s lease outlives the 6 s claim), or the keys stay
    held after the execution completes, until their TTL lapses."""
    execution = LongLeaseCrashReactor.run_async(key="k2")
    entered = wait_until(lambda: records("enter:fragile"), 30)[0]
    step_lock, outer_lock = (
        coordination_state().lock("crash-held:k2"),
        coordination_state().lock("crash-outer:k2"),
    )
    assert (step_lock.owner, step_lock.count) == (str(execution.id), 1)
    assert (outer_lock.owner, outer_lock.count) == (str(execution.id), 1)
    # Tracking rows trail the work by the freshness bound and a hard crash loses what is still
    # buffered (docs/operations.md): kill once the first acquisition's row is written.
    assert within_freshness_bound(
        CoordinationEvent.objects.filter(
            execution=execution, kind=CoordinationEventKind.ACQUIRED, key="crash-held:k2"
        ).exists
    )
    os.kill(entered["pid"], signal.SIGKILL)

    result = execution.wait(timeout=60)
    assert result.ok, result.error
    assert result.value["fragile"] == {"entry": 2}
    # right after completion, both keys are free: nothing left over at a nesting level
    assert_not_locked("crash-held:k2")
    assert_not_locked("crash-outer:k2")
    dropped = CoordinationEvent.objects.filter(
        execution=execution, kind=CoordinationEventKind.FORCED_RELEASE
    )
    assert sorted((e.key, e.step, e.owner, e.detail["reason"]) for e in dropped) == [
        ("crash-held:k2", "fragile", str(execution.id), "redelivery"),
        ("crash-outer:k2", "", str(execution.id), "redelivery"),
    ]
    # the redelivery took both keys afresh, with newer fencing tokens
    acquired = CoordinationEvent.objects.filter(
        execution=execution, kind=CoordinationEventKind.ACQUIRED, key="crash-held:k2"
    ).order_by("at")
    assert [e.detail["reentrant"] for e in acquired] == [False, False]
    assert acquired[1].token > acquired[0].token
    (run,) = records("fragile")
    assert run["pid"] != entered["pid"]


def kill_the_first_entry() -> None:
    """SIGKILL the pool process in the first body of ``FirstEntryKilledStep``."""
    entered = wait_until(lambda: records("enter:first-killed"), 30)[0]
    os.kill(entered["pid"], signal.SIGKILL)


@pytest.mark.parametrize("reactor", [CrashPeriodReactor, CrashPeriodAfterAStepReactor])
def test_a_killed_period_holder_whose_bucket_another_run_completed_fails_and_rolls_back(
    worker: Any, reactor: type[Reactor]
) -> None:
    """The run holding a reactor-level period bucket is killed mid-body; its reservation
    lapses and another run completes the bucket before the redelivery. The redelivery must
    not run the body again in that bucket, nor halt as if nothing had started: it fails with
    the period's error and undoes the step it completed, if any (docs/coordination.md,
    "Period"). Found while reproducing a CI failure of the SIGKILL schedule on real workers
    (``test_worker_fault_histories``): killed in its first step, before any checkpoint, the
    redelivery had no trace of the admission and halted."""
    first = reactor.run_async(key="p1")
    kill_the_first_entry()
    wait_until(
        lambda: coordination_state().period_reserved("crash-period:p1", "day") is None,
        10,
        message="the killed holder's reservation never lapsed",
    )

    other = reactor.run(key="p1")
    assert other.ok, other.error
    marked_by = coordination_state().period_marked_by("crash-period:p1", "day")
    assert marked_by == str(other.execution_id)

    result = first.wait(timeout=60)
    assert result.status == ExecutionStatus.FAILED, result
    assert result.error.primitive == "period"
    assert "was marked by another execution" in str(result.error)
    # the killed body did not run again; a step completed before it was undone
    assert [r["execution"] for r in records("first-killed")] == [str(other.execution_id)]
    undone = [r for r in records("rollback") if r["execution"] == str(first.id)]
    if reactor is CrashPeriodAfterAStepReactor:
        assert undone == [{"step": "audit", "kind": "undo", "execution": str(first.id)}]
    else:
        assert undone == []
    # the bucket's one success stays the other run's
    assert coordination_state().period_marked_by("crash-period:p1", "day") == marked_by


def test_a_killed_run_is_charged_its_reactor_rate_limit_once(worker: Any) -> None:
    """A run admitted under a reactor-level rate limit is killed in its first body: the
    delivery that takes over continues that admission, it is not charged again (one run, one
    slot of the window). Before, a kill ahead of the first checkpoint left no trace of the
    admission and the takeover was charged as a new run."""
    execution = CrashRateLimitReactor.run_async(key="r1")
    kill_the_first_entry()
    result = execution.wait(timeout=60)
    assert result.ok, result.error
    assert [r["entry"] for r in records("first-killed")] == [2]  # the killed entry never ended
    assert coordination_state().rate_limit("crash-rate:r1", 60) == 1


def test_sweeper_requeues_an_execution_whose_worker_vanished(worker: Any) -> None:
    """A running execution whose heartbeat is stale and whose claim is free is re-enqueued."""
    from reactor_app.engine.dispatch import _worker_context
    from reactor_app.engine.state import ExecutionState

    stale = timezone.now() - timedelta(seconds=60)
    state = ExecutionState.from_json(_worker_context())
    state.next_index = 1  # "audit" already done by the vanished worker
    state.results["audit"] = "audited"
    execution = Execution.objects.start(
        reactor=PaymentReactor.path(),
        inputs={"account_id": 3, "hold": 0.01},
        status=ExecutionStatus.RUNNING,
        started_at=stale,
        heartbeat_at=stale,
        context=state.to_json(),
    )
    held = Execution.objects.start(
        reactor=PaymentReactor.path(),
        inputs={"account_id": 4, "hold": 0.01},
        status=ExecutionStatus.RUNNING,
        started_at=stale,
        heartbeat_at=stale,
        context=_worker_context(),
    )
    live_claim = ExecutionClaim(held.id, "a-live-delivery", ttl=30)
    assert live_claim.acquire()
    try:
        call_command("reactor_sweep")
        result = execution.wait(timeout=30)
        assert result.ok, result.error
        # continued from its checkpoint: audit did not run again
        assert [r for r in records("audit") if r["execution"] == str(execution.id)] == []
        # the one whose claim is held (a live delivery) was left alone
        held.refresh_from_db()
        assert held.status == ExecutionStatus.RUNNING
    finally:
        live_claim.release()
        Execution.objects.filter(pk=held.pk).update(status=ExecutionStatus.FAILED)
