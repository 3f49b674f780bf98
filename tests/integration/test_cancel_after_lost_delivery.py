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
The named tests are the windows the property meets, cut there on purpose."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections import Counter
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor_app import Reactor, async_step, step, value
from reactor_app.coordination.renewal import scheduler
from reactor_app.engine.claim import ExecutionClaim
from reactor_app.engine.context import StepContext
from reactor_app.engine.executor import ExecutionRun
from reactor_app.exceptions import ExecutionNotCancellable
from reactor_app.models import Execution
from reactor_app.status import TERMINAL_STATUSES, ExecutionStatus
from reactor_app.testing import coordination_state
from tests.integration.test_long_countdowns import taken
from tests.integration.test_soft_limit_anywhere import (
    LEDGER,
    MORE_DELIVERIES,
    UNITS,
    ComposedThreeEffects,
    Effect,
    MappedThreeEffects,
    SoftLimitAt,
    ThreeEffects,
    _deliver,
    _started,
    lines_of_a_clean_delivery,
    renewing_since,
    saga_problems,
)

pytestmark = pytest.mark.django_db(transaction=True)

#: generated cases per run (``make soak`` sets more: ``REACTOR_CANCEL_AFTER_LOSS_EXAMPLES``)
EXAMPLES = int(os.environ.get("REACTOR_CANCEL_AFTER_LOSS_EXAMPLES", "40"))


def _cancel(execution: Execution) -> None:
    # (refused when the cut delivery ended the run: nothing to cancel)
    with contextlib.suppress(ExecutionNotCancellable):
        execution.cancel("cancelled after a lost delivery", by="test")


def _cancelled_after_cut(
    execution: Execution,
    first: dict[str, Any],
    queue: str,
    *,
    cancel_before: int = 1,
    tracer: SoftLimitAt | None = None,
) -> list[str]:
    """Deliver ``execution`` (the first delivery under ``tracer``, or cut by a patch the caller
    set), cancel it before delivery number ``cancel_before`` after that one, then deliver as
    the requeue or the sweep would until it ends; the deliveries' outcomes."""
    outcomes = [_deliver(execution, first, tracer)]
    for number in range(1, MORE_DELIVERIES + 1):
        execution.refresh_from_db()
        if number == cancel_before and execution.status not in TERMINAL_STATUSES:
            _cancel(execution)
            execution.refresh_from_db()
        if execution.status in TERMINAL_STATUSES:
            break
        if outcomes[-1] == "raised" and ExecutionClaim.is_held(execution.id):
            # the task ended with the exception: its claim lapses with its TTL
            lapsed = ExecutionClaim(execution.id, "lapsed")
            lapsed.client.delete(lapsed.name)
        outcomes.append(_deliver(execution, {}, None))
        taken(queue)
    execution.refresh_from_db()
    return outcomes


def cancel_problems(fail: bool, execution: Execution, units: tuple[str, ...]) -> list[str]:
    """What the ended run and the ledger break of the promise: a run that succeeded (the cut
    delivery ended it before the cancel) as ``saga_problems`` says; any other, every body
    that ran undone or compensated — one of the two, at most twice — and no undo without its
    body."""
    if execution.status == ExecutionStatus.SUCCEEDED or execution.status not in TERMINAL_STATUSES:
        return saga_problems(fail, execution, units)
    problems = []
    counts = Counter(LEDGER)
    for name in units:
        dos, undos, compensates = (
            counts[f"{kind}:{name}"] for kind in ("do", "undo", "compensate")
        )
        if dos > 2 or undos > 2 or compensates > 2:
            problems.append(f"{name} ran more than twice: {counts}")
        if undos and not dos:
            problems.append(f"{name} undone without its body")
        if dos and not (undos or compensates):
            problems.append(f"{name}'s effect stands: neither undone nor compensated")
        if undos and compensates:
            problems.append(f"{name} both undone and compensated")
    if execution.status not in (ExecutionStatus.CANCELLED, ExecutionStatus.FAILED):
        problems.append(f"ended {execution.status}")
    return problems


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    share=st.floats(min_value=0, max_value=1, exclude_max=True),
    fail=st.booleans(),
    reactor=st.sampled_from(list(UNITS)),
    cancel_before=st.integers(min_value=1, max_value=2),
)
def test_a_cancel_after_a_delivery_cut_at_any_line_undoes_every_effect(
    nobody_queue: str,
    share: float,
    fail: bool,
    reactor: type[ThreeEffects],
    cancel_before: int,
) -> None:
    renewing_before = scheduler().renewing()
    lines = lines_of_a_clean_delivery(reactor, fail, nobody_queue)
    line = 1 + int(share * lines)
    tags = {"tag": uuid.uuid4().hex} if "tag" in reactor.inputs else {}
    execution, first = _started(reactor, {"fail": fail, **tags}, nobody_queue)
    tracer = SoftLimitAt(line)
    outcomes = _cancelled_after_cut(
        execution, first, nobody_queue, cancel_before=cancel_before, tracer=tracer
    )
    problems = cancel_problems(fail, execution, UNITS[reactor])
    held = [h for h in coordination_state().holds() if h["execution"] == str(execution.id)]
    if held:
        problems.append(f"still held after the run ended: {held}")
    renewing = renewing_since(renewing_before)
    if renewing:
        holds = [[(h.claim.primitive, h.claim.key) for h in r.holds] for r in renewing]
        problems.append(f"renewals still running after the run ended: {holds}")
    assert not problems, (
        f"cut at {tracer.fired_in} (line {line} of {lines}); deliveries {outcomes}",
        problems,
        LEDGER,
    )


