"""Reactor-level holds across a park in a step (docs/design.md §2.8).

A worker execution that parks on a *step* keeps its reactor-level lock while it sleeps — so an
"exclusive" workflow stays exclusive — and re-adopts it on resume without a second acquisition
(no nesting level, no new fencing token, a ``resumed`` event instead of ``acquired``). A hold
is lengthened to cover the park, however short its ``ttl``; one lost anyway fails the resume
with ``LeaseLost``. Rollback after the resume, and a contention ceiling reached after it, still
release the adopted hold.

The worker's park backoff is 1-2 s for a first park (base 2 s, equal jitter), longer than the
0.9 s reactor-level lease of ``BriefLeaseReactor``: without the lengthening it would lapse.
(Not shorter: between the admission and the park the lease lives on its renewals alone, and
a 0.5 s lease lapses after a 0.33 s stall of a loaded machine — tests/renewing.py.)
The tests release the step lock they hold through ``wake`` (as a gate's release would), so the
parked execution resumes at once rather than at its backoff.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db.models.signals import post_save

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.engine.dispatch import deliver, wake
from reactor_app.engine.state import KEPT_HOLDS
from reactor_app.exceptions import ContentionCeilingExceeded
from reactor_app.models import ContentionState, CoordinationEvent, Execution
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from reactor_app.testing import assert_not_locked, coordination_state
from tests.worker.helpers import wait_until
from tests.worker.reactors import (
    BriefLeaseReactor,
    ExclusiveFailingReactor,
    ExclusiveReactor,
    LockedParent,
    PooledReactor,
    records,
)

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# parks themselves are under test: no in-delivery wait before them
WORKER_SETTINGS = {
    "REACTOR_CONTENTION_BACKOFF": [2.0, 4.0],
    "REACTOR_CONTENTION_CEILING": 10,
    "REACTOR_WORKER_WAIT": 0,
}

Kind = CoordinationEventKind


def hold_lock(key: str) -> Admitted:
    """Take ``key`` as someone outside every execution."""
    admitted = Coordinator().admit([LockClaim(key, ttl=60)], Holder(owner="test-holder"))
    assert isinstance(admitted, Admitted), admitted
    return admitted


def release_and_wake(admitted: Admitted) -> None:
    """Release as a gate does: the parked waiters of the freed key are re-enqueued now."""
    wake(Coordinator().release(admitted, "success").woken)


def events(execution: Any, key: str, kind: str) -> list[CoordinationEvent]:
    return list(
        CoordinationEvent.objects.filter(execution=execution, key=key, kind=kind).order_by("at")
    )


def adopted(execution: Any, key: str) -> list[CoordinationEvent]:
    """``resumed`` events of a kept hold re-adopted by the gate (a delivery that resumes from
    a park at the gate itself records ``resumed`` on that key too, with no token)."""
    return [e for e in events(execution, key, Kind.RESUMED) if e.detail.get("adopted")]


def ran(label: str, execution: Any) -> list[dict[str, Any]]:
    return [r for r in records(label) if r["execution"] == str(execution.id)]


class LockSampler:
    """Reads ``coordination_state().lock(key)`` every few ms on a thread: the highest count."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.max_count = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            state = coordination_state().lock(self.key)
            self.samples += 1
            self.max_count = max(self.max_count, state.count)

    def __enter__(self) -> LockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def test_a_park_in_a_step_keeps_the_reactor_lock_and_resumes_without_reacquiring(
    worker: Any,
) -> None:
    outer = "excl:1"
    step_lock = hold_lock("side:1")
    with LockSampler(outer) as sampler:
        try:
            first = ExclusiveReactor.run_async(key=1, side=1)
            wait_until(
                lambda: (
                    Execution.objects.filter(pk=first.pk, status=ExecutionStatus.PARKED).exists()
                    and ContentionState.objects.filter(execution=first, step="side").exists()
                ),
                30,
                message="the first execution never parked on its step lock",
            )
            acquired = events(first, outer, Kind.ACQUIRED)
            assert len(acquired) == 1
            token = acquired[0].token
            # parked, yet still the holder of the reactor-level lock, at nesting level 1
            parked = coordination_state().lock(outer)
            assert parked.held and parked.owner == str(first.id)
            assert (parked.count, parked.token, parked.step) == (1, token, None)

            # another execution of the exclusive workflow cannot start its run meanwhile
            second = ExclusiveReactor.run_async(key=1, side=2)
            wait_until(
                lambda: ContentionState.objects.filter(execution=second, step="").exists(),
                30,
                message="the second execution did not park on the reactor-level lock",
            )
            contention = ContentionState.objects.get(execution=second, step="")
            assert (contention.primitive, contention.key) == ("lock", outer)
            assert contention.blocker["owner"] == str(first.id)
            assert ran("audit", second) == []

            # a backoff redelivery of the first (1-2 s) re-adopts the lock and parks again
            # on the step lock, still holding it
            wait_until(
                lambda: adopted(first, outer),
                30,
                message="the first execution was not redelivered while parked",
            )
            assert coordination_state().lock(outer).owner == str(first.id)
            assert ran("audit", second) == []
        finally:
            release_and_wake(step_lock)

        assert first.wait(timeout=30).ok
        assert second.wait(timeout=30).ok

    assert sampler.samples > 10
    assert sampler.max_count == 1  # never re-entered: one nesting level throughout
    # one acquisition for the whole first run; every redelivery re-adopted it
    assert len(events(first, outer, Kind.ACQUIRED)) == 1
    resumed = adopted(first, outer)
    assert len(resumed) >= 2  # the backoff redelivery and the final one
    assert {e.token for e in resumed} == {token}
    assert len(events(first, outer, Kind.RESUMED)) == len(resumed)
    released = events(first, outer, Kind.RELEASED)
    assert [e.token for e in released] == [token]
    # the step ran under the same fencing token as the first acquisition
    (side,) = ran("side", first)
    assert side["token"] == token
    # and in order: the second's run started after the first's ended
    (second_audit,) = ran("audit", second)
    assert second_audit["start"] > side["end"]
    second_token = events(second, outer, Kind.ACQUIRED)[0].token
    assert second_token > token
    assert_not_locked(outer)


