"""``run_async``'s contract for a project adopting reactor_app: what raises at the call, what
never does (the broker), idempotency keys, a reactor a worker cannot import, and what
``wait()`` says when nobody consumes the queue.

Deliveries run in this process (``deliver`` is the task's body); what they enqueue goes to a
queue nobody reads, removed afterwards.
"""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from kombu.exceptions import OperationalError

from reactor_app import Reactor, Step, Success, async_step, from_input, step, with_lock
from reactor_app.engine.dispatch import deliver, sweep
from reactor_app.exceptions import (
    IdempotencyKeyReused,
    InputNotSerializable,
    InputValidationError,
)
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus

pytestmark = pytest.mark.django_db(transaction=True)

SEEN: list[dict[str, Any]] = []


class Record(Step):
    inputs = ("amount", "day")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        SEEN.append(dict(args))
        return Success({"amount": args["amount"], "day": args["day"]})


class ChargeReactor(Reactor):
    inputs = ("amount", "day")
    record = step(Record, amount=from_input("amount"), day=from_input("day"))


@pytest.fixture
def nobody_queue(nobody_queue: str) -> str:
    SEEN.clear()
    return nobody_queue


def test_inputs_json_cannot_hold_raise_at_the_call(nobody_queue: str) -> None:
    with pytest.raises(InputNotSerializable, match="input 'amount'") as raised:
        ChargeReactor.run_async(amount={1, 2}, day=date(2026, 1, 1))
    assert isinstance(raised.value, TypeError)  # as Celery/kombu users expect
    assert set(raised.value.field_errors) == {"amount"}
    assert not Execution.objects.exists()  # nothing stored, nothing enqueued


def test_a_missing_input_raises_instead_of_returning_a_failed_row(nobody_queue: str) -> None:
    with pytest.raises(InputValidationError) as raised:
        ChargeReactor.run_async(amount=Decimal("1"))
    assert raised.value.field_errors == {"day": "required"}
    assert not Execution.objects.exists()


def test_decimal_and_date_inputs_reach_the_worker_as_the_same_values(nobody_queue: str) -> None:
    execution = ChargeReactor.run_async(amount=Decimal("10.50"), day=date(2026, 11, 30))
    assert deliver(str(execution.id))["status"] == ExecutionStatus.SUCCEEDED
    assert [{"amount": Decimal("10.50"), "day": date(2026, 11, 30)}] == SEEN
    assert type(SEEN[0]["amount"]) is Decimal
    # what wait() returns is the same value the step returned, as in-process
    value = Execution.objects.get(pk=execution.pk).to_result().value
    assert value == {"record": {"amount": Decimal("10.50"), "day": date(2026, 11, 30)}}


def test_the_api_and_admin_show_stored_values_plainly(
    nobody_queue: str, client: Any, django_user_model: Any
) -> None:
    execution = ChargeReactor.run_async(amount=Decimal("10.50"), day=date(2026, 11, 30))
    deliver(str(execution.id))
    staff = django_user_model.objects.create_superuser("viewer", "v@example.com", "pw")
    client.force_login(staff)
    shown = client.get(f"/api/reactor/executions/{execution.pk}/").json()
    assert shown["inputs"] == {"amount": "10.50", "day": "2026-11-30"}
    assert shown["result"] == {"record": {"amount": "10.50", "day": "2026-11-30"}}
    page = client.get(f"/admin/reactor_app/execution/{execution.pk}/change/")
    assert page.status_code == 200
    assert "__reactor_type__" not in page.content.decode()


