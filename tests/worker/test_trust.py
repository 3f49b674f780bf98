"""Guarantees that must hold through crashes, retries and hand-offs on real workers.

* A failure retry's backoff is a requeue: during it the execution is ``parked``, its claim and
  the step's lock are free (the worker slot too), and the reactor-level lock stays kept.
* A parked execution whose woken delivery died right after taking the claim comes back by
  itself once the dead claim lapses — no sweep (``REACTOR_SWEEP_INTERVAL = 0`` here).
* A step of an ``async_reactor`` child keyed on a result its dispatcher's lock covers is refused
  at once with ``HandOffRefused`` instead of waiting for its own parent.
* A crash inside a composed child: the redelivery frees the child's holds (the held-key
  registry lists them), so nothing stays locked after the execution completes.
* A takeover that cannot read the registry (Redis fails right then) changes nothing and comes
  back, instead of re-entering the dead delivery's holds.
* Holds kept across a park by a reactor version that declared them are given back when a
  version without those declarations resumes it.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.engine.dispatch import ExecutionClaim, wake
from reactor_app.models import ContentionState, CoordinationEvent, Execution
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from reactor_app.testing import assert_not_locked, coordination_state
from tests.worker.helpers import wait_until
from tests.worker.reactors import records
from tests.worker.trust_reactors import (
    ComposedCrashReactor,
    GuardParent,
    RetryReactor,
    StrandReactor,
)

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = {
    "REACTOR_CONTENTION_BACKOFF": [0.2, 0.5],
    "REACTOR_EXECUTION_CLAIM_TTL": 4,
    # nothing here may come back through a sweep: each recovery below is the delivery's own
    "REACTOR_SWEEP_INTERVAL": 0,
}


def test_a_retry_backoff_on_a_worker_is_a_requeue_that_holds_nothing_of_the_step(
    worker: Any,
) -> None:
    execution = RetryReactor.run_async(key="r1")
    wait_until(lambda: records("flaky"), 30, message="the first attempt never ran")
    # the 3 s backoff: parked, with no delivery sleeping on it
    wait_until(
        lambda: Execution.objects.get(pk=execution.pk).status == ExecutionStatus.PARKED,
        2.5,
        message="the execution was not requeued for its backoff",
    )
    assert not ExecutionClaim.is_held(execution.id)
    assert not coordination_state().lock("retry:r1").held
    # the reactor-level lock is kept across the wait, as across any park
    assert coordination_state().lock("retry-outer:r1").owner == str(execution.id)

    result = execution.wait(timeout=30)
    assert result.ok, result.error
    first, second = records("flaky")
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert (second["at"] - first["at"]) / 1e9 >= 2.9  # the backoff was honoured
    assert_not_locked("retry:r1")
    assert_not_locked("retry-outer:r1")


def test_a_parked_execution_whose_woken_delivery_died_after_claiming_comes_back(
    worker: Any,
) -> None:
    blocker = Coordinator().admit([LockClaim("strand:s1", ttl=60)], Holder(owner="test-holder"))
    assert isinstance(blocker, Admitted)
    execution = StrandReactor.run_async(key="s1")
    wait_until(
        lambda: Execution.objects.get(pk=execution.pk).status == ExecutionStatus.PARKED,
        30,
        message="the execution never parked",
    )
    # A delivery took the claim and was killed before it changed anything: its claim stays
    # until its TTL lapses, and every delivery meanwhile finds it claimed elsewhere.
    dead = ExecutionClaim(execution.id, "killed-delivery", ttl=4.0)
    assert dead.acquire()
    wake(Coordinator().release(blocker, "success").woken)

    result = execution.wait(timeout=30)
    assert result.ok, result.error
    assert [r["execution"] for r in records("strand")] == [str(execution.id)]


def test_an_async_reactor_step_keyed_on_a_result_its_dispatcher_holds_is_refused_at_once(
    worker: Any,
) -> None:
    began = time.monotonic()
    execution = GuardParent.run_async(key="g1")
    result = execution.wait(timeout=30)
    assert result.status == ExecutionStatus.FAILED
    assert type(result.error).__name__ == "HandOffRefused"
    assert result.error.key == "guard:g1"
    child = Execution.objects.get(parent=execution)
    assert child.status == ExecutionStatus.FAILED
    assert child.error["type"] == "HandOffRefused"
    assert child.error["step"] == "locked"
    # refused, not parked against its own parent until a ceiling or a timeout
    assert not ContentionState.objects.filter(execution=child).exists()
    assert not records("guarded")
    assert time.monotonic() - began < 20
    assert_not_locked("guard:g1")


def test_a_crash_inside_a_composed_child_frees_the_childs_holds_on_redelivery(
    worker: Any,
) -> None:
    execution = ComposedCrashReactor.run_async(key="c1")
    entered = wait_until(lambda: records("enter:composed"), 30)[0]
    held = coordination_state().lock("composed-held:c1")
    assert (held.owner, held.count) == (str(execution.id), 1)
    os.kill(entered["pid"], signal.SIGKILL)

    result = execution.wait(timeout=60)
    assert result.ok, result.error
    # right after completion the child's key is free: not left at a second nesting level
    assert_not_locked("composed-held:c1")
    dropped = CoordinationEvent.objects.filter(
        execution=execution, kind=CoordinationEventKind.FORCED_RELEASE
    )
    assert [(e.key, e.step, e.detail["reason"]) for e in dropped] == [
        ("composed-held:c1", "fragile", "redelivery")
    ]
    runs = records("composed")
    assert [r["entry"] for r in runs] == [2] and runs[0]["pid"] != entered["pid"]


def test_a_takeover_that_cannot_read_the_registry_changes_nothing_and_comes_back(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delivery taking over from a dead one (the row still ``running``) drops the holds the
    dead one left before anything else. If Redis fails it right then, it must not go on: it
    would re-enter the stale lock (one release later, the key stays held until its TTL) and a
    park for the outage would make the next delivery no takeover. It changes nothing and the
    execution is sent again, still ``running``; that delivery drops the holds and finishes."""
    from reactor_app.coordination.registry import HoldRegistry
    from reactor_app.engine.dispatch import deliver
    from reactor_app.exceptions import CoordinationUnavailable
    from tests.worker.reactors import ExclusiveReactor

    settings.REACTOR_CELERY_QUEUE = f"reactor-nobody-{os.getpid()}-{time.monotonic_ns()}"
    execution = ExclusiveReactor.run_async(key="t1", side="t1")
    Execution.objects.filter(pk=execution.pk).update(status=ExecutionStatus.RUNNING)
    owner = str(execution.pk)  # the dead delivery's reactor-level hold, announced first
    HoldRegistry(owner).announce([("lock", "excl:t1")])
    assert isinstance(Coordinator().admit([LockClaim("excl:t1", ttl=30)], Holder(owner)), Admitted)

    real = HoldRegistry.entries

    def unreachable(self: HoldRegistry) -> Any:
        raise CoordinationUnavailable("the coordination Redis is unreachable", cause="test")

    monkeypatch.setattr(HoldRegistry, "entries", unreachable)
    assert deliver(str(execution.pk))["outcome"] == "coordination_unavailable"
    execution.refresh_from_db()
    assert execution.status == ExecutionStatus.RUNNING
    assert coordination_state().lock("excl:t1").count == 1  # not re-entered, not released

    monkeypatch.setattr(HoldRegistry, "entries", real)
    assert deliver(str(execution.pk))["outcome"] == "succeeded"
    assert_not_locked("excl:t1")  # dropped, taken once, released once


