"""The synchronous saga engine: ordering, outcomes, retries, rollback, composition, mapping."""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app import (
    Failure,
    Halt,
    Reactor,
    Retries,
    Skipped,
    Step,
    Success,
    compose,
    element,
    from_input,
    from_result,
    map_step,
    step,
    value,
)
from reactor_app.engine.clock import FakeClock, use_clock
from reactor_app.exceptions import (
    ArgumentResolutionError,
    InputValidationError,
    RetriesExhausted,
    StepFailed,
)
from reactor_app.models import Execution, StepRun
from reactor_app.signals import engine_event

pytestmark = pytest.mark.django_db

LOG: list[str] = []


@pytest.fixture(autouse=True)
def events() -> Any:
    LOG.clear()
    seen: list[tuple[str, str | None]] = []

    def receiver(sender: Any, kind: str, execution: Any, **payload: Any) -> None:
        seen.append((kind, payload.get("step")))

    engine_event.connect(receiver, weak=False)
    yield seen
    engine_event.disconnect(receiver)


class Recorder(Step):
    """Logs run/undo/compensate; behaviour chosen by arguments."""

    inputs = ("name",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        LOG.append(f"run:{args['name']}")
        if args.get("fail"):
            raise RuntimeError(f"{args['name']} broke")
        return Success({"name": args["name"], "n": len(LOG)})

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        LOG.append(f"undo:{args['name']}")
        if args.get("undo_fails"):
            raise ValueError("undo broke")

    def compensate(self, error: BaseException, args: dict[str, Any], context: Any) -> None:
        LOG.append(f"compensate:{args['name']}")


Recorder.inputs = ("name",)


class Flexible(Recorder):
    inputs = ()


class Chain(Reactor):
    inputs = ("fail_at",)

    # Declared out of dependency order on purpose: c needs b needs a.
    c = step(Flexible, name=value("c"), prev=from_result("b"))
    a = step(Flexible, name=value("a"))
    b = step(Flexible, name=value("b"), prev=from_result("a"))


def test_steps_run_in_dependency_order() -> None:
    result = Chain.run(fail_at=None)
    assert result.ok, result.error
    assert LOG == ["run:a", "run:b", "run:c"]
    assert set(result.value) == {"a", "b", "c"}


class FailsThird(Reactor):
    inputs = ()

    first = step(Flexible, name=value("first"))
    second = step(Flexible, name=value("second"), after=from_result("first"))
    third = step(Flexible, name=value("third"), after=from_result("second"), fail=value(True))


def test_rollback_compensates_failing_step_and_undoes_newest_first(events: Any) -> None:
    result = FailsThird.run()
    assert not result.ok
    assert result.status == "failed"
    assert isinstance(result.error, StepFailed)
    assert result.error.step == "third"
    assert LOG == [
        "run:first",
        "run:second",
        "run:third",
        "compensate:third",
        "undo:second",
        "undo:first",
    ]
    rollback = [e for e in events if e[0].startswith(("compensation", "undo"))]
    assert rollback == [
        ("compensation_started", "third"),
        ("compensation_succeeded", "third"),
        ("undo_started", "second"),
        ("undo_succeeded", "second"),
        ("undo_started", "first"),
        ("undo_succeeded", "first"),
    ]


class BadArgs(Reactor):
    inputs = ("order",)

    first = step(Flexible, name=value("first"))
    second = step(Recorder, name=from_input("order", "missing.path"))


def test_compensate_only_if_body_started() -> None:
    result = BadArgs.run(order={"id": 1})
    assert isinstance(result.error, ArgumentResolutionError)
    assert result.error.argument == "name"
    # second never started, so it is not compensated; first is undone.
    assert LOG == ["run:first", "undo:first"]


class UndoFails(Reactor):
    first = step(Flexible, name=value("first"))
    second = step(Flexible, name=value("second"), undo_fails=value(True), a=from_result("first"))
    third = step(Flexible, name=value("third"), fail=value(True), a=from_result("second"))


def test_failing_undo_is_reported_and_the_rest_still_runs() -> None:
    result = UndoFails.run()
    assert LOG[-2:] == ["undo:second", "undo:first"]
    assert len(result.rollback_failures) == 1
    failure = result.rollback_failures[0]
    assert failure["step"] == "second" and failure["kind"] == "undo"
    assert failure["error"]["type"] == "UndoFailed"
    row = Execution.objects.get(pk=result.execution_id)
    assert row.rollback_failures == result.rollback_failures


class Flaky(Step):
    calls = 0

    def run(self, args: dict[str, Any], context: Any) -> Any:
        type(self).calls += 1
        LOG.append(f"attempt:{context.attempt}")
        if type(self).calls < args["succeed_on"]:
            return Failure("not yet")
        return Success("done")


def _flaky(policy: Retries) -> type[Reactor]:
    step_class = type("FlakyStep", (Flaky,), {"retries": policy, "calls": 0, "inputs": ()})

    class FlakyReactor(Reactor):
        inputs = ("succeed_on",)
        work = step(step_class, succeed_on=from_input("succeed_on"))

    return FlakyReactor


@pytest.mark.parametrize(
    ("backoff", "expected"),
    [
        ("exponential", [0.5, 1.0, 2.0]),
        ("linear", [0.5, 1.0, 1.5]),
        ("fixed", [0.5, 0.5, 0.5]),
    ],
)
def test_retry_count_and_backoff(backoff: str, expected: list[float]) -> None:
    reactor = _flaky(Retries(max_attempts=4, backoff=backoff, base_delay=0.5))
    with use_clock(FakeClock()) as clock:
        result = reactor.run(succeed_on=4)
    assert result.ok
    assert clock.sleeps == expected
    assert LOG == ["attempt:1", "attempt:2", "attempt:3", "attempt:4"]
    runs = StepRun.objects.for_execution(result.execution_id)
    assert [r.status for r in runs] == ["retried", "retried", "retried", "succeeded"]


def test_retries_exhausted_carries_attempts() -> None:
    reactor = _flaky(Retries(max_attempts=3, backoff="fixed", base_delay=0.1))
    with use_clock(FakeClock()) as clock:
        result = reactor.run(succeed_on=10)
    assert isinstance(result.error, RetriesExhausted)
    assert result.error.attempts == 3
    assert clock.sleeps == [0.1, 0.1]
    with pytest.raises(RetriesExhausted):
        result.unwrap()


def test_non_retryable_failure_is_not_retried() -> None:
    class NoRetry(Step):
        retries = 5

        def run(self, args: dict[str, Any], context: Any) -> Any:
            LOG.append("try")
            return Failure("permanent", retryable=False)

    class R(Reactor):
        only = step(NoRetry)

    with use_clock(FakeClock()):
        result = R.run()
    assert LOG == ["try"]
    assert isinstance(result.error, StepFailed) and not isinstance(result.error, RetriesExhausted)


class Halting(Reactor):
    first = step(Flexible, name=value("first"))

    @step(after=from_result("first"))
    def stop(self, args: dict[str, Any], context: Any) -> Any:
        return Halt("enough")

    never = step(Flexible, name=value("never"), after=from_result("stop"))


def test_halt_stops_without_rollback() -> None:
    result = Halting.run()
    assert result.status == "halted"
    assert result.ok
    assert result.halt_reason == "enough"
    assert LOG == ["run:first"]
    assert Execution.objects.get(pk=result.execution_id).status == "halted"


class SkipFlows(Reactor):
    @step()
    def maybe(self, args: dict[str, Any], context: Any) -> Any:
        LOG.append("run:maybe")
        return Skipped("default-value", reason="nothing to do")

    @maybe.undo
    def undo_maybe(self, result: Any, args: dict[str, Any], context: Any) -> None:
        LOG.append("undo:maybe")

    consumer = step(Flexible, name=from_result("maybe"))
    boom = step(Flexible, name=value("boom"), fail=value(True), a=from_result("consumer"))


def test_skipped_value_flows_on_and_is_never_undone() -> None:
    result = SkipFlows.run()
    assert LOG == [
        "run:maybe",
        "run:default-value",
        "run:boom",
        "compensate:boom",
        "undo:default-value",
    ]
    assert not result.ok


class WhereReactor(Reactor):
    inputs = ("enabled",)

    guarded = step(
        Recorder,
        where=lambda inputs, results: inputs["enabled"],
        name=from_input("enabled", "not.a.path"),  # would fail if resolved
    )
    after = step(Flexible, name=value("after"))


def test_where_false_skips_before_arguments_are_used(events: Any) -> None:
    result = WhereReactor.run(enabled=False)
    assert result.ok, result.error
    assert result.value["guarded"] is None
    assert LOG == ["run:after"]
    assert ("step_skipped", "guarded") in events


# -- definition errors ------------------------------------------------------------------------


def test_definition_errors_say_what_to_change() -> None:
    from reactor_app.exceptions import DefinitionError

    with pytest.raises(DefinitionError, match="has no step 'nope'"):
        type("R1", (Reactor,), {"a": step(Flexible, x=from_result("nope"))})
    with pytest.raises(DefinitionError, match="add 'missing' to inputs"):
        type("R2", (Reactor,), {"a": step(Flexible, x=from_input("missing"))})
    with pytest.raises(DefinitionError, match=r"cycle \(a -> b -> a\)|cycle \(b -> a -> b\)"):
        type(
            "R3",
            (Reactor,),
            {"a": step(Flexible, x=from_result("b")), "b": step(Flexible, x=from_result("a"))},
        )
    with pytest.raises(DefinitionError, match="returns = 'zzz' names no step"):
        type("R4", (Reactor,), {"returns": "zzz", "a": step(Flexible)})
    with pytest.raises(DefinitionError, match="wrap constants in value"):
        step(Flexible, name="plain")
    with pytest.raises(DefinitionError, match="retries must be a positive integer"):
        type("S", (Step,), {"retries": -1})
    with pytest.raises(DefinitionError, match="only exists inside map_step"):
        type("R5", (Reactor,), {"a": step(Flexible, x=element())})
    with pytest.raises(DefinitionError, match="declares inputs"):
        type("R6", (Reactor,), {"a": step(Recorder, name=value("x"), bogus=value(1))})
    with pytest.raises(DefinitionError, match="use compose"):
        step(Chain)
    with pytest.raises(DefinitionError, match="background"):
        type("R7", (Reactor,), {"background": "after:nothing", "a": step(Flexible)})
    with pytest.raises(DefinitionError, match="tuple of names"):
        type("R8", (Reactor,), {"inputs": "account_id"})


def test_input_validation_error_lists_field_errors() -> None:
    result = Chain.run(unexpected=1)
    assert isinstance(result.error, InputValidationError)
    assert result.error.field_errors == {"fail_at": "required", "unexpected": "unexpected input"}
    row = Execution.objects.get(pk=result.execution_id)
    assert row.status == "failed"
    assert row.error["field_errors"] == result.error.field_errors


def test_step_input_validation() -> None:
    class Missing(Reactor):
        inputs = ("x",)
        a = step(Recorder)  # no arguments: receives the reactor inputs, which lack "name"

    result = Missing.run(x=1)
    assert isinstance(result.error, InputValidationError)
    assert result.error.field_errors == {"name": "required"}
    assert LOG == []


# -- composition and mapping --------------------------------------------------------------------


class Child(Reactor):
    inputs = ("tag",)
    returns = "inner"

    inner = step(Flexible, name=from_input("tag"))

    @step(prev=from_result("inner"))
    def seen(self, args: dict[str, Any], context: Any) -> Any:
        LOG.append(f"child-root:{context.root_execution_id}")
        return Success(context.execution_id)


class Parent(Reactor):
    inputs = ("fail",)

    before = step(Flexible, name=value("before"))
    child = compose(Child, tag=value("in-child"))
    after = step(Flexible, name=value("after"), fail=from_input("fail"), c=from_result("child"))


def test_composed_child_shares_root_and_is_undone() -> None:
    result = Parent.run(fail=True)
    assert not result.ok
    roots = [entry for entry in LOG if entry.startswith("child-root:")]
    assert roots == [f"child-root:{result.execution_id}"]
    assert LOG[-3:] == ["compensate:after", "undo:in-child", "undo:before"]
    parent_row = Execution.objects.get(pk=result.execution_id)
    child_row = Execution.objects.get(parent=parent_row)
    assert str(child_row.root_id) == result.execution_id
    assert child_row.status == "succeeded"


def test_composed_child_success_value() -> None:
    result = Parent.run(fail=False)
    assert result.ok, result.error
    assert result.value["child"]["name"] == "in-child"


class Mapper(Reactor):
    inputs = ("items",)

    each = map_step(Flexible, over=from_input("items"), name=element("name"), fail=element("fail"))


def test_map_step_per_element_results() -> None:
    result = Mapper.run(items=[{"name": "x", "fail": False}, {"name": "y", "fail": False}])
    assert result.ok, result.error
    assert [v["name"] for v in result.value["each"]] == ["x", "y"]
    runs = StepRun.objects.for_execution(result.execution_id)
    assert [r.step for r in runs] == ["each[0]", "each[1]"]


def test_map_step_rolls_back_completed_elements() -> None:
    items = [{"name": n, "fail": n == "z"} for n in ("x", "y", "z")]
    result = Mapper.run(items=items)
    assert not result.ok
    assert result.error.step == "each[2]"
    assert LOG == ["run:x", "run:y", "run:z", "compensate:z", "undo:y", "undo:x"]


# -- tracking -------------------------------------------------------------------------------------


def test_execution_and_step_rows_match_what_ran() -> None:
    result = FailsThird.run()
    row = Execution.objects.get(pk=result.execution_id)
    assert row.status == "failed"
    assert row.error["type"] == "StepFailed" and row.error["step"] == "third"
    assert row.context["version"] == 1
    runs = [(r.step, r.kind, r.status) for r in StepRun.objects.for_execution(row.pk)]
    assert runs == [
        ("first", "run", "succeeded"),
        ("second", "run", "succeeded"),
        ("third", "run", "failed"),
        ("third", "compensate", "succeeded"),
        ("second", "undo", "succeeded"),
        ("first", "undo", "succeeded"),
    ]


def test_tracking_executions_only_records_no_step_runs(settings: Any) -> None:
    settings.REACTOR_TRACKING = "executions"
    result = Chain.run(fail_at=None)
    assert result.ok
    assert Execution.objects.filter(pk=result.execution_id).exists()
    assert not StepRun.objects.filter(execution_id=result.execution_id).exists()


def test_returns_selects_the_value() -> None:
    class R(Reactor):
        returns = "b"
        a = step(Flexible, name=value("a"))
        b = step(Flexible, name=value("b"), x=from_result("a", "name"))

    assert R.run().value["name"] == "b"


def test_step_call_runs_directly() -> None:
    outcome = Recorder.call(name="direct")
    assert isinstance(outcome, Success)
    assert outcome.value["name"] == "direct"
    failed = Recorder.call()
    assert isinstance(failed, Failure)
    assert isinstance(failed.error, InputValidationError)


def test_current_step_names_the_step_that_is_running() -> None:
    seen: list[str] = []

    class Look(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            seen.append(Execution.objects.get(pk=context.execution_id).current_step)
            return Success(None)

    class R(Reactor):
        first = step(Look)
        second = step(Look)

    result = R.run()
    assert seen == ["first", "second"]
    assert Execution.objects.get(pk=result.execution_id).current_step == ""


def test_an_error_outside_any_step_body_fails_the_run_and_rolls_back() -> None:
    class Unbuildable(Step):
        def __init__(self) -> None:
            raise RuntimeError("cannot build the step")

        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success(None)

    class R(Reactor):
        first = step(Flexible, name=value("first"))
        second = step(Unbuildable)

    result = R.run()
    assert result.status == "failed"
    assert isinstance(result.error, StepFailed)
    assert "cannot build the step" in result.error.message and result.error.step == "second"
    assert LOG == ["run:first", "undo:first"]
    assert Execution.objects.get(pk=result.execution_id).status == "failed"


def test_a_raising_signal_receiver_does_not_break_the_run(caplog: Any) -> None:
    def broken(sender: Any, **payload: Any) -> None:
        raise ValueError("receiver bug")

    engine_event.connect(broken, weak=False)
    try:
        result = Chain.run(fail_at=None)
    finally:
        engine_event.disconnect(broken)
    assert result.ok, result.error
    assert "receiver bug" in caplog.text


def test_values_json_cannot_hold_are_recorded_not_fatal() -> None:
    from decimal import Decimal

    class Amount(Step):
        inputs = ("amount",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success(args["amount"] * 2)

    class R(Reactor):
        inputs = ("amount",)
        double = step(Amount, amount=from_input("amount"))

    result = R.run(amount=Decimal("1.25"))
    assert result.ok, result.error
    assert result.value["double"] == Decimal("2.50")  # the real object, in this process
    run = StepRun.objects.get(execution_id=result.execution_id)
    assert run.detail["args"] == {"amount": "1.25"}


def test_compose_without_arguments_passes_the_inputs_the_child_declares() -> None:
    class Inner(Reactor):
        inputs = ("tag",)
        returns = "inner"
        inner = step(Flexible, name=from_input("tag"))

    class Outer(Reactor):
        inputs = ("tag", "other")
        child = compose(Inner)

    result = Outer.run(tag="t1", other="ignored")
    assert result.ok, result.error
    assert result.value["child"]["name"] == "t1"


def test_step_call_reports_a_failing_compensation_on_its_error() -> None:
    class Breaks(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            raise RuntimeError("body failed")

        def compensate(self, error: BaseException, args: dict[str, Any], context: Any) -> None:
            raise RuntimeError("compensation failed")

    outcome = Breaks.call()
    assert isinstance(outcome, Failure)
    assert outcome.error.message.startswith("step 'test_step_call_reports")
    failures = outcome.error.fields()["rollback_failures"]
    assert [(f["kind"], f["reason"]) for f in failures] == [("compensate", "error")]


def _owners_in_child(_: int) -> list[str]:
    from reactor_app.engine.gate import fresh_owner

    return [fresh_owner() for _ in range(3)]


def test_step_call_owners_are_unique_across_forked_processes() -> None:
    """A ``Step.call`` owner is what makes a hold re-entrant: two processes making the same
    owner would both walk into one lock. Owners come from a generator that every forked child
    re-seeds, so children forked from one parent (a prefork worker pool) never repeat them."""
    import multiprocessing

    from reactor_app.engine.gate import fresh_owner

    made = [fresh_owner() for _ in range(3)]  # the parent's generator has run before the fork
    with multiprocessing.get_context("fork").Pool(3) as pool:
        for owners in pool.map(_owners_in_child, range(3)):
            made += owners
    assert all(owner.startswith("call:") and len(owner) == 37 for owner in made), made
    assert len(set(made)) == len(made), made


def test_seeding_the_shared_random_generator_never_repeats_a_step_call_owner() -> None:
    """Test tools and applications seed ``random`` for reproducibility; owners must not
    follow it (the same seed in two workers would give them one owner)."""
    import random

    from reactor_app.engine.gate import fresh_owner

    random.seed(7)
    first = fresh_owner()
    random.seed(7)
    assert fresh_owner() != first


def test_the_public_signals_answer_has_listeners_and_take_any_sender() -> None:
    """The documented signals are plain Django signals: ``has_listeners()`` and a send with no
    sender work (a receiver cache keyed by sender refuses both: it cannot key ``None``)."""
    from reactor_app import signals

    assert signals.acquired.has_listeners() is False
    heard: list[str] = []

    def receiver(sender: Any, **payload: Any) -> None:
        heard.append(payload["kind"])

    signals.step_failed.connect(receiver, weak=False)
    try:
        assert signals.step_failed.has_listeners()
        signals.step_failed.send(sender=None, kind="step_failed")
        signals.coordination_event.send_robust(sender=None, kind="acquired")
    finally:
        signals.step_failed.disconnect(receiver)
    assert heard == ["step_failed"]
