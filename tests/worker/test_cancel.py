"""Cancelling executions in every state, with real Celery workers and real Redis.

* running: the worker inside a step that calls ``context.checkpoint()`` stops there, rolls
  back the completed step under its lock, releases the reactor-level lock and wakes the
  execution parked on it; a running step holding a lock of its own is compensated while the
  lock is still held (checked in Redis), then the lock's parked waiter is woken;
* parked (keeping its reactor-level lock across the park): the cancel returns at once and a
  worker delivery ends it (never the canceller: issue 30), the completed steps undone under
  their locks, the kept lock released, its waiter woken; it never runs again, even when the
  key it waited on frees;
* parked part-way through a sequential map: the elements that completed are undone, newest
  first, before the steps ahead of the map;
* pending: never delivered into a run, its ordered-lock position abandoned (the next position
  goes at once, not after the poison-pill timeout);
* interrupted: ended, rolled back, and no longer resumable;
* an ended execution cannot be cancelled;
* the API endpoint (200/202/400/403/404/409) and the admin action and button (permission,
  confirmation, audit event).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import transaction
from django.test import Client
from django.urls import reverse

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.engine.dispatch import wake
from reactor_app.exceptions import ExecutionNotCancellable, ExecutionNotResumable
from reactor_app.models import ContentionState, CoordinationEvent, Execution
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from reactor_app.testing import assert_not_locked, coordination_state
from tests.api import users
from tests.worker.cancel_reactors import (
    ApprovalReactor,
    CancellableReactor,
    InLineReactor,
    LockedWorkReactor,
    ParentReactor,
    SequentialMapReactor,
)
from tests.worker.helpers import wait_until
from tests.worker.reactors import records

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# A parked execution is only back early when woken: backoffs far longer than the waits below.
WORKER_SETTINGS = {
    "REACTOR_CONTENTION_BACKOFF": [20.0, 40.0],
    "REACTOR_CONTENTION_CEILING": 10,
    "REACTOR_WORKER_WAIT": 0,
}


def ran(label: str, execution: Any) -> list[dict[str, Any]]:
    return [r for r in records(label) if r["execution"] == str(execution.id)]


def status(execution: Any) -> str:
    return str(Execution.objects.get(pk=execution.pk).status)


def parked_on(execution: Any, step: str) -> bool:
    return (
        status(execution) == ExecutionStatus.PARKED
        and ContentionState.objects.filter(execution_id=execution.pk, step=step).exists()
    )


def hold_lock(key: str) -> Admitted:
    admitted = Coordinator().admit([LockClaim(key, ttl=60)], Holder(owner="test-holder"))
    assert isinstance(admitted, Admitted), admitted
    return admitted


def audit_events(execution: Any) -> list[CoordinationEvent]:
    return list(
        CoordinationEvent.objects.filter(
            execution_id=execution.pk, kind=CoordinationEventKind.CANCELLED
        )
    )


def test_a_running_execution_stops_at_its_checkpoint_and_rolls_back_under_its_locks(
    worker: Any,
) -> None:
    key = uuid.uuid4().hex[:8]
    first = CancellableReactor.run_async(key=key, seconds=30)
    wait_until(lambda: ran("enter:work", first), 30, message="the work step never started")
    # an execution of the same exclusive workflow parks on its reactor-level lock
    waiter = CancellableReactor.run_async(key=key, seconds=0)
    wait_until(lambda: parked_on(waiter, ""), 30, message="the waiter never parked")
    (charge,) = ran("charge", first)

    began = time.monotonic()
    Execution.objects.get(pk=first.pk).cancel("customer asked", by="ops@example.com")
    result = first.wait(timeout=20)
    assert time.monotonic() - began < 10  # the checkpoint stopped it, not the 30 s body
    assert result.status == ExecutionStatus.CANCELLED and not result.ok
    assert result.error is not None and type(result.error).__name__ == "ExecutionCancelled"
    assert result.error.reason == "customer asked"  # type: ignore[attr-defined]
    assert result.error.by == "ops@example.com"  # type: ignore[attr-defined]
    assert result.rollback_failures == []

    row = Execution.objects.get(pk=first.pk)
    assert row.status == ExecutionStatus.CANCELLED and row.finished_at is not None
    # the step cut short was compensated, the completed one undone under its own lock (the
    # same fencing token the body had: re-taken for the undo by the rollback gate)
    assert ran("compensate:work", first)[0]["error"] == "ExecutionCancelled"
    (undo,) = ran("undo:charge", first)
    assert undo["token"] is not None and undo["token"] >= charge["token"]
    assert undo["holder"] == str(first.pk)  # the lock really held in Redis during the undo
    assert ran("work", first) == [] and ran("gated", first) == [] and ran("after", first) == []
    assert audit_events(first)[0].detail["reason"] == "customer asked"

    # the reactor-level lock was released and its waiter woken (its backoff is 20-40 s)
    assert waiter.wait(timeout=15).ok
    assert ran("after", waiter)
    assert_not_locked(f"cancel-flow:{key}")
    assert_not_locked(f"cancel-acct:{key}")


def test_a_running_step_holding_a_lock_is_compensated_under_it_and_its_waiter_woken(
    worker: Any,
) -> None:
    work = uuid.uuid4().hex[:8]
    first = LockedWorkReactor.run_async(key=uuid.uuid4().hex[:8], work=work, seconds=30)
    wait_until(lambda: ran("enter:locked_work", first), 30, message="the step never started")
    (entered,) = ran("enter:locked_work", first)
    # another execution needs the same step lock: it parks on it
    second = LockedWorkReactor.run_async(key=uuid.uuid4().hex[:8], work=work, seconds=0)
    wait_until(lambda: parked_on(second, "locked_work"), 30, message="the waiter never parked")
    assert coordination_state().lock(f"cancel-work:{work}").owner == str(first.pk)

    Execution.objects.get(pk=first.pk).cancel("stop it")
    assert first.wait(timeout=20).status == ExecutionStatus.CANCELLED
    # the interrupted step was compensated while it still held its lock (same token), then
    # the completed step undone under its own lock
    (compensated,) = ran("compensate:locked_work", first)
    assert compensated["error"] == "ExecutionCancelled"
    assert compensated["token"] == entered["token"]
    assert compensated["holder"] == str(first.pk)  # in Redis, not only in memory
    (undo,) = ran("undo:charge", first)
    assert undo["token"] is not None and undo["holder"] == str(first.pk)
    assert ran("after", first) == []
    # the step lock was released and its parked waiter woken (its backoff is 20-40 s)
    assert second.wait(timeout=15).ok
    assert ran("enter:locked_work", second)[0]["token"] > entered["token"]


def test_cancelling_a_root_stops_its_composed_child_and_rolls_back_both(worker: Any) -> None:
    key, child_key = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    root = ParentReactor.run_async(key=key, child_key=child_key, seconds=30)
    wait_until(lambda: ran("enter:work", root) or child_entered(root), 30, message="no work")
    Execution.objects.get(pk=root.pk).cancel("whole tree")
    assert root.wait(timeout=20).status == ExecutionStatus.CANCELLED
    child = Execution.objects.get(parent_id=root.pk)
    assert child.status == ExecutionStatus.CANCELLED
    # a composed child is part of its root's run: it is not cancelled on its own
    with pytest.raises(ExecutionNotCancellable, match=f"cancel {root.pk} instead"):
        child.cancel("just the child")
    # both charges undone, the child's first (newest first), each under its lock; the root's
    # undo still ran inside the root's exclusive lock (the child released none of it)
    (child_undo,) = ran("undo:charge", child)
    (root_undo,) = ran("undo:charge", root)
    assert child_undo["at"] < root_undo["at"]
    assert child_undo["holder"] == root_undo["holder"] == str(root.pk)
    assert ran("after", root) == []
    assert_not_locked(f"cancel-parent:{key}")


def child_entered(root: Any) -> bool:
    child = Execution.objects.filter(parent_id=root.pk).first()
    return child is not None and bool(ran("enter:work", child))


def cancelled_soon(execution: Any) -> Execution:
    """The row once a worker delivery has ended it ``cancelled``."""
    wait_until(
        lambda: status(execution) == ExecutionStatus.CANCELLED,
        20,
        message="no worker delivery ended the cancelled execution",
    )
    return Execution.objects.get(pk=execution.pk)


def test_a_parked_execution_is_ended_by_a_worker_and_never_runs_again(worker: Any) -> None:
    key = uuid.uuid4().hex[:8]
    side = hold_lock(f"cancel-side:{key}")
    try:
        parked = CancellableReactor.run_async(key=key, seconds=0)
        wait_until(lambda: parked_on(parked, "gated"), 30, message="it never parked on 'gated'")
        # parked, it keeps the exclusive workflow's lock (docs/design.md §2.8)
        assert coordination_state().lock(f"cancel-flow:{key}").owner == str(parked.pk)
        waiter = CancellableReactor.run_async(key=key, seconds=0)
        wait_until(lambda: parked_on(waiter, ""), 30, message="the waiter never parked")

        answer = Execution.objects.get(pk=parked.pk).cancel("duplicate order")
        # recorded and handed to a worker: the canceller runs no undo itself
        assert answer.status == ExecutionStatus.PARKED
        row = cancelled_soon(parked)
        assert row.error["type"] == "ExecutionCancelled" and row.rollback_failures == []
        assert len(ran("undo:charge", parked)) == 1
        # under its lock, taken in Redis by the cancelled execution for the undo
        assert ran("undo:charge", parked)[0]["holder"] == str(parked.pk)
        assert not ContentionState.objects.filter(execution_id=parked.pk).exists()
        # it left the line of the step lock it waited on
        side_waiters = Coordinator().waiters(LockClaim(f"cancel-side:{key}"))
        assert str(parked.pk) not in side_waiters
        # the kept reactor-level lock is gone and the waiter was woken
        assert not coordination_state().lock(f"cancel-flow:{key}").held or (
            coordination_state().lock(f"cancel-flow:{key}").owner == str(waiter.pk)
        )
        # woken at once (its backoff is 20-40 s): it runs up to the step lock the test holds
        wait_until(lambda: parked_on(waiter, "gated"), 15, message="the waiter was not woken")
    finally:
        wake(Coordinator().release(side, "success").woken)
    assert waiter.wait(timeout=15).ok
    # the key it waited on freed, its wake-up delivered: still it never ran again
    time.sleep(1.0)
    assert status(parked) == ExecutionStatus.CANCELLED
    assert ran("gated", parked) == [] and ran("after", parked) == []
    assert len(ran("undo:charge", parked)) == 1


def test_a_sequential_map_parked_part_way_has_its_completed_elements_undone(
    worker: Any,
) -> None:
    """A map parked in element 1: the cancel undoes element 0 — not yet in the rollback log,
    since the map has not completed — before the step ahead of the map, newest first, each
    under its own lock."""
    key = uuid.uuid4().hex[:8]
    held = hold_lock(f"cancel-item:{key}:b")
    try:
        parked = SequentialMapReactor.run_async(key=key, items=["a", "b", "c"])
        wait_until(lambda: status(parked) == ExecutionStatus.PARKED, 30, message="it never parked")
        assert [r["item"] for r in ran("map-item", parked)] == ["a"]
        Execution.objects.get(pk=parked.pk).cancel("wrong batch")
        row = cancelled_soon(parked)
    finally:
        Coordinator().release(held, "success")
    assert row.rollback_failures == []
    undone = ran("undo:map-item", parked)
    assert [r["item"] for r in undone] == ["a"]
    assert undone[0]["holder"] == str(parked.pk)  # under the element's own lock
    charged = ran("undo:charge", parked)
    assert len(charged) == 1 and charged[0]["at"] > undone[0]["at"]  # newest first
    assert [r["item"] for r in ran("map-item", parked)] == ["a"]  # nothing ran after


def test_a_pending_execution_never_runs_and_leaves_its_ordered_place(worker: Any) -> None:
    key = uuid.uuid4().hex[:8]
    with transaction.atomic():
        # enqueued on commit: still pending when it is cancelled
        first = InLineReactor.run_async(key=key)
        assert status(first) == ExecutionStatus.PENDING
        row = Execution.objects.get(pk=first.pk).cancel("not needed")
        assert row.status == ExecutionStatus.PENDING  # a worker delivery ends it
    cancelled_soon(first)
    second = InLineReactor.run_async(key=key)
    # the line moved past the cancelled position: no 60 s poison-pill wait
    began = time.monotonic()
    assert second.wait(timeout=20).ok
    assert time.monotonic() - began < 15
    time.sleep(0.5)  # the cancelled one's delivery came and went
    assert ran("after", first) == []
    assert status(first) == ExecutionStatus.CANCELLED


def test_an_interrupted_execution_is_rolled_back_and_cannot_be_resumed(worker: Any) -> None:
    key = uuid.uuid4().hex[:8]
    paused = ApprovalReactor.run(key=key)
    assert paused.status == ExecutionStatus.INTERRUPTED
    execution = Execution.objects.get(pk=paused.execution_id)
    execution.cancel("approval withdrawn")
    assert execution.status == ExecutionStatus.CANCELLED
    assert len(ran("undo:charge", execution)) == 1
    with pytest.raises(ExecutionNotResumable):
        ApprovalReactor.resume(execution.pk, step="approval", payload={"ok": True}).unwrap()
    assert ran("after", execution) == []


def test_an_ended_execution_cannot_be_cancelled(worker: Any) -> None:
    done = InLineReactor.run(key=uuid.uuid4().hex[:8])
    assert done.ok
    execution = Execution.objects.get(pk=done.execution_id)
    with pytest.raises(ExecutionNotCancellable) as raised:
        execution.cancel("too late")
    assert raised.value.status == ExecutionStatus.SUCCEEDED  # type: ignore[attr-defined]
    assert status(execution) == ExecutionStatus.SUCCEEDED


# -- the API endpoint and the admin -----------------------------------------------------------

API = "/api/reactor/executions/{}/cancel/"


@pytest.fixture
def canceller(django_user_model: Any) -> Client:
    """Staff with the cancel permission."""
    return users.logged_in(users._staff(django_user_model, "canceller", "cancel_execution"))


@pytest.fixture
def viewer(django_user_model: Any) -> Client:
    """Staff who may read executions but not cancel them."""
    return users.logged_in(users._staff(django_user_model, "viewer"))


def post_json(client: Client, url: str, body: Any) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json")


def test_the_api_cancels_a_parked_execution_and_answers_each_error(
    worker: Any, canceller: Client, viewer: Client
) -> None:
    key = uuid.uuid4().hex[:8]
    side = hold_lock(f"cancel-side:{key}")
    try:
        parked = CancellableReactor.run_async(key=key, seconds=0)
        wait_until(lambda: parked_on(parked, "gated"), 30, message="it never parked on 'gated'")
        url = API.format(parked.pk)

        # permission-checked: staff without the permission is refused, nothing changes
        assert post_json(viewer, url, {"reason": "x"}).status_code == 403
        assert status(parked) == ExecutionStatus.PARKED
        # bad input: 400 naming the field, nothing changes
        for body in ({"reason": 42}, {"reason": "x", "force": True}, ["x"]):
            answer = post_json(canceller, url, body)
            assert answer.status_code == 400, (body, answer.content)
        assert status(parked) == ExecutionStatus.PARKED
        # unknown id: 404
        assert post_json(canceller, API.format(uuid.uuid4()), {"reason": "x"}).status_code == 404

        answer = post_json(canceller, url, {"reason": "fraud suspected"})
        # accepted: recorded and handed to a worker, the rollback not run in the request
        assert answer.status_code == 202, answer.content
        assert answer.json()["status"] == ExecutionStatus.PARKED
        row = cancelled_soon(parked)
        assert row.error["reason"] == "fraud suspected" and row.error["by"] == "canceller"
        assert len(ran("undo:charge", parked)) == 1
        (event,) = audit_events(parked)
        assert event.detail["by"] == "canceller"

        # an ended execution: 409 with a message
        again = post_json(canceller, url, {"reason": "twice"})
        assert again.status_code == 409
        assert "already ended (cancelled)" in again.json()["detail"]
    finally:
        wake(Coordinator().release(side, "success").woken)


def test_the_api_answers_202_for_a_running_execution_which_then_stops(
    worker: Any, canceller: Client
) -> None:
    key = uuid.uuid4().hex[:8]
    running = CancellableReactor.run_async(key=key, seconds=30)
    wait_until(lambda: ran("enter:work", running), 30, message="the work step never started")
    answer = post_json(canceller, API.format(running.pk), {})
    assert answer.status_code == 202, answer.content
    assert answer.json()["status"] == ExecutionStatus.RUNNING
    assert running.wait(timeout=20).status == ExecutionStatus.CANCELLED
    assert len(ran("undo:charge", running)) == 1


def test_the_admin_action_and_button_cancel_with_confirmation(
    worker: Any, canceller: Client, viewer: Client
) -> None:
    changelist = reverse("admin:reactor_app_execution_changelist")
    first = Execution.objects.get(pk=ApprovalReactor.run(key=uuid.uuid4().hex[:8]).execution_id)
    second = Execution.objects.get(pk=ApprovalReactor.run(key=uuid.uuid4().hex[:8]).execution_id)
    assert first.status == second.status == ExecutionStatus.INTERRUPTED
    selected = {"action": "cancel_selected", ACTION_CHECKBOX_NAME: [str(first.pk)]}

    # the action is offered only to who may cancel
    assert "cancel_selected" in canceller.get(changelist).content.decode()
    assert "cancel_selected" not in viewer.get(changelist).content.decode()

    # first a confirmation page (nothing cancelled yet), then the cancel
    confirm = canceller.post(changelist, selected)
    assert confirm.status_code == 200 and b"confirm-cancel" in confirm.content
    assert status(first) == ExecutionStatus.INTERRUPTED
    done = canceller.post(changelist, {**selected, "confirm": "yes", "reason": "batch cleanup"})
    assert done.status_code == 302
    row = Execution.objects.get(pk=first.pk)
    assert row.status == ExecutionStatus.CANCELLED and row.error["reason"] == "batch cleanup"
    assert len(ran("undo:charge", first)) == 1
    assert audit_events(first)[0].detail["by"] == "canceller"

    # the execution page's button: shown to who may cancel a live execution, with a confirm
    page = reverse("admin:reactor_app_execution_change", args=[second.pk])
    button = reverse("admin:reactor_app_execution_cancel", args=[second.pk])
    assert button in canceller.get(page).content.decode()
    assert button not in viewer.get(page).content.decode()
    assert viewer.get(button).status_code == 403
    assert viewer.post(button, {"reason": "no"}).status_code == 403
    assert status(second) == ExecutionStatus.INTERRUPTED
    assert b"confirm-cancel" in canceller.get(button).content
    assert status(second) == ExecutionStatus.INTERRUPTED  # a GET only confirms
    assert canceller.post(button, {"reason": "customer left"}).status_code == 302
    assert status(second) == ExecutionStatus.CANCELLED
    # no button on an ended execution
    assert button not in canceller.get(page).content.decode()
