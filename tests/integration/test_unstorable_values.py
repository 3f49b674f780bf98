"""Values the database cannot store fail with a structured error at the call, or fail the
step, and the run's end is always written (``reactor_app.storable``, ``serialization``).

Before, each of these reached an ``INSERT`` or ``UPDATE`` and failed it with a database error
(on PostgreSQL; SQLite took some of them): ``run_async`` and ``Reactor.run`` raised a raw
``DataError`` for an input holding a NUL character, a lone surrogate, NaN or an infinity, or
for an idempotency key with a NUL or over 255 characters; a step that returned such a value, or
raised an exception whose message quoted a NUL, left its run unable to write its end ("history
carried by an execution's final write failed") and its step runs dropped. Generated values put
the unstorable part at any depth, as a value or as a dict key.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor_app import Reactor, Step, Success, from_input, interrupt, step, value
from reactor_app.exceptions import (
    ExecutionNotRetryable,
    InputNotSerializable,
    InputValidationError,
    StepFailed,
)
from reactor_app.models import Execution, StepRun
from reactor_app.status import ExecutionStatus
from reactor_app.storable import text_problem
from reactor_app.write_behind import flush

pytestmark = pytest.mark.django_db(transaction=True)

plain = st.text(max_size=6).filter(lambda text: "\0" not in text)
unstorable = st.one_of(
    st.tuples(plain, plain).map(lambda pair: f"{pair[0]}\0{pair[1]}"),
    st.tuples(plain, st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)).map(
        lambda pair: pair[0] + pair[1]
    ),
    st.sampled_from([math.nan, math.inf, -math.inf]),
)


@st.composite
def holding_unstorable(draw: st.DrawFn) -> Any:
    bad = draw(unstorable)
    leaf: Any = {bad: "v"} if isinstance(bad, str) and draw(st.booleans()) else bad
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        leaf = draw(st.sampled_from([lambda x: [x], lambda x: {"in": x}, lambda x: (1, x)]))(leaf)
    return leaf


RETURNED: dict[str, Any] = {}


class Echo(Step):
    inputs = ("x",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(args["x"])


class Returns(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(RETURNED["value"])


class Raises(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        raise ValueError(RETURNED["value"])


class EchoReactor(Reactor):
    inputs = ("x",)
    echo = step(Echo, x=from_input("x"))


class ReturnsReactor(Reactor):
    returns_it = step(Returns)


class RaisesReactor(Reactor):
    raises_it = step(Raises)


quick = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@quick
@given(value=holding_unstorable())
def test_run_async_refuses_an_unstorable_input_before_writing_anything(value: Any) -> None:
    before = Execution.objects.count()
    with pytest.raises(InputNotSerializable, match="the database cannot store it") as raised:
        EchoReactor.run_async(x=value)
    assert "x" in raised.value.field_errors
    assert Execution.objects.count() == before


@quick
@given(value=holding_unstorable())
def test_a_step_returning_an_unstorable_value_fails_and_its_end_is_written(value: Any) -> None:
    RETURNED["value"] = value
    result = ReturnsReactor.run()
    assert isinstance(result.error, StepFailed), result
    assert "the database cannot store it" in result.error.message
    flush()
    row = Execution.objects.get(pk=result.execution_id)
    assert row.status == ExecutionStatus.FAILED
    assert "the database cannot store it" in row.error["message"]
    runs = StepRun.objects.filter(execution_id=result.execution_id)
    assert [run.status for run in runs] == ["failed"]  # not retried: it cannot be stored


@quick
@given(message=st.one_of(unstorable.filter(lambda v: isinstance(v, str)), plain))
def test_an_exception_quoting_any_text_fails_the_run_with_its_end_written(message: str) -> None:
    RETURNED["value"] = message
    result = RaisesReactor.run()
    assert isinstance(result.error, StepFailed)
    flush()
    row = Execution.objects.get(pk=result.execution_id)
    assert row.status == ExecutionStatus.FAILED
    stored = row.error["message"]
    assert text_problem(stored) is None
    assert "ValueError" in stored
    assert StepRun.objects.filter(execution_id=result.execution_id).count() == 1


def test_an_in_process_run_keeps_an_unstorable_input_as_its_repr_for_display() -> None:
    """In process the value is the caller's own object, so the run gets it; only the row's
    display copy of the inputs is stored as its repr. Returned as a result it fails the step,
    as on a worker (a result must survive the codec)."""
    result = EchoReactor.run(x="a\0b")
    assert isinstance(result.error, StepFailed)
    row = Execution.objects.get(pk=result.execution_id)
    assert row.inputs == {"x": repr("a\0b")}


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"idempotency_key": "order\0-1"}, "idempotency_key"),
        ({"idempotency_key": "k" * 256}, "idempotency_key"),
        ({"idempotency_key": "\ud800"}, "idempotency_key"),
        ({"debounce": ("burst\0", 1)}, "debounce"),
        ({"debounce": ("b" * 513, 1)}, "debounce"),
    ],
    ids=[
        "idempotency-nul",
        "idempotency-256",
        "idempotency-surrogate",
        "debounce-nul",
        "debounce-513",
    ],
)
def test_regression_run_async_options_the_database_cannot_store_are_input_errors(
    options: dict[str, Any], field: str
) -> None:
    """Each raised a raw ``DataError`` from the row's INSERT, or (a debounce key) was stored
    as a repr the burst's later starts did not match."""
    before = Execution.objects.count()
    with pytest.raises(InputValidationError) as raised:
        EchoReactor.run_async(x=1, **options)
    assert field in raised.value.field_errors
    assert Execution.objects.count() == before