def test_holds_kept_by_a_reactor_that_no_longer_declares_them_are_given_back(
    settings: Any,
) -> None:
    """A deploy between two deliveries removed the reactor-level declarations of a parked
    execution: the holds its earlier version kept across the park are released when it
    resumes, not left standing until their park lease lapses."""
    from reactor_app.engine.dispatch import deliver
    from reactor_app.engine.state import ExecutionState
    from tests.worker.reactors import PaymentReactor

    settings.REACTOR_CELERY_QUEUE = f"reactor-nobody-{os.getpid()}-{time.monotonic_ns()}"
    execution = PaymentReactor.run_async(account_id=41, hold=False)  # declares no reactor lock
    owner = str(execution.pk)
    kept = Coordinator().admit([LockClaim("gone:41", ttl=60)], Holder(owner))
    assert isinstance(kept, Admitted)
    state = ExecutionState.peek(execution.context)
    state.origin.worker = True
    state.continuation.kept_holds = [
        {"primitive": "lock", "key": "gone:41", "token": kept.holds[0].token}
    ]
    Execution.objects.filter(pk=execution.pk).update(
        status=ExecutionStatus.PARKED, context=state.to_json()
    )
    assert deliver(owner)["outcome"] == "succeeded"
    assert_not_locked("gone:41")