# -- named: the windows the property meets, cut there on purpose ------------------------------


def _cut_once_then_cancel(
    reactor: type[ThreeEffects],
    inputs: dict[str, Any],
    queue: str,
    target: Any,
    method: str,
    when: list[str],
) -> tuple[Execution, list[str]]:
    """Run ``reactor`` with ``target.<method>`` raising the soft limit the first time it is
    called with the ledger at ``when``, cancel the run, deliver until it ends."""
    execution, first = _started(reactor, inputs, queue)
    original = getattr(target, method)

    def cut(self: Any, *args: Any, **kwargs: Any) -> Any:
        if list(LEDGER) == when:
            setattr(target, method, original)
            raise SoftTimeLimitExceeded()  # once, as Celery's signal handler raises it
        return original(self, *args, **kwargs)

    setattr(target, method, cut)
    try:
        outcomes = _cancelled_after_cut(execution, first, queue)
    finally:
        setattr(target, method, original)
    return execution, outcomes


def test_a_cancel_after_a_delivery_lost_before_a_steps_checkpoint_compensates_that_step(
    nobody_queue: str,
) -> None:
    """The delivery ends between ``s1``'s body and its checkpoint (as a killed one would: the
    run is still ``running``), then the run is cancelled: the delivery that takes over marked
    ``s1`` as one the lost delivery may have been running, and the rollback compensates it
    before undoing ``s0``. Before, ``s1``'s effect stood."""
    execution, outcomes = _cut_once_then_cancel(
        ThreeEffects, {"fail": False}, nobody_queue, ExecutionRun, "checkpoint", ["do:s0", "do:s1"]
    )
    assert outcomes[0] == "time_up", outcomes
    assert execution.status == ExecutionStatus.CANCELLED, (outcomes, execution.error)
    assert LEDGER == ["do:s0", "do:s1", "compensate:s1", "undo:s0"], LEDGER


def test_a_cancel_after_a_body_cut_before_its_check_compensates_that_step(
    nobody_queue: str,
) -> None:
    """The soft limit lands in the engine's check right after ``s1``'s body: the pass parks
    and the step is to run again first thing in the next delivery. Cancelled before that,
    the step is compensated: its body ran, and its result was never recorded."""
    execution, outcomes = _cut_once_then_cancel(
        ThreeEffects, {"fail": False}, nobody_queue, StepContext, "checkpoint", ["do:s0", "do:s1"]
    )
    assert outcomes[0] == "parked", outcomes
    assert execution.status == ExecutionStatus.CANCELLED, (outcomes, execution.error)
    assert LEDGER == ["do:s0", "do:s1", "compensate:s1", "undo:s0"], LEDGER


def test_a_cancel_after_a_lost_batch_of_map_elements_compensates_the_batch(
    nobody_queue: str,
) -> None:
    """Two elements of the map completed and were not written yet (elements are written in
    batches) when the delivery ended: the rest of the batch — both, and the third, which may
    have started — is compensated, newest first, then ``s0`` undone."""
    execution, outcomes = _cut_once_then_cancel(
        MappedThreeEffects,
        {"fail": False, "tag": uuid.uuid4().hex},
        nobody_queue,
        ExecutionRun,
        "element_done",
        ["do:s0", "do:s1[0]", "do:s1[1]"],
    )
    assert outcomes[0] == "time_up", outcomes
    assert execution.status == ExecutionStatus.CANCELLED, (outcomes, execution.error)
    assert LEDGER == [
        "do:s0",
        "do:s1[0]",
        "do:s1[1]",
        "compensate:s1[2]",
        "compensate:s1[1]",
        "compensate:s1[0]",
        "undo:s0",
    ], LEDGER


