"""Hand-offs to workers: async_step, async_reactor, background, and the deadlock guard (SC-007).

Ownership never crosses a process hand-off: a hand-off of work declaring a key the execution
holds is refused before anything is created or enqueued. Without that overlap the hand-off runs
on a real worker, which takes the coordination itself under its own id.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

from reactor_app import Reactor, async_step, from_input, step, with_lock
from reactor_app.exceptions import HandOffRefused
from reactor_app.models import CoordinationEvent, Execution, StepRun
from reactor_app.status import CoordinationEventKind, ExecutionStatus, StepRunKind
from reactor_app.testing import assert_not_locked
from tests.worker.helpers import queue_length
from tests.worker.reactors import (
    AfterFirstReactor,
    AsyncPaymentReactor,
    AuditStep,
    ChargeStep,
    DeadlockingParentReactor,
    NarrowedReactor,
    ParentReactor,
    account_key,
    records,
)

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = {"REACTOR_CONTENTION_BACKOFF": [0.3, 1.0]}


@with_lock(account_key, ttl=30)
class DeadlockingReactor(Reactor):
    """Holds acct:<id> at reactor level, runs ``audit`` (which records its undo), then hands a
    step declaring the same key to a worker. Refused at dispatch, so it never leaves this
    process."""

    inputs = ("account_id", "hold")

    audit = step(AuditStep, account_id=from_input("account_id"))
    charge = async_step(ChargeStep, account_id=from_input("account_id"), hold=from_input("hold"))


@pytest.fixture
def unconsumed_queue(settings: Any) -> str:
    """A queue no worker reads, so whatever is enqueued stays countable."""
    queue = f"reactor-nobody-{uuid.uuid4().hex[:8]}"
    settings.REACTOR_CELERY_QUEUE = queue
    return queue


def test_deadlocking_async_step_is_refused_at_dispatch(unconsumed_queue: str) -> None:
    """SC-007: refused with key, holder and remedies; nothing created, nothing enqueued."""
    result = DeadlockingReactor.run(account_id=1, hold=0.01)

    assert result.status == ExecutionStatus.FAILED
    error = result.error
    assert isinstance(error, HandOffRefused)
    assert error.key == "acct:1" and error.primitive == "lock" and error.step == "charge"
    assert error.holder["execution"] == result.execution_id
    assert error.holder["step"] is None  # held at reactor level
    for text in (
        "acct:1",
        result.execution_id,
        "reactor-level lock",
        "compose(",
        "step(",
        "narrow",
    ):
        assert text in error.message, text
    # nothing was handed on: no child execution, no message on the broker
    assert Execution.objects.count() == 1
    assert queue_length(unconsumed_queue) == 0
    event = CoordinationEvent.objects.get(kind=CoordinationEventKind.HANDOFF_REFUSED)
    assert (event.key, event.step, str(event.execution_id)) == (
        "acct:1",
        "charge",
        result.execution_id,
    )
    # the step before it ran once and is undone as for any failure; the refused step, which
    # never started, is not compensated; the outer lock is released
    assert [r["execution"] for r in records("audit")] == [result.execution_id]
    assert records("rollback") == [
        {"step": "audit", "kind": "undo", "execution": result.execution_id}
    ]
    assert result.rollback_failures == []
    assert_not_locked("acct:1")


def test_deadlocking_async_reactor_is_refused_at_dispatch(unconsumed_queue: str) -> None:
    result = DeadlockingParentReactor.run(account_id=2, hold=0.01)

    assert isinstance(result.error, HandOffRefused)
    assert result.error.key == "acct:2"
    assert "ChildPaymentReactor" in result.error.message
    assert Execution.objects.count() == 1
    assert queue_length(unconsumed_queue) == 0


def test_a_hand_off_onto_a_held_limit_one_semaphore_is_refused(unconsumed_queue: str) -> None:
    """A semaphore of one slot is as exclusive as a lock: handing it off would deadlock."""
    from reactor_app import Reactor, Step, Success, async_step, from_input, step, with_semaphore

    def pool(values: dict[str, Any]) -> str:
        return f"pool:{values['account_id']}"

    @with_semaphore(pool, limit=1)
    class Settle(Step):
        inputs = ("account_id",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success("settled")

    class Prepare(Step):
        inputs = ("account_id",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success("prepared")

    @with_semaphore(pool, limit=1)
    class SingleSlotReactor(Reactor):
        inputs = ("account_id",)
        prepare = step(Prepare, account_id=from_input("account_id"))
        settle = async_step(Settle, account_id=from_input("account_id"))

    result = SingleSlotReactor.run(account_id=4)
    assert isinstance(result.error, HandOffRefused)
    assert (result.error.key, result.error.primitive) == ("pool:4", "semaphore")
    assert Execution.objects.count() == 1
    assert queue_length(unconsumed_queue) == 0


def test_the_same_hand_off_without_the_outer_hold_is_enqueued(unconsumed_queue: str) -> None:
    """Control for the two tests above: the measurement does see an enqueue."""
    execution = NarrowedReactor.run_async(account_id=3, hold=0.01)
    assert queue_length(unconsumed_queue) == 1
    Execution.objects.filter(pk=execution.pk).update(status=ExecutionStatus.FAILED)


def test_async_step_runs_in_its_own_task_on_a_worker(worker: Any) -> None:
    """A worker parent parks while its async step runs, and is woken when it ends."""
    execution = AsyncPaymentReactor.run_async(account_id=4, hold=0.3)

    result = execution.wait(timeout=60)

    assert result.ok, result.error
    assert result.value == {"charged": 4}
    child = Execution.objects.get(parent=execution)
    assert child.status == ExecutionStatus.SUCCEEDED
    assert child.context["dispatch"] == {"kind": "async_step", "step": "charge"}
    # the lock was taken in the worker, owned by the async step's own execution
    acquired = CoordinationEvent.objects.get(kind=CoordinationEventKind.ACQUIRED, key="acct:4")
    assert acquired.owner == str(child.id) and acquired.execution_id == child.id
    assert [r["execution"] for r in records("charge")] == [str(child.id)]
    assert [r["execution"] for r in records("notify")] == [str(execution.id)]


def test_a_synchronous_reader_blocks_for_the_async_step(worker: Any) -> None:
    result = AsyncPaymentReactor.run(account_id=5, hold=0.2)

    assert result.ok, result.error
    assert result.value == {"charged": 5}
    charge = records("charge")[0]
    assert charge["pid"] != os.getpid()  # the body ran on the worker
    # the dispatcher never took the step's coordination
    events = CoordinationEvent.objects.filter(key="acct:5", kind=CoordinationEventKind.ACQUIRED)
    assert [str(e.execution_id) for e in events] == [charge["execution"]]
    assert charge["execution"] != result.execution_id


def test_async_reactor_is_an_independent_child_execution(worker: Any) -> None:
    execution = ParentReactor.run_async(account_id=6, hold=0.05)

    result = execution.wait(timeout=60)

    assert result.ok, result.error
    child = Execution.objects.get(parent=execution)
    assert child.root_id == child.id  # its own tree, its own owner
    assert child.status == ExecutionStatus.SUCCEEDED
    assert child.result == {"charge": {"charged": 6}}
    owners = set(CoordinationEvent.objects.filter(key="acct:6").values_list("owner", flat=True))
    assert owners == {str(child.id)}


def test_background_after_a_step_hands_the_rest_to_a_worker(worker: Any) -> None:
    result = AfterFirstReactor.run(first_label="here", second_label="there")

    assert result.status == "handed_off"
    execution = Execution.objects.get(pk=result.execution_id)
    final = execution.wait(timeout=30)
    assert final.ok, final.error
    pids = {r["label"]: r["pid"] for r in records("pids")}
    assert pids["here"] == os.getpid()
    assert pids["there"] != os.getpid()
    assert not StepRun.objects.exclude(kind=StepRunKind.RUN).exists()