def test_a_takeover_takes_its_dead_predecessors_lock_again_before_any_waiter(
    settings: Any,
) -> None:
    """Dropping the dead delivery's holds is no operator's release: the key is not granted to
    the waiter parked on it, or that waiter would run inside this execution's workflow while
    its completed steps stand. The takeover takes the lock again at once and finishes."""
    from reactor_app.coordination.registry import HoldRegistry
    from reactor_app.engine.dispatch import deliver
    from tests.worker.reactors import ExclusiveReactor

    settings.REACTOR_CELERY_QUEUE = f"reactor-nobody-{os.getpid()}-{time.monotonic_ns()}"
    execution = ExclusiveReactor.run_async(key="t2", side="t2")
    Execution.objects.filter(pk=execution.pk).update(status=ExecutionStatus.RUNNING)
    owner = str(execution.pk)
    HoldRegistry(owner).announce([("lock", "excl:t2")])
    claim = LockClaim("excl:t2", ttl=30)
    assert isinstance(Coordinator().admit([claim], Holder(owner)), Admitted)
    waiting = Coordinator().admit([claim], Holder("someone-else"), waiter_id="parked-waiter")
    assert not isinstance(waiting, Admitted)
    assert deliver(owner)["outcome"] == "succeeded"
    assert_not_locked("excl:t2")


def test_a_takeover_never_carries_on_a_composed_child_a_rollback_already_ended(
    settings: Any,
) -> None:
    """A rollback ended the composed child the tree was parked in (``failed``, its steps
    undone), then died before the parent's own row said so. The delivery that takes over must
    not run the child again from the middle: the child's step fails the parent."""
    from reactor_app.engine.dispatch import deliver
    from reactor_app.engine.state import ExecutionState
    from tests.worker.reactors import LockedParent

    settings.REACTOR_CELERY_QUEUE = f"reactor-nobody-{os.getpid()}-{time.monotonic_ns()}"
    parent = LockedParent.run_async(key=79, side=79)
    child = Execution.objects.create(
        reactor="tests.worker.reactors.LockedChild",
        inputs={"key": 79, "side": 79},
        parent=parent,
        root_id=parent.pk,
        status=ExecutionStatus.FAILED,
        error={"type": "StepFailed", "message": "ended by its tree's rollback"},
    )
    state = ExecutionState.peek(parent.context)
    state.origin.worker = True
    state.children.composed_runs()["sub"] = str(child.pk)
    Execution.objects.filter(pk=parent.pk).update(
        status=ExecutionStatus.RUNNING, context=state.to_json()
    )
    assert deliver(str(parent.pk))["outcome"] == "failed"
    assert records("enter:audit") == [] and records("enter:side") == []
    child.refresh_from_db()
    assert child.status == ExecutionStatus.FAILED