class Sorts(Step):
    inputs = ("tags",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        if RETURNED.get("fail"):
            raise RuntimeError("the partner is down")
        return Success(sorted(args["tags"]))


class HandsOffAfterOne(Reactor):
    inputs = ("tags",)
    background = "after:one"
    one = step(Sorts, tags=from_input("tags"))
    two = step(Sorts, tags=from_input("tags"))


class WaitsForApproval(Reactor):
    inputs = ("tags",)
    one = step(Sorts, tags=from_input("tags"))
    approval = interrupt(correlation_id=lambda inputs: f"approve-{uuid.uuid4().hex}")
    two = step(Sorts, tags=from_input("tags"))


class StaysHere(Reactor):
    inputs = ("tags",)
    one = step(Sorts, tags=from_input("tags"))


@pytest.mark.parametrize("reactor", [HandsOffAfterOne, WaitsForApproval])
def test_regression_a_run_that_may_continue_elsewhere_refuses_inputs_it_could_not_read_back(
    reactor: type[Reactor],
) -> None:
    """Such a run reads its inputs back from the row in another process (the worker after
    the hand-off, the resume after the interrupt), where a set was only its ``repr``: step
    ``two`` would have sorted the characters of ``"{'a', 'b'}"``."""
    RETURNED["fail"] = False
    result = reactor.run(tags={"b", "a"})
    assert isinstance(result.error, InputNotSerializable), result
    assert "tags" in result.error.field_errors
    assert Execution.objects.get(pk=result.execution_id).status == ExecutionStatus.FAILED


def test_a_run_that_stays_in_process_takes_any_input_and_is_not_retried_from_its_copy() -> None:
    RETURNED["fail"] = False
    assert StaysHere.run(tags={"b", "a"}).value == {"one": ["a", "b"]}
    RETURNED["fail"] = True
    failed = StaysHere.run(tags={"b", "a"})
    assert failed.status == ExecutionStatus.FAILED
    row = Execution.objects.get(pk=failed.execution_id)
    with pytest.raises(ExecutionNotRetryable, match="kept for display only"):
        row.retry()
    # a run whose inputs the row holds as they were is retried as before
    plain = StaysHere.run(tags=["b", "a"])
    RETURNED["fail"] = False
    retried = Execution.objects.get(pk=plain.execution_id).retry()
    assert retried.status == ExecutionStatus.SUCCEEDED


class AllOnAWorker(Reactor):
    inputs = ("tags", "region")
    background = True
    one = step(Sorts, tags=from_input("tags"))


def test_a_call_that_failed_at_once_is_not_retried_from_a_display_copy_of_its_inputs() -> None:
    """A ``background = True`` run with a missing input fails at the call. Its row kept the
    inputs as display JSON; now, when the codec cannot hold one (a set), the row says it keeps
    only a display copy, and a retry from it is refused instead of running on the copy."""
    failed = AllOnAWorker.run(tags={"a"})
    assert failed.status == ExecutionStatus.FAILED
    assert "region" in failed.error.field_errors
    row = Execution.objects.get(pk=failed.execution_id)
    with pytest.raises(ExecutionNotRetryable, match="kept for display only"):
        row.retry()


RAN: list[str] = []
UNDONE: list[Any] = []


class Reserve(Step):
    inputs = ("tags",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        RAN.append("reserve")
        return Success("reserved")

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> Any:
        UNDONE.append(args["tags"])


class Refused(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        raise RuntimeError("refused after the approval")


class ReservesThenWaits(Reactor):
    reserve = step(Reserve, tags=value({"a"}))
    approval = interrupt(correlation_id=lambda inputs: f"reserve-{uuid.uuid4().hex}")
    refuse = step(Refused)


class UsesASetWithoutHooks(Reactor):
    sort = step(Sorts, tags=value({"b", "a"}))


def test_regression_a_step_with_an_undo_refuses_arguments_its_undo_could_not_get_back() -> None:
    """The undo gets the arguments from the rollback log, read back from the row in a later
    pass — here the one after the interrupt — where a set was only its repr: the undo received
    the text ``"{'a'}"``. Now the step fails before its body, in every mode."""
    RAN.clear()
    UNDONE.clear()
    result = ReservesThenWaits.run()
    assert isinstance(result.error, InputNotSerializable), result
    assert result.error.step == "reserve" and "arguments" in result.error.field_errors
    assert RAN == [] and UNDONE == []


def test_a_step_without_hooks_keeps_no_arguments_and_takes_any() -> None:
    RETURNED["fail"] = False
    assert UsesASetWithoutHooks.run().value == {"sort": ["a", "b"]}