def test_a_reactor_lock_outlives_a_park_several_times_its_ttl(worker: Any) -> None:
    """A 0.9 s reactor-level lease kept across parks of 1-4 s each: the park lengthens it, so
    no intruder ever gets in while the workflow sleeps, and the resume re-adopts it."""
    outer = "excl:2"
    step_lock = hold_lock("side:2")
    intruded: list[Any] = []
    stop = threading.Event()

    def intruder() -> None:
        coordinator = Coordinator()
        while not stop.wait(0.02):
            answer = coordinator.admit([LockClaim(outer, ttl=5)], Holder(owner="intruder"))
            if isinstance(answer, Admitted):
                intruded.append(answer)
                coordinator.release(answer, "success")

    try:
        execution = BriefLeaseReactor.run_async(key=2, side=2)
        wait_until(
            lambda: ContentionState.objects.filter(execution=execution, step="side").exists(),
            30,
            message="the execution never parked on its step lock",
        )
        thread = threading.Thread(target=intruder, daemon=True)
        thread.start()
        with LockSampler(outer) as sampler:
            # at least one whole park and its redelivery, longer than the 0.9 s ttl
            wait_until(
                lambda: ContentionState.objects.get(execution=execution, step="side").attempts >= 2,
                30,
                message="the execution never came back and parked again",
            )
        assert coordination_state().lock(outer).owner == str(execution.id)
    finally:
        stop.set()
        release_and_wake(step_lock)

    result = execution.wait(timeout=30)
    assert result.ok, result.error
    assert intruded == [], "another owner took the workflow's lock while it was parked"
    assert sampler.samples > 10 and sampler.max_count == 1
    assert not events(execution, outer, Kind.LEASE_LOST)
    token = events(execution, outer, Kind.ACQUIRED)[0].token
    assert len(events(execution, outer, Kind.ACQUIRED)) == 1
    assert adopted(execution, outer) and {e.token for e in adopted(execution, outer)} == {token}
    assert ran("side", execution)[0]["token"] == token
    assert_not_locked(outer)


