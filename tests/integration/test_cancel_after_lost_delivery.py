"""A cancel between a lost delivery and the next: every effect the lost delivery made is undone.

A delivery that ends before a body's result is recorded — killed, or cut by Celery's soft time
limit — leaves the unit to run again in the next delivery (the at-least-once rule). When the
run ends before it does (here: an operator's cancel, seen at the start of the next pass), the
unit is compensated: nothing says its body did not run (docs/reactors-and-steps.md, "A cancel
between a lost delivery and the next"; ``engine.in_flight``).

The property cuts a delivery at any line (``SoftLimitAt``, as ``test_soft_limit_anywhere``
does, over the same reactors: plain, coordinated, a map of three elements, a composed child),
cancels the run before the next delivery or the one after, delivers until the run ends and
checks the ledger its hooks wrote: every unit whose body ran is undone or compensated — one
or the other, never both, and at most twice (one cut) — and none is undone without its body.
The named tests are the windows the property meets, cut there on purpose; two more end the run
by the contention ceiling and by a refusal at the reactor gate instead of a cancel, and two
lose a map of reactors' delivery."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from hypothesis import given
from hypothesis import strategies as st

from reactor_app import (
    Reactor,
    async_step,
    from_input,
    map_step,
    signals,
    step,
    value,
    with_period,
)
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Holder, LockClaim
from reactor_app.coordination.renewal import scheduler
from reactor_app.engine.context import StepContext
from reactor_app.engine.executor import ExecutionRun
from reactor_app.exceptions import ExecutionNotCancellable
from reactor_app.models import Execution
from reactor_app.status import TERMINAL_STATUSES, ExecutionStatus
from reactor_app.testing import coordination_state
from tests.integration.test_soft_limit_anywhere import (
    CUTS,
    LEDGER,
    UNITS,
    ChildEffects,
    ComposedThreeEffects,
    Effect,
    GatedThreeEffects,
    MappedThreeEffects,
    SoftLimitAt,
    ThreeEffects,
    _deliver,
    _run_cut_once,
    _started,
    _until_ended,
    cut_settings,
    ledger_problems,
    left_behind,
    lines_of_a_clean_delivery,
    saga_problems,
    stop_problems,
)

pytestmark = pytest.mark.django_db(transaction=True)

#: generated cases per run (``make soak`` sets more: ``REACTOR_CANCEL_AFTER_LOSS_EXAMPLES``)
EXAMPLES = int(os.environ.get("REACTOR_CANCEL_AFTER_LOSS_EXAMPLES", "40"))


def cancel_before(number: int) -> Callable[[Execution, int], None]:
    """Cancel the run, as an operator would, before the ``number``-th delivery after the cut
    one (refused, and nothing to do, when the run has ended)."""

    def cancel(execution: Execution, delivery: int) -> None:
        if delivery == number:
            with contextlib.suppress(ExecutionNotCancellable):
                execution.cancel("cancelled after a lost delivery", by="test")

    return cancel


def cancel_problems(fail: bool, execution: Execution, units: tuple[str, ...]) -> list[str]:
    """What the ended run and the ledger break of the promise: a run that succeeded (the cut
    delivery ended it before the cancel) as ``saga_problems`` says; any other, every body
    that ran undone or compensated — one of the two, at most twice — and no undo without its
    body."""
    if execution.status == ExecutionStatus.SUCCEEDED or execution.status not in TERMINAL_STATUSES:
        return saga_problems(fail, execution, units)
    problems = ledger_problems(units, reversed_once=True)
    if execution.status not in (ExecutionStatus.CANCELLED, ExecutionStatus.FAILED):
        problems.append(f"ended {execution.status}")
    return problems


@cut_settings(EXAMPLES)
@given(**CUTS, cancel_at=st.integers(min_value=1, max_value=2))
def test_a_cancel_after_a_delivery_cut_at_any_line_undoes_every_effect(
    nobody_queue: str,
    share: float,
    fail: bool,
    reactor: type[ThreeEffects],
    cancel_at: int,
) -> None:
    renewing_before = scheduler().renewing()
    lines = lines_of_a_clean_delivery(reactor, fail, nobody_queue)
    line = 1 + int(share * lines)
    tags = {"tag": uuid.uuid4().hex} if "tag" in reactor.inputs else {}
    execution, first = _started(reactor, {"fail": fail, **tags}, nobody_queue)
    tracer = SoftLimitAt(line)
    outcomes = _until_ended(execution, first, nobody_queue, tracer, cancel_before(cancel_at))
    problems = cancel_problems(fail, execution, UNITS[reactor])
    problems += left_behind(execution, renewing_before)
    problems += stop_problems(tracer)
    assert not problems, (
        f"cut at {tracer.fired_in} (line {line} of {lines}); deliveries {outcomes}",
        problems,
        LEDGER,
    )


# -- named: the windows the property meets, and a map of reactors', cut there on purpose ------


class MappedChildren(ThreeEffects):
    """``s1`` is a map of reactors: each element a ``ChildEffects`` run of its own."""

    inputs = ("fail", "tag")
    s1 = map_step(ChildEffects, over=value([0, 1]), tag=from_input("tag"))


#: each named case: the reactor, the method cut once (and where), the ledger it is cut at,
#: the cut delivery's outcome, and the ledger once the run is cancelled and has ended
NAMED: dict[str, tuple[type[ThreeEffects], Any, str, Any, str, list[str]]] = {
    # the delivery ends between s1's body and its checkpoint (as a killed one would: the run
    # is still running): the takeover marks s1, the rollback compensates it before undoing s0
    "lost before a step's checkpoint": (
        ThreeEffects,
        ExecutionRun,
        "checkpoint",
        ["do:s0", "do:s1"],
        "time_up",
        ["do:s0", "do:s1", "compensate:s1", "undo:s0"],
    ),
    # the limit lands in the engine's check right after s1's body: the pass parks, s1 to run
    # again first thing; cancelled before that, it is compensated (its result never recorded)
    "cut in the check after a body": (
        ThreeEffects,
        StepContext,
        "checkpoint",
        ["do:s0", "do:s1"],
        "parked",
        ["do:s0", "do:s1", "compensate:s1", "undo:s0"],
    ),
    # two elements completed, not written yet (elements are written in batches): the rest of
    # the batch — both, and the third, which may have started — compensated, newest first
    "lost with a batch of map elements unwritten": (
        MappedThreeEffects,
        ExecutionRun,
        "element_done",
        ["do:s0", "do:s1[0]", "do:s1[1]"],
        "time_up",
        [
            *("do:s0", "do:s1[0]", "do:s1[1]"),
            *("compensate:s1[2]", "compensate:s1[1]", "compensate:s1[0]", "undo:s0"),
        ],
    ),
    # between the composed child's first step and its checkpoint: c0 is marked in the
    # child's own state, and the parent's rollback of the child compensates it
    "lost inside a composed child": (
        ComposedThreeEffects,
        ExecutionRun,
        "checkpoint",
        ["do:s0", "do:c0"],
        "time_up",
        ["do:s0", "do:c0", "compensate:c0", "undo:s0"],
    ),
    # found by the property: lost after the composed child succeeded and before the parent
    # recorded its step (the parent's checkpoint). The child, still listed as in progress but
    # ended, was passed over and c0, c1 stood; now it is undone
    "lost once a composed child succeeded": (
        ComposedThreeEffects,
        ExecutionRun,
        "checkpoint",
        lambda run: run.parent is None and LEDGER == ["do:s0", "do:c0", "do:c1"],
        "time_up",
        ["do:s0", "do:c0", "do:c1", "undo:c1", "undo:c0", "undo:s0"],
    ),
    # a map of reactors: each element a child run, named in the parent's state from its
    # start. Element 0's child succeeded and the parent had not recorded the element: the
    # child is undone as a recorded one
    "lost once a map element's child succeeded": (
        MappedChildren,
        ExecutionRun,
        "element_done",
        lambda run: run.parent is None and LEDGER == ["do:s0", "do:c0", "do:c1"],
        "time_up",
        ["do:s0", "do:c0", "do:c1", "undo:c1", "undo:c0", "undo:s0"],
    ),
    # inside element 1's child, before its c0 was recorded: c0 is marked in that child and
    # compensated; element 0's child, recorded when element 1's was started, is undone
    "lost inside the next map element's child": (
        MappedChildren,
        ExecutionRun,
        "checkpoint",
        lambda run: run.parent is not None and LEDGER == ["do:s0", "do:c0", "do:c1", "do:c0"],
        "time_up",
        [
            *("do:s0", "do:c0", "do:c1", "do:c0"),
            *("compensate:c0", "undo:c1", "undo:c0", "undo:s0"),
        ],
    ),
}


@pytest.mark.parametrize("case", list(NAMED))
def test_a_cancel_after_a_lost_delivery_reverses_what_it_ran(nobody_queue: str, case: str) -> None:
    renewing_before = scheduler().renewing()  # what an earlier test left is not ours
    reactor, target, method, when, cut_outcome, ledger = NAMED[case]
    tags = {"tag": uuid.uuid4().hex} if "tag" in reactor.inputs else {}
    execution, outcomes = _run_cut_once(
        reactor,
        {"fail": False, **tags},
        nobody_queue,
        when,
        method,
        target=target,
        before=cancel_before(1),
    )
    assert outcomes[0] == cut_outcome, outcomes
    assert execution.status == ExecutionStatus.CANCELLED, (outcomes, execution.error)
    assert ledger == LEDGER, LEDGER
    assert left_behind(execution, renewing_before) == []


def test_a_unit_that_runs_again_after_a_lost_delivery_is_not_compensated_too(
    nobody_queue: str,
) -> None:
    """The mark is dropped when the unit's body starts again: cut before ``s1``'s checkpoint,
    then ``s2`` fails — ``s1`` ran twice (the at-least-once rule) and is undone, once, not
    compensated as well."""
    execution, outcomes = _run_cut_once(
        ThreeEffects, {"fail": True}, nobody_queue, ["do:s0", "do:s1"]
    )
    assert execution.status == ExecutionStatus.FAILED, (outcomes, execution.error)
    assert [
        *("do:s0", "do:s1", "do:s1", "do:s2"),
        *("compensate:s2", "undo:s1", "undo:s0"),
    ] == LEDGER, LEDGER


class AsyncEffects(Reactor):
    """``s1`` runs in an execution of its own (an ``async_step``), dispatched after ``s0``."""

    inputs = ("fail",)
    s0 = step(Effect, name=value("s0"), fail=value(False))
    s1 = async_step(Effect, name=value("s1"), fail=value(False))


def test_a_cancel_after_a_lost_delivery_of_an_async_step_compensates_its_unit(
    nobody_queue: str,
) -> None:
    """An ``async_step``'s execution runs its reactor's step, not the reactor's plan: its
    takeover marks that one unit (not the parent's step at its own point, which the parent
    ran). Its delivery ends after the body, before the child's end is written; the tree is
    cancelled; the child's next delivery compensates ``s1``, and the parent undoes ``s0``."""
    execution, first = _started(AsyncEffects, {"fail": False}, nobody_queue)
    assert _deliver(execution, first, None) == "parked"  # waiting on its async step
    child = Execution.objects.get(parent=execution)
    original = ExecutionRun.finish

    def cut(self: ExecutionRun, *args: Any, **kwargs: Any) -> Any:
        ExecutionRun.finish = original  # type: ignore[method-assign]
        raise SoftTimeLimitExceeded()  # once, as Celery's signal handler raises it

    ExecutionRun.finish = cut  # type: ignore[method-assign]
    try:
        assert _deliver(child, {}, None) == "time_up"
    finally:
        ExecutionRun.finish = original  # type: ignore[method-assign]
    assert LEDGER == ["do:s0", "do:s1"], LEDGER
    execution.cancel("cancelled after a lost delivery", by="test")
    assert _deliver(child, {}, None) == "cancelled"
    outcomes = _until_ended(execution, {}, nobody_queue)
    child.refresh_from_db()
    assert child.status == ExecutionStatus.CANCELLED, child.error
    assert execution.status == ExecutionStatus.CANCELLED, (outcomes, execution.error)
    assert LEDGER == ["do:s0", "do:s1", "compensate:s1", "undo:s0"], LEDGER