def test_broker_trouble_never_raises_and_the_sweeper_sends_the_row(
    nobody_queue: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from reactor_app.tasks import run_execution

    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("Error 111 connecting to the broker. Connection refused.")

    with monkeypatch.context() as patched:
        patched.setattr(run_execution, "apply_async", broker_down)
        execution = ChargeReactor.run_async(amount=Decimal("5"), day=date(2026, 1, 1))
    assert "the sweeper" in caplog.text
    execution.refresh_from_db()
    assert execution.status == ExecutionStatus.PENDING  # committed: it will run, exactly once
    later = timezone.now() + timedelta(hours=1)
    assert sweep(now=later) == [str(execution.id)]  # the broker is back: sent now
    assert deliver(str(execution.id))["status"] == ExecutionStatus.SUCCEEDED


def test_the_same_idempotency_key_returns_the_same_execution(nobody_queue: str) -> None:
    first = ChargeReactor.run_async(
        amount=Decimal("5"), day=date(2026, 1, 1), idempotency_key="o-1"
    )
    again = ChargeReactor.run_async(
        amount=Decimal("5"), day=date(2026, 1, 1), idempotency_key="o-1"
    )
    assert again.pk == first.pk
    assert Execution.objects.count() == 1
    with pytest.raises(IdempotencyKeyReused) as raised:
        ChargeReactor.run_async(amount=Decimal("6"), day=date(2026, 1, 1), idempotency_key="o-1")
    assert raised.value.execution_id == str(first.pk)
    other = ChargeReactor.run_async(
        amount=Decimal("5"), day=date(2026, 1, 1), idempotency_key="o-2"
    )
    assert other.pk != first.pk


def test_the_key_is_unique_in_the_database(nobody_queue: str) -> None:
    from django.db import IntegrityError, transaction

    ChargeReactor.run_async(amount=Decimal("5"), day=date(2026, 1, 1), idempotency_key="dup")
    with pytest.raises(IntegrityError), transaction.atomic():
        Execution.objects.start(reactor="x.Y", inputs={}, idempotency_key="dup")


@pytest.mark.parametrize(
    ("reactor_path", "says"),
    [
        ("tests.integration.no_such_module.GoneReactor", "importing its module failed"),
        ("tests.integration.test_run_async_contract.RenamedReactor", "stale deployment"),
        ("tests.integration.test_run_async_contract.make.<locals>.Inner", "inside a function"),
        ("__main__.ShellReactor", "interactive shell"),
    ],
)
def test_an_unimportable_reactor_fails_its_execution_once_with_the_reason(
    nobody_queue: str, reactor_path: str, says: str
) -> None:
    execution = Execution.objects.start(
        reactor=reactor_path,
        inputs={},
        status=ExecutionStatus.PENDING,
        heartbeat_at=timezone.now() - timedelta(hours=1),
        context={"version": 1, "worker": True},
    )
    summary = deliver(str(execution.id))
    assert summary["outcome"] == "failed"
    execution.refresh_from_db()
    assert execution.status == ExecutionStatus.FAILED
    assert execution.finished_at is not None
    assert execution.error["type"] == "ReactorNotRegistered"
    assert execution.error["reactor"] == reactor_path
    assert says in execution.error["message"]
    assert reactor_path in execution.error["message"]
    # terminal: the sweeper never sends it again
    assert sweep(now=timezone.now() + timedelta(days=1)) == []
    with pytest.raises(Exception, match="not available in this process"):
        execution.to_result().unwrap()


def test_wait_on_a_pending_execution_names_the_queue_nobody_consumes(nobody_queue: str) -> None:
    execution = ChargeReactor.run_async(amount=Decimal("1"), day=date(2026, 1, 1))
    with pytest.raises(TimeoutError) as raised:
        execution.wait(timeout=0.2)
    message = str(raised.value)
    assert f"the Celery queue {nobody_queue!r}" in message
    assert f"-Q {nobody_queue}" in message


def test_without_a_configured_queue_tasks_go_to_celerys_default_queue(settings: Any) -> None:
    from reactor_app.engine.result import task_queue
    from reactor_app.tasks import run_execution

    del settings.REACTOR_CELERY_QUEUE
    assert task_queue() == run_execution.app.conf.task_default_queue


COMPENSATED: list[str] = []


class ReturnsASet(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success({"tags": {"a", "b"}})

    def compensate(self, error: BaseException, args: dict[str, Any], context: Any) -> None:
        COMPENSATED.append(type(error).__name__)


class SetReactor(Reactor):
    inputs = ()
    tag = step(ReturnsASet)


def test_a_step_result_that_cannot_be_stored_fails_the_step_in_every_mode() -> None:
    """In-process as on a worker: a later pass could not read it back, so it fails here too."""
    COMPENSATED.clear()
    result = SetReactor.run()
    assert result.status == ExecutionStatus.FAILED
    assert "the result of step 'tag'" in result.error.message
    assert "builtins.set" in result.error.message
    assert COMPENSATED == ["TypeError"]  # the body ran: its compensation runs, once (no retry)


def test_decimal_results_stay_decimal_for_later_steps(nobody_queue: str) -> None:
    result = ChargeReactor.run(amount=Decimal("2.50"), day=date(2026, 1, 1))
    assert result.ok
    assert [{"amount": Decimal("2.50"), "day": date(2026, 1, 1)}] == SEEN


@pytest.mark.parametrize("priority", [101, -101, True, "high", 1.5])
def test_a_priority_out_of_range_or_not_an_int_raises_at_the_call(
    nobody_queue: str, priority: Any
) -> None:
    with pytest.raises(InputValidationError, match="priority") as raised:
        ChargeReactor.run_async(amount=1, day=date(2026, 1, 1), priority=priority)
    assert "priority" in (raised.value.field_errors or {})
    assert not Execution.objects.exists()


def test_the_priority_is_kept_in_the_state_every_delivery_waits_with(nobody_queue: str) -> None:
    """Stored with the execution (a park's, a requeue's delivery reads it back), not only on
    the first message; the default priority stores nothing."""
    urgent = ChargeReactor.run_async(amount=1, day=date(2026, 1, 1), priority=40)
    plain = ChargeReactor.run_async(amount=2, day=date(2026, 1, 1))
    assert Execution.objects.get(pk=urgent.pk).context["priority"] == 40
    assert "priority" not in Execution.objects.get(pk=plain.pk).context
    deliver(str(urgent.id))  # a whole pass rewrites the state: the priority stays
    finished = Execution.objects.get(pk=urgent.pk)
    assert finished.status == ExecutionStatus.SUCCEEDED
    assert finished.context["priority"] == 40


def _message_priorities(queue: str) -> list[Any]:
    """The priorities of the messages waiting in ``queue``, consumed (nobody else reads it)."""
    from celery import current_app

    found = []
    with current_app.connection_for_read() as connection:
        channel = connection.default_channel
        while True:
            message = channel.basic_get(queue, no_ack=True)
            if message is None:
                return found
            found.append(message.properties.get("priority"))


@with_lock(lambda inputs: f"contract:{inputs['amount']}", ttl=30)
class LockedCharge(Reactor):
    inputs = ("amount", "day")
    record = step(Record, amount=from_input("amount"), day=from_input("day"))


def test_the_messages_carry_the_priority_on_the_broker_scale(
    nobody_queue: str, settings: Any
) -> None:
    """The first message and a park's requeue carry the execution's priority (on the Redis
    transport the default is the scale's 0, so the lowest priority shows it)."""
    from reactor_app.coordination.admission import Coordinator
    from reactor_app.coordination.claims import Admitted, Holder, LockClaim
    from reactor_app.engine.priority import celery_priority

    settings.REACTOR_WORKER_WAIT = 0
    plain = ChargeReactor.run_async(amount=1, day=date(2026, 1, 1))
    default = _message_priorities(nobody_queue)
    lowest = celery_priority(-100)
    assert default != [lowest]

    held = Coordinator().admit([LockClaim("contract:7")], Holder(owner="test"))
    assert isinstance(held, Admitted)
    parked = LockedCharge.run_async(amount=7, day=date(2026, 1, 1), priority=-100)
    assert _message_priorities(nobody_queue) == [lowest]
    deliver(str(parked.id))  # refused: parks, and its requeue is sent
    assert Execution.objects.get(pk=parked.pk).status == ExecutionStatus.PARKED
    assert _message_priorities(nobody_queue) == [lowest]
    Coordinator().release(held, "success")
    assert plain.pk != parked.pk


class WithChild(Reactor):
    inputs = ("amount", "day")
    record = async_step(Record, amount=from_input("amount"), day=from_input("day"))


def test_a_dispatched_child_waits_and_is_sent_with_its_parents_priority(
    nobody_queue: str,
) -> None:
    from reactor_app.engine.priority import celery_priority

    parent = WithChild.run_async(amount=3, day=date(2026, 1, 1), priority=-60)
    assert _message_priorities(nobody_queue) == [celery_priority(-60)]
    deliver(str(parent.id))  # dispatches the async step to a worker, as a child execution
    child = Execution.objects.get(parent_id=parent.id)
    assert child.context["priority"] == -60
    assert celery_priority(-60) in _message_priorities(nobody_queue)