def test_a_failure_after_the_resume_rolls_back_and_releases_the_adopted_lock(
    worker: Any,
) -> None:
    outer = "excl:3"
    step_lock = hold_lock("side:3")
    try:
        execution = ExclusiveFailingReactor.run_async(key=3, side=3)
        wait_until(
            lambda: ContentionState.objects.filter(execution=execution, step="side").exists(),
            30,
            message="the execution never parked on its step lock",
        )
        assert coordination_state().lock(outer).owner == str(execution.id)
    finally:
        release_and_wake(step_lock)

    result = execution.wait(timeout=30)
    assert result.status == ExecutionStatus.FAILED
    assert "side effect refused" in result.error.message
    # the audit step was undone under the adopted lock, which was then released
    assert [r["step"] for r in records("rollback")] == ["audit"]
    token = events(execution, outer, Kind.ACQUIRED)[0].token
    assert len(events(execution, outer, Kind.ACQUIRED)) == 1
    assert [e.token for e in adopted(execution, outer)] == [token]
    released = events(execution, outer, Kind.RELEASED)
    assert [(e.token, e.detail["outcome"]) for e in released] == [(token, "failure")]
    assert_not_locked(outer)


# --------------------------------------------------------------------------------------------
# the same, one delivery at a time in this process (``deliver`` is the task body), for the
# cases whose timing a worker would make slow: a ceiling reached after a resume, a kept hold
# force-released by an operator


@pytest.fixture
def in_process(settings: Any) -> Iterator[None]:
    """Deliveries run here; what they enqueue goes to a queue nobody reads."""
    settings.REACTOR_CELERY_QUEUE = f"reactor-nobody-{uuid.uuid4().hex[:8]}"
    settings.REACTOR_CONTENTION_BACKOFF = [0.01, 0.02]
    settings.REACTOR_WORKER_WAIT = 0
    yield


def test_a_ceiling_reached_after_a_resume_releases_the_adopted_lock(
    in_process: None, settings: Any
) -> None:
    settings.REACTOR_CONTENTION_CEILING = 1
    outer = "excl:4"
    step_lock = hold_lock("side:4")
    try:
        execution = ExclusiveReactor.run_async(key=4, side=4)
        assert deliver(str(execution.id))["outcome"] == "parked"
        execution.refresh_from_db()
        assert execution.context[KEPT_HOLDS] == [
            {"primitive": "lock", "key": outer, "token": coordination_state().lock(outer).token}
        ]
        assert coordination_state().lock(outer).owner == str(execution.id)

        # the second refusal of the step is past the ceiling of 1: failed, rolled back
        assert deliver(str(execution.id))["outcome"] == "failed"
    finally:
        Coordinator().release(step_lock, "success")

    execution.refresh_from_db()
    assert execution.status == ExecutionStatus.FAILED
    assert execution.error["type"] == ContentionCeilingExceeded.__name__
    assert [r["step"] for r in records("rollback")] == ["audit"]
    token = events(execution, outer, Kind.ACQUIRED)[0].token
    assert len(events(execution, outer, Kind.ACQUIRED)) == 1
    assert [e.token for e in adopted(execution, outer)] == [token]
    assert [e.detail["outcome"] for e in events(execution, outer, Kind.RELEASED)] == ["failure"]
    assert_not_locked(outer)
    assert KEPT_HOLDS not in execution.context