def test_a_contention_ceiling_after_a_lost_delivery_compensates_the_unit_it_refused(
    nobody_queue: str, settings: Any
) -> None:
    """The run can end before a lost unit runs again without a cancel: ``s1`` (under a
    step-level lock) is lost after its body; before the next delivery another holder takes
    ``s1``'s key, so the deliveries park on it until the contention ceiling fails the run,
    ``s1`` never run again. The rollback compensates ``s1`` (its lost mark) and undoes ``s0``.
    The holder lets the key go as the refusal is recorded: the compensation re-takes ``s1``'s
    lock, as every rollback hook does (held by another, it would be a rollback failure)."""
    renewing_before = scheduler().renewing()  # what an earlier test left is not ours
    settings.REACTOR_CONTENTION_CEILING = 1
    coordinator = Coordinator()
    held: list[Any] = []

    def contend(execution: Execution, delivery: int) -> None:
        if delivery == 1:
            claim = LockClaim("soft-limit", ttl=60)
            held.append(coordinator.admit([claim], Holder(owner="test-holder")))

    def let_go(**event: Any) -> None:
        if event.get("step") == "s1" and held:
            coordinator.release(held.pop(), "success")

    signals.step_failed.connect(let_go, weak=False)
    try:
        execution, outcomes = _run_cut_once(
            GatedThreeEffects,
            {"fail": False, "tag": uuid.uuid4().hex},
            nobody_queue,
            ["do:s0", "do:s1"],
            before=contend,
        )
    finally:
        signals.step_failed.disconnect(let_go)
        for admitted in held:
            coordinator.release(admitted, "success")
    assert outcomes == ["time_up", "parked", "failed"], outcomes
    assert execution.status == ExecutionStatus.FAILED, (outcomes, execution.error)
    assert execution.error["type"] == "ContentionCeilingExceeded", execution.error
    assert not execution.rollback_failures, execution.rollback_failures
    assert LEDGER == ["do:s0", "do:s1", "compensate:s1", "undo:s0"], LEDGER
    assert left_behind(execution, renewing_before) == []


