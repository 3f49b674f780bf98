"""What a failed run reports (issue 30, item 4): where it stopped, and why, in its own words.

* The current step of a failed in-process run is the failing step, as for the same run on a
  worker. Before, an in-process run's progress was written behind and dropped by its final
  write, so a run that failed in ``charge`` showed ``reserve`` (its first step) in the admin
  and the API.
* ``Failure("out of stock")`` is reported as "failed: out of stock" with that text as its
  cause — not as an invented ``RuntimeError: out of stock``. A raised exception keeps its type.

Worker deliveries run in this process (``deliver`` is the task's body); what they enqueue goes
to a queue nobody reads, removed afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app import Failure, Reactor, Step, Success, from_input, step
from reactor_app.engine.dispatch import deliver
from reactor_app.exceptions import FailureReason, StepFailed
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus

pytestmark = pytest.mark.django_db(transaction=True)

#: what each compensate received
COMPENSATED: list[BaseException] = []


class Reserve(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success("r-1")


class Charge(Step):
    inputs = ("why",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        why = args["why"]
        if why == "raise":
            raise ValueError("card declined")
        if why == "nothing":
            return Failure(retryable=False)
        return Failure(why, retryable=False)

    def compensate(self, error: BaseException, args: dict[str, Any], context: Any) -> Any:
        COMPENSATED.append(error)


class Email(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success("sent")


class PlaceOrder(Reactor):
    inputs = ("why",)

    reserve = step(Reserve)
    charge = step(Charge, why=from_input("why"))
    email = step(Email)


PATH = PlaceOrder.path()


@pytest.fixture
def nobody_queue(nobody_queue: str) -> str:
    COMPENSATED.clear()
    return nobody_queue


def test_a_failed_in_process_run_shows_the_failing_step_as_on_a_worker(
    nobody_queue: str, admin_client: Any
) -> None:
    in_process = PlaceOrder.run(why="out of stock")
    assert in_process.status == ExecutionStatus.FAILED
    on_worker = PlaceOrder.run_async(why="out of stock")
    assert deliver(str(on_worker.id))["status"] == ExecutionStatus.FAILED

    for execution_id in (in_process.execution_id, on_worker.id):
        row = Execution.objects.get(pk=execution_id)
        assert row.current_step == "charge", (row.current_step, row.context)
        shown = admin_client.get(f"/api/reactor/executions/{execution_id}/").json()
        assert shown["current_step"] == "charge"


def test_a_failure_with_a_plain_reason_names_no_exception_type(nobody_queue: str) -> None:
    result = PlaceOrder.run(why="out of stock")
    error = result.error
    assert isinstance(error, StepFailed)
    assert str(error) == f"step 'charge' of {PATH} failed: out of stock"
    assert error.cause == "out of stock"
    stored = Execution.objects.get(pk=result.execution_id).error
    assert stored["message"] == f"step 'charge' of {PATH} failed: out of stock"
    assert stored["cause"] == "out of stock"
    assert "RuntimeError" not in repr(stored)
    # compensate still receives an exception, carrying the reason as given
    (received,) = COMPENSATED
    assert isinstance(received, FailureReason)
    assert str(received) == "out of stock" and received.error == "out of stock"


def test_the_same_failure_reads_the_same_on_a_worker(nobody_queue: str) -> None:
    execution = PlaceOrder.run_async(why="out of stock")
    deliver(str(execution.id))
    stored = Execution.objects.get(pk=execution.id).error
    assert stored["message"] == f"step 'charge' of {PATH} failed: out of stock"
    assert stored["cause"] == "out of stock"


def test_a_raised_exception_keeps_its_type_and_no_reason_adds_no_text(
    nobody_queue: str,
) -> None:
    raised = PlaceOrder.run(why="raise").error
    assert str(raised) == f"step 'charge' of {PATH} failed: ValueError: card declined"
    assert raised.fields()["cause"] == {"type": "ValueError", "message": "card declined"}
    bare = PlaceOrder.run(why="nothing").error
    assert str(bare) == f"step 'charge' of {PATH} failed"