def test_a_kept_lock_lost_while_parked_fails_the_resume_with_lease_lost(
    in_process: None,
) -> None:
    """Another owner held the workflow's key while it slept: the resume must not continue (or
    compete again) as if nothing happened. It fails with ``LeaseLost`` before any further step
    runs, rolls back, and leaves the other owner's hold alone."""
    outer = "excl:5"
    step_lock = hold_lock("side:5")
    try:
        execution = ExclusiveReactor.run_async(key=5, side=5)
        assert deliver(str(execution.id))["outcome"] == "parked"
        first_token = coordination_state().lock(outer).token
        assert Coordinator().force_release("lock", outer).released == [str(execution.id)]
        # an operator's action meanwhile: someone else takes the key
        other = hold_lock(outer)
        assert deliver(str(execution.id))["outcome"] == "failed"
        assert coordination_state().lock(outer).owner == "test-holder"
        Coordinator().release(other, "success")
    finally:
        Coordinator().release(step_lock, "success")

    execution.refresh_from_db()
    assert execution.status == ExecutionStatus.FAILED
    assert execution.error["type"] == "LeaseLost"
    assert execution.error["key"] == outer
    assert [r["step"] for r in records("rollback")] == ["audit"]
    assert not ran("side", execution)
    lost = events(execution, outer, Kind.LEASE_LOST)
    assert [(e.token, e.detail["reason"]) for e in lost] == [(first_token, "owner")]
    assert [e.token for e in events(execution, outer, Kind.ACQUIRED)] == [first_token]
    assert_not_locked(outer)


def test_a_reactor_semaphore_slot_is_kept_across_a_park_and_readopted(in_process: None) -> None:
    pool = "pool:6"
    step_lock = hold_lock("side:6")
    try:
        execution = PooledReactor.run_async(key=6, side=6)
        assert deliver(str(execution.id))["outcome"] == "parked"
        parked = coordination_state().semaphore(pool, 1)
        assert [h.owner for h in parked.holders] == [str(execution.id)]
        assert (parked.holders[0].count, parked.available) == (1, 0)
        # the slot is taken: another run of the pooled workflow parks at its gate
        other = PooledReactor.run_async(key=6, side=7)
        assert deliver(str(other.id))["outcome"] == "parked"
        assert ContentionState.objects.get(execution=other, step="").key == pool
        assert ran("audit", other) == []
    finally:
        release_and_wake(step_lock)

    assert deliver(str(execution.id))["outcome"] == "succeeded"
    assert len(events(execution, pool, Kind.ACQUIRED)) == 1
    assert [e.detail["limit"] for e in adopted(execution, pool)] == [1]
    assert coordination_state().semaphore(pool, 1).held == 0
    assert deliver(str(other.id))["outcome"] == "succeeded"


def test_a_park_is_recorded_with_its_count_in_one_write(in_process: None) -> None:
    """Every write of the contention row carries the park's count: nobody reading the row (the
    admin's parked list, the API, a waiter's test) ever sees a parked execution with zero
    attempts, as a create followed by an update would show between the two."""
    saved: list[int] = []  # attempts of each save of the row (its creation included)

    def on_save(sender: Any, instance: ContentionState, **_: Any) -> None:
        saved.append(instance.attempts)

    post_save.connect(on_save, sender=ContentionState, dispatch_uid="test-park-count")
    step_lock = hold_lock("side:8")
    try:
        execution = ExclusiveReactor.run_async(key=8, side=8)
        assert deliver(str(execution.id))["outcome"] == "parked"
        assert deliver(str(execution.id))["outcome"] == "parked"
    finally:
        post_save.disconnect(dispatch_uid="test-park-count", sender=ContentionState)
        Coordinator().release(step_lock, "success")
    # the row was created with its first park counted (a later park may update it in place)
    assert saved and saved[0] == 1 and 0 not in saved
    assert ContentionState.objects.get(execution=execution).attempts == 2