@with_period(lambda inputs: f"lost-then-refused:{inputs['tag']}", every="day", ttl=1)
class BriefPeriodThreeEffects(ThreeEffects):
    """A reactor-level period whose reservation lapses a second after its holder is gone."""

    inputs = ("fail", "tag")


def test_a_reactor_gate_refusal_after_a_lost_delivery_compensates_the_lost_unit(
    nobody_queue: str,
) -> None:
    """The run can end before a lost unit runs again at its reactor gate too: ``s1`` is lost
    after its body; its run's period reservation lapses, and another run completes the bucket
    before the next delivery, whose re-admission the period then refuses. The run fails with
    the period's error, and its rollback compensates ``s1`` (its lost mark) and undoes
    ``s0``."""
    renewing_before = scheduler().renewing()  # what an earlier test left is not ours
    tag = uuid.uuid4().hex
    bucket = f"lost-then-refused:{tag}"
    others: list[Any] = []

    def complete_the_bucket_elsewhere(execution: Execution, delivery: int) -> None:
        if delivery != 1:
            return
        deadline = time.monotonic() + 15
        while coordination_state().period_reserved(bucket, "day") is not None:
            assert time.monotonic() < deadline, "the lost delivery's reservation never lapsed"
            time.sleep(0.05)
        ours = list(LEDGER)
        others.append(BriefPeriodThreeEffects.run(fail=False, tag=tag))
        LEDGER[:] = ours  # the other run's effects are its own

    execution, outcomes = _run_cut_once(
        BriefPeriodThreeEffects,
        {"fail": False, "tag": tag},
        nobody_queue,
        ["do:s0", "do:s1"],
        before=complete_the_bucket_elsewhere,
    )
    (other,) = others
    assert other.ok, other.error
    assert coordination_state().period_marked_by(bucket, "day") == str(other.execution_id)
    assert outcomes[0] == "time_up", outcomes
    assert execution.status == ExecutionStatus.FAILED, (outcomes, execution.error)
    assert execution.error["primitive"] == "period", execution.error
    assert not execution.rollback_failures, execution.rollback_failures
    assert LEDGER == ["do:s0", "do:s1", "compensate:s1", "undo:s0"], LEDGER
    assert left_behind(execution, renewing_before) == []