def test_a_cancel_after_a_delivery_lost_in_a_composed_child_compensates_its_step(
    nobody_queue: str,
) -> None:
    """The delivery ends between the composed child's first step and its checkpoint: the
    child's step is marked in the child's own state, and the parent's rollback of the child
    compensates it."""
    execution, outcomes = _cut_once_then_cancel(
        ComposedThreeEffects,
        {"fail": False, "tag": uuid.uuid4().hex},
        nobody_queue,
        ExecutionRun,
        "checkpoint",
        ["do:s0", "do:c0"],
    )
    assert outcomes[0] == "time_up", outcomes
    assert execution.status == ExecutionStatus.CANCELLED, (outcomes, execution.error)
    assert LEDGER == ["do:s0", "do:c0", "compensate:c0", "undo:s0"], LEDGER
    assert not [h for h in coordination_state().holds() if h["execution"] == str(execution.id)]


def test_a_unit_that_runs_again_after_a_lost_delivery_is_not_compensated_too(
    nobody_queue: str,
) -> None:
    """The mark is dropped when the unit's body starts again: cut before ``s1``'s checkpoint,
    then ``s2`` fails — ``s1`` ran twice (the at-least-once rule) and is undone, once, not
    compensated as well."""
    execution, first = _started(ThreeEffects, {"fail": True}, nobody_queue)
    original = ExecutionRun.checkpoint

    def cut(self: ExecutionRun, *args: Any, **kwargs: Any) -> Any:
        if list(LEDGER) == ["do:s0", "do:s1"]:
            ExecutionRun.checkpoint = original  # type: ignore[method-assign]
            raise SoftTimeLimitExceeded()
        return original(self, *args, **kwargs)

    ExecutionRun.checkpoint = cut  # type: ignore[method-assign]
    try:
        outcomes = _cancelled_after_cut(execution, first, nobody_queue, cancel_before=0)
    finally:
        ExecutionRun.checkpoint = original  # type: ignore[method-assign]
    assert execution.status == ExecutionStatus.FAILED, (outcomes, execution.error)
    assert LEDGER == [
        "do:s0",
        "do:s1",
        "do:s1",
        "do:s2",
        "compensate:s2",
        "undo:s1",
        "undo:s0",
    ], LEDGER


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
    outcomes = _cancelled_after_cut(execution, {}, nobody_queue, cancel_before=0)
    child.refresh_from_db()
    assert child.status == ExecutionStatus.CANCELLED, child.error
    assert execution.status == ExecutionStatus.CANCELLED, (outcomes, execution.error)
    assert LEDGER == ["do:s0", "do:s1", "compensate:s1", "undo:s0"], LEDGER


def test_a_cancel_after_a_delivery_lost_once_a_composed_child_succeeded_undoes_its_steps(
    nobody_queue: str,
) -> None:
    """Found by the property: the delivery ends after the composed child succeeded and before
    the parent recorded its step. The child is still listed as the parent's child in
    progress, but ended: the rollback after the cancel passed over it, and ``c0``'s and
    ``c1``'s effects stood. Now its steps are undone, newest first, before ``s0``."""
    execution, first = _started(
        ComposedThreeEffects, {"fail": False, "tag": uuid.uuid4().hex}, nobody_queue
    )
    original = ExecutionRun.checkpoint

    def cut(self: ExecutionRun, *args: Any, **kwargs: Any) -> Any:
        if self.parent is None and list(LEDGER) == ["do:s0", "do:c0", "do:c1"]:
            ExecutionRun.checkpoint = original  # type: ignore[method-assign]
            raise SoftTimeLimitExceeded()  # once, as Celery's signal handler raises it
        return original(self, *args, **kwargs)

    ExecutionRun.checkpoint = cut  # type: ignore[method-assign]
    try:
        outcomes = _cancelled_after_cut(execution, first, nobody_queue)
    finally:
        ExecutionRun.checkpoint = original  # type: ignore[method-assign]
    assert outcomes[0] == "time_up", outcomes
    child = Execution.objects.get(parent=execution)
    assert child.status == ExecutionStatus.SUCCEEDED
    assert execution.status == ExecutionStatus.CANCELLED, (outcomes, execution.error)
    assert LEDGER == ["do:s0", "do:c0", "do:c1", "undo:c1", "undo:c0", "undo:s0"], LEDGER