@pytest.mark.parametrize(
    ("external", "at_least"), [(None, 120.0), (300, 600.0)], ids=["default", "every-300s"]
)
def test_with_sweeps_scheduled_outside_the_workers_kept_holds_outlast_two_of_them(
    settings: Any, external: int | None, at_least: float
) -> None:
    """``REACTOR_SWEEP_INTERVAL = 0`` hands the sweep to beat or cron (every 60 s by default,
    ``REACTOR_EXTERNAL_SWEEP_INTERVAL`` otherwise). Each sweep lengthens the holds parked
    executions keep; counted from a 0 interval, the lengthening was 10 s and the holds lapsed
    between two sweeps, letting another execution into the workflow."""
    from reactor_app.engine.dispatch import renew_kept_holds
    from reactor_app.engine.state import ExecutionState

    settings.REACTOR_SWEEP_INTERVAL = 0
    if external is not None:
        settings.REACTOR_EXTERNAL_SWEEP_INTERVAL = external
    execution_id = uuid.uuid4()
    admitted = Coordinator().admit([LockClaim("wf:kept", ttl=2)], Holder(owner=str(execution_id)))
    assert isinstance(admitted, Admitted)
    state = ExecutionState()
    state.origin.worker = True
    # parked waiting for something with no due time of its own (an async child)
    state.continuation.kept_holds = [
        {"primitive": "lock", "key": "wf:kept", "token": admitted.holds[0].token}
    ]
    Execution.objects.create(
        id=execution_id,
        reactor="shop.Workflow",
        inputs={},
        status=ExecutionStatus.PARKED,
        context=state.to_json(),
    )
    assert renew_kept_holds() == 1
    lease = coordination_state().lock("wf:kept").ttl
    assert lease is not None and at_least - 5 <= lease <= at_least + 1, lease


def test_a_bad_external_sweep_interval_is_a_configuration_error(settings: Any) -> None:
    from reactor_app.checks import check_settings

    settings.REACTOR_EXTERNAL_SWEEP_INTERVAL = 0
    assert [e.obj for e in check_settings()] == ["REACTOR_EXTERNAL_SWEEP_INTERVAL"]


def park_in_composed_child(key: int) -> tuple[Execution, Execution, Admitted]:
    """``LockedParent`` → ``LockedChild``, parked on ``side:<key>`` (held here) inside the
    child: the child has completed ``audit`` and keeps ``child:<key>`` across the park."""
    side = hold_lock(f"side:{key}")
    parent = LockedParent.run_async(key=key, side=key)
    wait_until(
        lambda: (
            Execution.objects.filter(parent_id=parent.pk, status=ExecutionStatus.PARKED).exists()
            and Execution.objects.get(pk=parent.pk).status == ExecutionStatus.PARKED
        ),
        30,
        message="the tree never parked in its composed child",
    )
    child = Execution.objects.get(parent_id=parent.pk)
    assert coordination_state().lock(f"child:{key}").held
    return parent, child, side


def test_a_tree_that_fails_at_its_own_gate_ends_its_parked_composed_child(worker: Any) -> None:
    """The parent's kept lock is force-released while the tree is parked inside its composed
    child: the resume fails at the parent's gate (``LeaseLost``) and rolls back. The child's
    completed step is undone, its kept lock released, and it ends ``failed`` — it stayed
    ``parked``, its lock renewed by every sweep, for good."""
    from reactor_app.engine.dispatch import renew_kept_holds

    parent, child, side = park_in_composed_child(77)
    try:
        Coordinator().force_release("lock", "parent:77")  # an operator's action
    finally:
        release_and_wake(side)
    wait_until(lambda: Execution.objects.get(pk=parent.pk).is_terminal, 30, message="no end")
    parent.refresh_from_db()
    child.refresh_from_db()
    assert parent.status == ExecutionStatus.FAILED and parent.error["type"] == "LeaseLost"
    assert child.status == ExecutionStatus.FAILED and child.finished_at is not None
    assert [r["step"] for r in records("rollback")] == ["audit"]
    assert_not_locked("child:77")
    assert renew_kept_holds() == 0  # nothing parked keeps anything


def test_cancelling_a_tree_parked_in_its_composed_child_ends_and_rolls_back_the_child(
    worker: Any,
) -> None:
    from reactor_app.engine.cancel import cancel_execution

    parent, child, side = park_in_composed_child(78)
    try:
        cancel_execution(parent.pk, "stop")
    finally:
        release_and_wake(side)
    wait_until(lambda: Execution.objects.get(pk=parent.pk).is_terminal, 30, message="no end")
    parent.refresh_from_db()
    child.refresh_from_db()
    assert parent.status == ExecutionStatus.CANCELLED
    assert child.status == ExecutionStatus.CANCELLED
    assert [r["step"] for r in records("rollback")] == ["audit"]
    assert_not_locked("child:78")
    assert_not_locked("parent:78")
