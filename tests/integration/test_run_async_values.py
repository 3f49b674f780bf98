"""``run_async`` hands a worker the values the caller passed, and tells them apart (issue 30).

* A tuple input reaches the worker's step as a tuple (it arrived as a list).
* An idempotency key compares inputs by their stored form: ``amount=True`` is not the same
  call as ``amount=1`` (Python's ``True == 1`` matched them), nor ``1`` as ``1.0``.
* ``wait()`` on an execution whose task could not be sent says so, and that the sweeper will
  send it — not that no worker consumes the queue.

Deliveries run in this process (``deliver`` is the task's body); what they enqueue goes to a
queue nobody reads, removed afterwards. The broker refusing a send is a patched
``apply_async`` raising the error kombu raises when the broker is down (as in
``test_run_async_contract``): a real broker outage would take Celery's connection retries.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu.exceptions import OperationalError

from reactor_app import (
    Reactor,
    Step,
    Success,
    async_step,
    element,
    from_input,
    from_result,
    map_step,
    step,
    value,
)
from reactor_app.engine.dispatch import deliver, sweep
from reactor_app.exceptions import IdempotencyKeyReused, InputNotSerializable
from reactor_app.models import Execution
from reactor_app.serialization import decode
from reactor_app.status import ExecutionStatus

pytestmark = pytest.mark.django_db(transaction=True)

SEEN: list[Any] = []


class Keep(Step):
    inputs = ("amount",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        SEEN.append(args["amount"])
        return Success(args["amount"])


class Pay(Reactor):
    inputs = ("amount",)
    keep = step(Keep, amount=from_input("amount"))


@pytest.fixture
def nobody_queue(nobody_queue: str) -> str:
    SEEN.clear()
    return nobody_queue


def test_a_tuple_input_reaches_the_worker_as_a_tuple(nobody_queue: str) -> None:
    execution = Pay.run_async(amount=(10, "EUR"))
    assert deliver(str(execution.id))["status"] == ExecutionStatus.SUCCEEDED
    assert SEEN == [(10, "EUR")] and type(SEEN[0]) is tuple
    # and the result read back from the row is the tuple the step returned
    assert Execution.objects.get(pk=execution.pk).to_result().value == {"keep": (10, "EUR")}


@pytest.mark.parametrize(("first", "then"), [(True, 1), (1, True), (1, 1.0), (0.0, False)])
def test_an_idempotency_key_tells_apart_values_python_calls_equal(
    nobody_queue: str, first: Any, then: Any
) -> None:
    assert first == then  # the same to Python, different calls to a worker
    key = f"order-{uuid.uuid4().hex[:6]}"
    execution = Pay.run_async(amount=first, idempotency_key=key)
    with pytest.raises(IdempotencyKeyReused) as raised:
        Pay.run_async(amount=then, idempotency_key=key)
    assert raised.value.execution_id == str(execution.pk)
    # the very same call still returns the first execution
    assert Pay.run_async(amount=first, idempotency_key=key).pk == execution.pk
    assert Execution.objects.count() == 1


def test_wait_after_a_failed_send_says_so_and_names_the_sweeper(
    nobody_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reactor_app.tasks import run_execution

    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("Error 111 connecting to the broker. Connection refused.")

    with monkeypatch.context() as patched:
        patched.setattr(run_execution, "apply_async", broker_down)
        unsent = Pay.run_async(amount=5)
    with pytest.raises(TimeoutError) as waited:
        unsent.wait(timeout=0.2)
    message = str(waited.value)
    assert "sending it to the broker failed" in message
    assert "OperationalError: Error 111" in message
    assert "the sweeper" in message and "REACTOR_SWEEP_AFTER" in message
    assert "no worker has taken it" not in message

    # a send that worked is explained by the queue nobody consumes, as before
    sent = Pay.run_async(amount=6)
    with pytest.raises(TimeoutError, match="no worker has taken it") as waited:
        sent.wait(timeout=0.2)
    assert "broker failed" not in str(waited.value)

    # once the sweeper has sent the first one, its failed send no longer explains anything
    # (the sweep, run an hour ahead here, stamps that hour as the row's heartbeat: the wait
    # then reads the row as not due before it, engine.result._deferred_hint)
    assert str(unsent.id) in sweep(now=timezone.now() + timedelta(hours=1))
    with pytest.raises(TimeoutError) as waited:
        unsent.wait(timeout=0.2)
    assert "broker failed" not in str(waited.value)
    assert "not due before" in str(waited.value)


class Tagged(Step):
    inputs = ("amount", "tags")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        SEEN.append(args["tags"])
        return Success(None)


class HandsOnASet(Reactor):
    inputs = ("amount",)
    later = async_step(Tagged, amount=from_input("amount"), tags=value({"vip", "eu"}))


class MapsWithASet(Reactor):
    inputs = ("amounts",)
    each = map_step(
        Tagged, over=from_input("amounts"), parallel=True, amount=element(), tags=value({"eu"})
    )


@pytest.mark.parametrize("reactor", [HandsOnASet, MapsWithASet])
def test_regression_a_worker_child_gets_the_arguments_passed_or_the_step_fails(
    nobody_queue: str, reactor: type[Reactor]
) -> None:
    """An argument the codec cannot hold (here a set, from ``value(...)``) was stored as its
    ``repr``: the child's step would have received the text ``"{'eu'}"``. Now the step that
    hands it on fails with ``InputNotSerializable`` and no child is created."""
    inputs = {"amount": 5} if reactor is HandsOnASet else {"amounts": [1, 2]}
    execution = reactor.run_async(**inputs)
    outcome = deliver(str(execution.id))
    assert outcome["status"] == ExecutionStatus.FAILED, outcome
    row = Execution.objects.get(pk=execution.pk)
    assert row.error["type"] == InputNotSerializable.__name__
    assert "is a builtins.set" in row.error["message"]
    assert not Execution.objects.filter(parent=execution.pk).exists()
    assert SEEN == []


UNDONE: list[Any] = []


class Charge(Step):
    inputs = ("amount",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success({"charged": args["amount"]})

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> Any:
        UNDONE.append(args["amount"])


class Refuse(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        raise RuntimeError("refused after the charge")


class ChargesThenFails(Reactor):
    inputs = ("amount",)
    charge = async_step(Charge, amount=from_input("amount"))
    wait_for_it = step(Keep, amount=from_result("charge"))
    refuse = step(Refuse)


class ChargesEachThenFails(Reactor):
    inputs = ("amounts",)
    charge = map_step(Charge, over=from_input("amounts"), parallel=True, amount=element())
    refuse = step(Refuse)


def deliver_tree(root_id: str) -> dict[str, Any]:
    """Deliver the root, then every pending child, then the root again, until it ends."""
    for _ in range(10):
        outcome = deliver(root_id)
        if outcome["status"] not in (ExecutionStatus.PARKED, ExecutionStatus.PENDING):
            return outcome
        for child in Execution.objects.filter(root_id=root_id, status=ExecutionStatus.PENDING):
            if str(child.pk) != root_id:
                deliver(str(child.pk))
    raise AssertionError("the tree did not end")


@pytest.mark.parametrize("reactor", [ChargesThenFails, ChargesEachThenFails])
def test_regression_a_worker_childs_undo_gets_its_arguments_as_the_same_values(
    nobody_queue: str, reactor: type[Reactor]
) -> None:
    """An async step's (or a parallel element's) arguments were kept in the parent's state as
    display JSON: when a later step failed, its undo received ``"10.50"`` where the step had
    been given ``Decimal("10.50")``."""
    UNDONE.clear()
    amount = Decimal("10.50")
    inputs = {"amount": amount} if reactor is ChargesThenFails else {"amounts": [amount]}
    execution = reactor.run_async(**inputs)
    outcome = deliver_tree(str(execution.id))
    assert outcome["status"] == ExecutionStatus.FAILED, outcome
    assert [amount] == UNDONE and type(UNDONE[0]) is Decimal


floats = st.floats(allow_nan=False, allow_infinity=False)
float_values = st.one_of(
    floats,
    st.sampled_from([-0.0, 1e16, -1e16, 1.5e16, 9007199254740993.0, 1e308, 5e-324]),
    st.lists(floats, max_size=3),
    st.dictionaries(st.sampled_from(["a", "b"]), floats, max_size=2),
)


def same_floats(a: Any, b: Any) -> bool:
    """Equal, type for type, with the sign of a zero: ``==`` takes ``-0.0`` for ``0.0`` and
    ``1e16`` for ``10**16``."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same_floats(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_floats(a[k], b[k]) for k in a)
    return repr(a) == repr(b)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(amount=float_values)
def test_a_float_comes_back_from_the_database_as_the_same_float(
    nobody_queue: str, amount: Any
) -> None:
    """PostgreSQL's ``jsonb`` keeps numbers as ``numeric``: ``-0.0`` came back ``0.0`` and a
    float from ``1e16`` up came back as an int (``1e+16`` written back ``10000000000000000``).
    A worker's step got another value, and the same call with the same idempotency key was
    refused as another call (``IdempotencyKeyReused``)."""
    SEEN.clear()
    key = f"float-{uuid.uuid4().hex}"
    execution = Pay.run_async(amount=amount, idempotency_key=key)
    stored = Execution.objects.get(pk=execution.pk)
    assert same_floats(decode(stored.inputs)["amount"], amount)
    assert Pay.run_async(amount=amount, idempotency_key=key).pk == execution.pk
    assert deliver(str(execution.id))["status"] == ExecutionStatus.SUCCEEDED
    assert len(SEEN) == 1 and same_floats(SEEN[0], amount)
    result = Execution.objects.get(pk=execution.pk).to_result()
    assert same_floats(result.value["keep"], amount)
