"""Celery's soft time limit may fire at any line of a worker delivery: the saga promise holds.

``SoftTimeLimitExceeded`` is raised by a signal handler, so it lands wherever the delivery's
thread happens to be — in a body, between a body and its checkpoint, in a rollback hook, in
the engine's bookkeeping around them. docs/operations.md ("Celery time limits") says what
each place means: a body cut off after other work of its delivery runs again in the next
one, a body cut off although it started its delivery failed that attempt, and anywhere else
the delivery ends as if its worker had been killed there. Whatever the place, the following
deliveries finish the run, and every effect a body made stands or is undone — once, but for
the at-least-once rule of a killed delivery: a unit cut between its effect and its record
runs again (docs/reactors-and-steps.md, "A worker that dies during the rollback").

Each generated case runs a three-step reactor (its last step failing or not; plain, with a
step-level lock and a reactor-level rate limit, whose charge is counted too, with a
reactor-level period, a semaphore and a step-level period, with a ``map_step`` of three
elements each under a lock and a period of its own, with a composed child — a semaphore in
it — under the parent's reactor-level lock, or with an ordered lock on its middle step) on the
real database and Redis, delivering it here as the worker task would (with the task's clock),
and raises the exception at the ``line``-th line the delivery runs in ``reactor_app``'s own
code or the steps' (a trace function: one thread's, fired once, as the signal is). Then it
delivers again, as the requeue or the sweep would, until the run ends, and checks the ledger
the hooks wrote, that the ended run holds nothing in Redis and left no renewal running in the
process, and that a cut in the engine's own code stopped its delivery there (``stop_problems``).
Before delivering a parked execution again it runs the sweep's completion of lost
places in line: a cut between the place an ordered line gave and the place's record leaves the
unit parked behind its own lost place until the sweep completes it (docs/coordination.md,
"Losing a place in line"; a named regression below checks that step alone)."""

from __future__ import annotations

import dis
import json
import linecache
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reactor_app
from reactor_app import (
    Reactor,
    Step,
    Success,
    compose,
    element,
    from_input,
    map_step,
    signals,
    step,
    value,
    with_lock,
    with_ordered_lock,
    with_period,
    with_rate_limit,
    with_semaphore,
)
from reactor_app.coordination.redis import get_client
from reactor_app.coordination.renewal import Renewal, RenewalScheduler, scheduler
from reactor_app.engine import cancel_flag
from reactor_app.engine.claim import ExecutionClaim
from reactor_app.engine.context import StepContext
from reactor_app.engine.dispatch import deliver
from reactor_app.engine.enqueueing import START_HEADER
from reactor_app.engine.executor import ExecutionRun
from reactor_app.engine.stranded_positions import complete_stranded_heads
from reactor_app.engine.time_slice import time_slice
from reactor_app.engine.worker import ClaimLost
from reactor_app.models import Execution
from reactor_app.status import TERMINAL_STATUSES, ExecutionStatus
from reactor_app.testing import coordination_state
from reactor_app.tracking import StepRecorder
from reactor_app.write_behind import flush
from tests.integration.test_long_countdowns import taken

pytestmark = pytest.mark.django_db(transaction=True)

#: what the hooks did, in order: "do:s0", "undo:s0", "compensate:s2"...
LEDGER: list[str] = []
STEPS = ("s0", "s1", "s2")
#: the code a soft limit may land in: the engine's, and this module's bodies and hooks
TRACED = (str(Path(reactor_app.__file__).parent), __file__)
#: deliveries after the cut one before a run must have ended (a park or a requeue each)
MORE_DELIVERIES = 6
#: generated cases per run (``make soak`` sets more: ``REACTOR_SOFT_LIMIT_EXAMPLES``)
EXAMPLES = int(os.environ.get("REACTOR_SOFT_LIMIT_EXAMPLES", "150"))


class Effect(Step):
    inputs = ("name", "fail")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        LEDGER.append(f"do:{args['name']}")
        if args["fail"]:
            raise RuntimeError("planned failure")
        return Success(args["name"])

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        LEDGER.append(f"undo:{args['name']}")

    def compensate(self, error: BaseException, args: dict[str, Any], context: Any) -> None:
        LEDGER.append(f"compensate:{args['name']}")


class ThreeEffects(Reactor):
    inputs = ("fail",)
    s0 = step(Effect, name=value("s0"), fail=value(False))
    s1 = step(Effect, name=value("s1"), fail=value(False))
    s2 = step(Effect, name=value("s2"), fail=from_input("fail"))


#: how many more times a key or cost function below raises the soft limit
FUNCTION_CUTS: list[int] = [0]


def _cut_key(values: dict[str, Any]) -> str:
    if FUNCTION_CUTS[0]:
        FUNCTION_CUTS[0] -= 1
        raise SoftTimeLimitExceeded()
    return "soft-limit"


def _cut_cost(values: dict[str, Any]) -> int:
    _cut_key(values)
    return 1


@with_lock(_cut_key, ttl=30)
class LockedEffect(Effect):
    """``Effect`` under a step-level lock whose key function may be cut off."""


@with_rate_limit(lambda args: "soft-limit", limit=100, period=60, cost=_cut_cost)
class ChargedEffect(Effect):
    """``Effect`` under a step-level rate limit whose cost function may be cut off."""


class StepKeyCut(ThreeEffects):
    s1 = step(LockedEffect, name=value("s1"), fail=value(False))


class StepCostCut(ThreeEffects):
    s1 = step(ChargedEffect, name=value("s1"), fail=value(False))


@with_rate_limit(lambda inputs: f"soft-limit:{inputs['tag']}", limit=1000, period=60)
class GatedThreeEffects(ThreeEffects):
    """The property's coordinated variant: a step-level lock on ``s1`` and a reactor-level
    rate limit (a run is charged once, whatever its deliveries), on a key of each run's."""

    inputs = ("fail", "tag")
    s1 = step(LockedEffect, name=value("s1"), fail=value(False))


@with_period(lambda inputs: f"soft-limit:{inputs['tag']}", every="day", ttl=30)
class PeriodThreeEffects(ThreeEffects):
    """A reactor-level period, on a bucket of each run's."""

    inputs = ("fail", "tag")


@with_period(lambda args: f"soft-limit-step:{args['tag']}", every="day", ttl=30)
class PeriodEffect(Effect):
    """``Effect`` under a step-level period, on a bucket of each run's."""

    inputs = ("name", "fail", "tag")


class StepPeriodThreeEffects(ThreeEffects):
    inputs = ("fail", "tag")
    s1 = step(PeriodEffect, name=value("s1"), fail=value(False), tag=from_input("tag"))


@with_semaphore(lambda args: f"soft-limit-slot:{args['tag']}", limit=1, ttl=30)
class SlotEffect(Effect):
    """``Effect`` under a step-level semaphore of one slot, of each run's."""

    inputs = ("name", "fail", "tag")


@with_period(lambda inputs: f"soft-limit:{inputs['tag']}", every="day", ttl=30)
class PeriodsThreeEffects(ThreeEffects):
    """The property's other coordinated variant: a reactor-level period, a semaphore on
    ``s0`` and a step-level period on ``s1``, on buckets and keys of each run's."""

    inputs = ("fail", "tag")
    s0 = step(SlotEffect, name=value("s0"), fail=value(False), tag=from_input("tag"))
    s1 = step(PeriodEffect, name=value("s1"), fail=value(False), tag=from_input("tag"))


@with_ordered_lock(lambda args: f"soft-limit-line:{args['tag']}")
class InLineEffect(Effect):
    """``Effect`` under a strict ordered lock, on a line of each run's: a cut the engine took
    for the step's failure would end the line, and the step's next run would be skipped."""

    inputs = ("name", "fail", "tag")


class OrderedThreeEffects(ThreeEffects):
    inputs = ("fail", "tag")
    s1 = step(InLineEffect, name=value("s1"), fail=value(False), tag=from_input("tag"))


@with_period(lambda args: f"soft-limit-element:{args['tag']}:{args['name']}", every="day", ttl=30)
@with_lock(lambda args: f"soft-limit-element:{args['tag']}:{args['name']}", ttl=30)
class ElementEffect(Effect):
    """``Effect`` under a lock and a period of each element's own, of each run's."""

    inputs = ("name", "fail", "tag")


class MappedThreeEffects(ThreeEffects):
    """The property's map: ``s1`` is three elements, each coordinated on its own arguments —
    units of their own, checkpointed, undone and run again each in its place."""

    inputs = ("fail", "tag")
    s1 = map_step(
        ElementEffect,
        over=value(["s1[0]", "s1[1]", "s1[2]"]),
        name=element(),
        fail=value(False),
        tag=from_input("tag"),
    )


class ChildEffects(Reactor):
    """Two steps composed into a parent: the first under a semaphore of one slot."""

    inputs = ("tag",)
    c0 = step(SlotEffect, name=value("c0"), fail=value(False), tag=from_input("tag"))
    c1 = step(Effect, name=value("c1"), fail=value(False))


@with_lock(lambda inputs: f"soft-limit-parent:{inputs['tag']}", ttl=30)
class ComposedThreeEffects(ThreeEffects):
    """The property's composed child, in a parent under a reactor-level lock: the child's
    steps are part of the parent's run and of its rollback."""

    inputs = ("fail", "tag")
    s1 = compose(ChildEffects, tag=from_input("tag"))


#: the units of each reactor the property generates, in the order they run (an element of a
#: map and a step of a composed child are units of their own, undone in their place)
UNITS: dict[type[Reactor], tuple[str, ...]] = {
    ThreeEffects: STEPS,
    GatedThreeEffects: STEPS,
    PeriodsThreeEffects: STEPS,
    MappedThreeEffects: ("s0", "s1[0]", "s1[1]", "s1[2]", "s2"),
    ComposedThreeEffects: ("s0", "c0", "c1", "s2"),
    OrderedThreeEffects: STEPS,
}


@with_lock(_cut_key, ttl=30)
class ReactorKeyCut(ThreeEffects):
    """A reactor-level lock whose key function may be cut off (in the gate, before any
    step)."""


class ProcessStopped(BaseException):
    """A stop that is not an ``Exception``, as gevent's hard time limit (a ``gevent.Timeout``)
    and the ``SystemExit`` of a prefork child told to terminate are (``test_stop_anywhere``)."""


class SoftLimitAt:
    """A trace function that raises ``SoftTimeLimitExceeded`` (or ``raises``) at the
    ``line``-th traced line (0: never; it only counts them) of the files under ``traced`` (the
    project and this test, unless told)."""

    #: what it raises
    raises: type[BaseException] = SoftTimeLimitExceeded

    def __init__(self, line: int, traced: tuple[str, ...] = TRACED) -> None:
        self.line = line
        self.traced = traced
        self.seen = 0
        self.fired_in: str | None = None
        #: the hooks that had run when it fired, and when the delivery it cut ended
        self.ledger_then = 0
        self.ledger_after = 0
        #: how the delivery it cut ended (``_deliver``)
        self.outcome: str | None = None
        #: it fired in a body, a hook or a declaration's function, or on the line calling one
        self.in_user_code = False
        #: how many times it has fired (``_deliver`` tells the delivery it cut by it)
        self.fired = 0

    def __enter__(self) -> SoftLimitAt:
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)

    def _call(self, frame: FrameType, event: str, arg: Any) -> Any:
        if self.fired_in is None and frame.f_code.co_filename.startswith(self.traced):
            # not the tracer's own methods (its ``__exit__``, called once the delivery has
            # returned): a cut there would land after the delivery, outside it
            return None if frame.f_locals.get("self") is self else self._line
        return None

    def _line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != "line" or self.fired_in is not None:
            return None if self.fired_in is not None else self._line
        source = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        if source.startswith(("with ", "async with ")):
            # A line event fires on a with statement's line again as its block ends, before
            # the context manager's exit runs and outside the block's protection: raising
            # there leaves a lock taken for good. A signal can land there too, in any
            # library's code; Celery's hard limit ends such a process. Not what this checks.
            return self._line
        if dis.opname[frame.f_code.co_code[frame.f_lasti]] == "NOP":
            # A line that is a NOP (a try statement's own line): no signal can land there —
            # the interpreter runs a signal's handler only where it checks for one (a call, a
            # backward jump) — and an exception raised at a nested try's NOP escapes the
            # enclosing try's handlers (CPython 3.11's exception table leaves it out), so the
            # step's gate was never left: its holds' renewal ran on after the delivery.
            return self._line
        self.seen += 1
        if self.seen == self.line:
            self.fired_in = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
            self.ledger_then = len(LEDGER)
            self.in_user_code = _in_user_code(frame)
            self.fired += 1
            sys.settrace(None)
            raise self.raises()
        return self._line

    def delivery_ended(self, outcome: str) -> None:
        """The delivery it cut ended so (``_deliver``): what ``stop_problems`` reads."""
        self.outcome, self.ledger_after = outcome, len(LEDGER)


#: how the engine's lines that call a body or a rollback hook read (``engine.runner``,
#: ``engine.rollback``), and those before the call in the same ``try`` (a verdict of lost
#: deliveries, raised in the unit's place): a limit raised on such a line is the unit's own
CALLING = (
    "instance.run(",
    "instance.undo(",
    "instance.compensate(",
    "call(context)",
    "if lost is not None:",
    "raise lost",
)


def _in_user_code(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs a body, a hook or a declaration's function of this module (or
    the engine's line calling one) for the delivery: the frames above ``deliver`` only (this
    module's own delivery loop is below it)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "deliver" and code.co_filename.endswith("delivery.py"):
            return False
        if code.co_filename == __file__:
            return True
        if any(call in linecache.getline(code.co_filename, frame.f_lineno) for call in CALLING):
            return True
        frame = frame.f_back
    return False


#: how a delivery ends when it stops where it was cut: by the limit itself (out of the task,
#: or caught at its top), or parked for a new delivery at once (a cut between a body and its
#: checkpoint, ``engine.time_slice``)
STOPPED = ("raised", "time_up", "parked")


class Stop(Protocol):
    """Where one cut landed and how the delivery it cut ended (a ``SoftLimitAt``'s one cut,
    or each of a tracer's cuts in ``test_soft_limit_twice``)."""

    fired_in: str | None
    in_user_code: bool
    outcome: str | None
    ledger_then: int
    ledger_after: int


def stop_problems(tracer: Stop) -> list[str]:
    """What the delivery ``tracer`` cut broke of "a soft limit in the engine's own code ends
    the delivery there, as if its worker had been killed" (docs/operations.md, "Celery time
    limits"): once cut outside any body or hook, it started none, and did not end the run.
    A place that catches every ``Exception`` around the engine's own work would run the
    delivery on past its limit, towards the hard one that kills its process."""
    if tracer.fired_in is None or tracer.in_user_code:
        return []
    problems = []
    if tracer.outcome not in STOPPED:
        problems.append(f"the cut delivery went on past its soft limit to {tracer.outcome!r}")
    if tracer.ledger_after != tracer.ledger_then:
        ran = LEDGER[tracer.ledger_then : tracer.ledger_after]
        problems.append(f"the cut delivery ran {ran} after its soft limit")
    return problems


def _deliver(execution: Execution, first: dict[str, Any], tracer: SoftLimitAt | None) -> str:
    """One delivery as the worker task makes it, with its task's clock (a soft limit far off:
    only the trace function cuts it). An exception out of it ends the task; the sweep sends
    the execution again, once its claim has lapsed."""
    clock = time_slice(hard=None, soft=600)
    fired_before = tracer.fired if tracer is not None else 0
    try:
        if tracer is None:
            report = deliver(str(execution.id), start=first.get(START_HEADER), clock=clock)
        else:
            with tracer:
                report = deliver(str(execution.id), start=first.get(START_HEADER), clock=clock)
        outcome = str(report["outcome"])
    except (SoftTimeLimitExceeded, ProcessStopped):
        outcome = "raised"
    if tracer is not None and tracer.fired > fired_before:  # it cut this delivery
        tracer.delivery_ended(outcome)
    return outcome


def _until_ended(
    execution: Execution,
    first: dict[str, Any],
    queue: str,
    tracer: SoftLimitAt | None = None,
    before: Callable[[Execution, int], None] | None = None,
    *,
    sweeps: bool = True,
    trace_all: bool = False,
    more: int = MORE_DELIVERIES,
) -> list[str]:
    """Deliver ``execution`` (the first delivery under ``tracer``; every one with
    ``trace_all``), then again, as the requeue or the sweep would, until it ends or ``more``
    more were made; their outcomes. ``before(execution, n)`` runs before the ``n``-th delivery
    after the first (an operator's cancel). ``sweeps``: a parked execution's lost places in
    line are swept first (``_sweep_lost_places``)."""
    outcomes = [_deliver(execution, first, tracer)]
    for number in range(1, more + 1):
        if before is not None:
            before(execution, number)
        execution.refresh_from_db()
        if execution.status in TERMINAL_STATUSES:
            break
        if outcomes[-1] == "raised" and ExecutionClaim.is_held(execution.id):
            # the task ended with the exception: its claim lapses with its TTL (the sweep
            # waits longer than that before sending the execution again)
            lapsed = ExecutionClaim(execution.id, "lapsed")
            lapsed.client.delete(lapsed.name)
        if sweeps and execution.status == ExecutionStatus.PARKED:
            _sweep_lost_places()
        outcomes.append(_deliver(execution, {}, tracer if trace_all else None))
        taken(queue)
    execution.refresh_from_db()
    return outcomes


def _sweep_lost_places() -> None:
    """What the sweep does for a parked execution's ordered lines: a place in line that a cut
    delivery took and never recorded is completed once it has been silent for
    ``REACTOR_SWEEP_AFTER`` (set short here: no delivery runs between two of this loop's), so
    the unit that took a new place when it came back is not parked behind its own lost one
    (``engine.stranded_positions``)."""
    with override_settings(REACTOR_SWEEP_AFTER=SWEEP_AFTER):
        time.sleep(SWEEP_AFTER)
        complete_stranded_heads()


#: seconds a lost place in line stays silent before this loop's sweep completes it
SWEEP_AFTER = 0.02


def _started(
    reactor: type[Reactor], inputs: dict[str, Any], queue: str
) -> tuple[Execution, dict[str, Any]]:
    """A new run of ``reactor`` (the ledger cleared) and the message ``run_async`` sent."""
    LEDGER.clear()
    taken(queue)
    execution = reactor.run_async(**inputs)
    (first,) = taken(queue)
    return execution, first


def _run(
    reactor: type[ThreeEffects], fail: bool, line: int, queue: str
) -> tuple[Execution, SoftLimitAt, list[str]]:
    tags = {"tag": uuid.uuid4().hex} if "tag" in reactor.inputs else {}
    execution, first = _started(reactor, {"fail": fail, **tags}, queue)
    tracer = SoftLimitAt(line)
    return execution, tracer, _until_ended(execution, first, queue, tracer)


def lines_of_a_clean_delivery(reactor: type[ThreeEffects], fail: bool, queue: str) -> int:
    _, counter, _ = _run(reactor, fail, 0, queue)
    return counter.seen


#: a generated cut: where (a share of a clean delivery's lines), whether the last step fails,
#: and the reactor
CUTS = {
    "share": st.floats(min_value=0, max_value=1, exclude_max=True),
    "fail": st.booleans(),
    "reactor": st.sampled_from(list(UNITS)),
}


def cut_settings(examples: int) -> settings:
    """The settings of a property over generated cuts (each case runs real deliveries)."""
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@cut_settings(EXAMPLES)
@given(**CUTS)
def test_a_soft_limit_at_any_line_keeps_the_saga_promise(
    nobody_queue: str, share: float, fail: bool, reactor: type[ThreeEffects]
) -> None:
    # (how many lines a delivery runs varies a little from one to the next: the point is
    # drawn as a share of a clean delivery's)
    renewing_before = scheduler().renewing()
    lines = lines_of_a_clean_delivery(reactor, fail, nobody_queue)
    line = 1 + int(share * lines)
    execution, tracer, outcomes = _run(reactor, fail, line, nobody_queue)
    problems = saga_problems(fail, execution, UNITS[reactor])
    problems += left_behind(execution, renewing_before)
    problems += stop_problems(tracer)
    if reactor is GatedThreeEffects and LEDGER:
        # A body ran, so the run was admitted: charged once, whatever its deliveries — the
        # admission is written down before the first body. Cut before that write, the charge
        # was made and not recorded: the next delivery charges again (the at-least-once rule
        # of a killed delivery; one cut, so twice at most).
        charged = coordination_state().rate_limit(f"soft-limit:{execution.inputs['tag']}", 60)
        if charged > (1 if tracer.ledger_then else 2):
            problems.append(
                f"the reactor's rate limit charged {charged} times for one run "
                f"(cut after {tracer.ledger_then} hooks ran)"
            )
    assert not problems, (
        f"cut at {tracer.fired_in} (line {line} of {lines}); deliveries {outcomes}",
        problems,
        LEDGER,
    )


def renewing_since(before: list[Renewal]) -> list[Renewal]:
    """The renewals of this process renewing now that were not in ``before`` (a test compared
    with itself: what an earlier test left renewing may end meanwhile)."""
    return [r for r in scheduler().renewing() if not any(r is b for b in before)]


def left_behind(execution: Execution, renewing_before: list[Renewal]) -> list[str]:
    """What an ended run left: holds in Redis (what a cut delivery kept, the next one took
    over and gave back), renewals of this process still running (one left would renew a hold
    with no work under it until the next delivery gave it back, then log it lost)."""
    problems = []
    held = [h for h in coordination_state().holds() if h["execution"] == str(execution.id)]
    if held:
        problems.append(f"still held after the run ended: {held}")
    renewing = renewing_since(renewing_before)
    if renewing:
        holds = [[(h.claim.primitive, h.claim.key) for h in r.holds] for r in renewing]
        problems.append(f"renewals still running after the run ended: {holds}")
    return problems


def ledger_problems(
    units: tuple[str, ...], *, reversed_once: bool = False, cuts: int = 1
) -> list[str]:
    """What the ledger breaks of any run's rules, unit by unit: a body or hook run more than
    once per cut plus once (the at-least-once rule), an undo without its body (a compensate
    may come without one: a body cut off on its first line, before its effect, failed like
    any body that raised; or a unit a lost delivery may have been running,
    ``engine.in_flight``). ``reversed_once``: the run was rolled back, so every body that ran
    was undone or compensated — one of the two."""
    problems = []
    counts = Counter(LEDGER)
    for name in units:
        dos, undos, compensates = (
            counts[f"{kind}:{name}"] for kind in ("do", "undo", "compensate")
        )
        if max(dos, undos, compensates) > cuts + 1:
            problems.append(f"{name} ran more than {cuts + 1} times: {counts}")
        if undos and not dos:
            problems.append(f"{name} undone without its body")
        if reversed_once and dos and not (undos or compensates):
            problems.append(f"{name}'s effect stands: neither undone nor compensated")
        if reversed_once and undos and compensates:
            problems.append(f"{name} both undone and compensated")
    return problems


def end_problems(fail: bool, execution: Execution, units: tuple[str, ...]) -> list[str]:
    """What the way the ended ``execution`` ended breaks: a success although its last unit
    fails, without every body, or with effects undone or compensated; an end neither
    succeeded nor failed; a failure for another reason than a cut-off body."""
    counts = Counter(LEDGER)
    problems = []
    if execution.status == ExecutionStatus.SUCCEEDED:
        if fail:
            problems.append("succeeded although its last step fails")
        if not all(counts[f"do:{name}"] for name in units):
            problems.append("succeeded without running every body")
        if [e for e in LEDGER if not e.startswith("do:")]:
            problems.append("succeeded with effects undone or compensated")
    elif execution.status != ExecutionStatus.FAILED:
        problems.append(f"ended {execution.status}")
    elif not fail and "TaskTimeLimitExceeded" not in str(execution.error):
        # only a body cut off although it started its delivery fails its attempt
        problems.append(f"failed for another reason than a cut-off body: {execution.error}")
    return problems


def saga_problems(fail: bool, execution: Execution, units: tuple[str, ...] = STEPS) -> list[str]:
    """What the ended run and the ledger break of the promise, with the at-least-once rule of
    a delivery killed (here: cut) between a unit's effect and its record — one cut, so a body
    or a hook runs at most twice (docs/reactors-and-steps.md, "A worker that dies during the
    rollback"). ``units``: the run's units in the order they run, the last one failing when
    ``fail``."""
    if execution.status not in TERMINAL_STATUSES:
        return [f"not ended: {execution.status}"]
    problems = ledger_problems(units) + end_problems(fail, execution, units)
    if execution.status != ExecutionStatus.FAILED:
        return problems
    counts = Counter(LEDGER)
    failed_step = next(
        (n for n in reversed(units) if counts[f"do:{n}"] or counts[f"compensate:{n}"]), None
    )
    if failed_step is None:
        return [*problems, f"failed before any body ran: {execution.error}"]
    # every completed body undone (newest first), each attempt of the failing step compensated
    completed_before = list(units[: units.index(failed_step)])
    undone = list(dict.fromkeys(e[5:] for e in LEDGER if e.startswith("undo:")))
    if undone != completed_before[::-1]:
        problems.append(f"undone {undone}, not {completed_before[::-1]} newest first")
    if not 1 <= counts[f"compensate:{failed_step}"] <= max(counts[f"do:{failed_step}"], 1):
        problems.append(f"{failed_step}'s attempts not compensated once each: {counts}")
    return problems


# -- named regressions: the places the property found, cut there on purpose -----------------


def _run_cut_once(
    reactor: type[Reactor],
    inputs: dict[str, Any],
    queue: str,
    when: list[str] | Callable[[Any], bool] | None = None,
    method: str = "checkpoint",
    *,
    target: Any = ExecutionRun,
    raises: type[BaseException] = SoftTimeLimitExceeded,
    before: Callable[[Execution, int], None] | None = None,
    sweeps: bool = True,
) -> tuple[Execution, list[str]]:
    """Run ``reactor`` as the property does, with ``target.<method>`` raising the soft limit
    once — the first time it is called with the ledger at ``when`` (or, a function, when it
    says so of the object called; ``None``: the first call) — then deliver until the run
    ends (``before``, ``sweeps``: as ``_until_ended``); the execution and the deliveries'
    outcomes."""
    execution, first = _started(reactor, inputs, queue)
    original = getattr(target, method)

    def cut(self: Any, *args: Any, **kwargs: Any) -> Any:
        if when is None or (when(self) if callable(when) else list(LEDGER) == when):
            setattr(target, method, original)
            raise raises()  # once, as Celery's signal handler raises it
        return original(self, *args, **kwargs)

    setattr(target, method, cut)
    try:
        outcomes = _until_ended(execution, first, queue, before=before, sweeps=sweeps)
    finally:
        setattr(target, method, original)
    return execution, outcomes


#: how many more times the where= predicate below raises the soft limit
WHERE_CUTS: list[int] = [0]


def _cut_once(inputs: dict[str, Any], results: dict[str, Any]) -> bool:
    if WHERE_CUTS[0]:
        WHERE_CUTS[0] -= 1
        raise SoftTimeLimitExceeded()
    return True


class GuardedEffects(Reactor):
    inputs = ("fail",)
    s0 = step(Effect, name=value("s0"), fail=value(False))
    s1 = step(Effect, name=value("s1"), fail=value(False), where=_cut_once)
    s2 = step(Effect, name=value("s2"), fail=value(False))


def test_a_soft_limit_between_a_body_and_its_checkpoint_runs_the_step_again(
    nobody_queue: str,
) -> None:
    """Found by the property: the engine's check after a body (its checkpoint, the cancel
    flag's read) caught the exception as the body's failure — the run was compensated and
    failed for a limit no body exceeded. Now the step runs again in the next delivery, as
    after a delivery killed before its checkpoint."""
    execution, first = _started(ThreeEffects, {"fail": False}, nobody_queue)
    original = StepContext.checkpoint

    def spent(self: StepContext) -> None:
        StepContext.checkpoint = original  # type: ignore[method-assign]
        raise SoftTimeLimitExceeded()  # once, as Celery's signal handler raises it

    StepContext.checkpoint = spent  # type: ignore[method-assign]
    try:
        outcomes = _until_ended(execution, first, nobody_queue)
    finally:
        StepContext.checkpoint = original  # type: ignore[method-assign]
    assert execution.status == ExecutionStatus.SUCCEEDED, (outcomes, execution.error)
    assert LEDGER == ["do:s0", "do:s0", "do:s1", "do:s2"], LEDGER
    assert saga_problems(False, execution) == []
    flush()
    retried = execution.step_runs.filter(step="s0", status="retried").get()
    assert retried.error["type"] == "DeliveryTimeUp", retried.error
    assert "before its checkpoint" in retried.error["message"], retried.error


@pytest.mark.parametrize(
    ("raises", "stopped"),
    [(SoftTimeLimitExceeded, "time_up"), (ClaimLost, "claim_lost")],
    ids=["soft-limit", "claim-lost"],
)
def test_a_soft_limit_after_a_step_entered_a_strict_line_runs_it_again_in_its_place(
    nobody_queue: str, raises: type[Exception], stopped: str
) -> None:
    """Found by the property once its line was strict (it had been ``strict=False``): a cut
    in the engine's own code after a step's ordered lock admitted it, before its body — here
    the step run's start record — left the attempt through the gate's exit as a *failure*,
    which ends a strict line. The next delivery's run of the step was skipped
    (``ordered_lock_chain_failed``), and the run succeeded without it. Now the cut releases
    the step as a retry: its place stays, and the next delivery runs it there. The same for
    a claim found lost there (the verdict of lost deliveries is written down at that point,
    ``take_verdict``, a write conditional on the claim)."""
    tag = uuid.uuid4().hex
    execution, outcomes = _run_cut_once(
        OrderedThreeEffects,
        {"fail": False, "tag": tag},
        nobody_queue,
        ["do:s0"],
        "started",
        target=StepRecorder,
        raises=raises,
    )
    assert outcomes[0] == stopped, outcomes
    assert execution.status == ExecutionStatus.SUCCEEDED, (outcomes, execution.error)
    assert LEDGER == ["do:s0", "do:s1", "do:s2"], LEDGER
    assert not execution.step_runs.filter(status="skipped").exists()


def test_a_soft_limit_before_the_first_checkpoint_charges_the_reactor_rate_limit_once(
    nobody_queue: str,
) -> None:
    """Found by the property: a delivery cut off after its first body, in the progress write
    after it, left no record of the run's reactor-level admission, so the delivery that went
    on was charged the rate limit again — twice for one run. The admission is now written
    down before the first body."""
    tag = uuid.uuid4().hex
    inputs = {"fail": False, "tag": tag}
    execution, outcomes = _run_cut_once(GatedThreeEffects, inputs, nobody_queue, ["do:s0"])
    assert outcomes[0] == "time_up", outcomes
    assert execution.status == ExecutionStatus.SUCCEEDED, (outcomes, execution.error)
    assert LEDGER == ["do:s0", "do:s0", "do:s1", "do:s2"], LEDGER  # s0 again: at least once
    assert coordination_state().rate_limit(f"soft-limit:{tag}", 60) == 1


def test_a_soft_limit_in_a_where_predicate_ends_the_delivery_not_the_run(
    nobody_queue: str,
) -> None:
    """Found by the property: a ``where=`` predicate cut off failed its step (``where= ...
    raised SoftTimeLimitExceeded``) and rolled the run back. The predicate is not a body: the
    delivery ends as a killed one would, and the next one evaluates it again."""
    WHERE_CUTS[0] = 1
    execution, first = _started(GuardedEffects, {"fail": False}, nobody_queue)
    outcomes = _until_ended(execution, first, nobody_queue)
    assert outcomes[0] == "time_up", outcomes
    assert execution.status == ExecutionStatus.SUCCEEDED, (outcomes, execution.error)
    assert LEDGER == ["do:s0", "do:s1", "do:s2"], LEDGER


@pytest.mark.parametrize("reactor", [StepKeyCut, StepCostCut, ReactorKeyCut])
def test_a_soft_limit_in_a_key_or_cost_function_ends_the_delivery_not_the_run(
    nobody_queue: str, reactor: type[Reactor]
) -> None:
    """A declaration's key or cost function cut off was reported as that function's failure
    (``CoordinationKeyError``, ``RateLimitCostError``): the step failed, the run rolled back.
    Nothing was taken and no body ran: the delivery ends as a killed one would, and the next
    one computes the key again."""
    FUNCTION_CUTS[0] = 1
    execution, first = _started(reactor, {"fail": False}, nobody_queue)
    outcomes = _until_ended(execution, first, nobody_queue)
    assert FUNCTION_CUTS == [0]
    assert outcomes[0] == "time_up", outcomes
    assert execution.status == ExecutionStatus.SUCCEEDED, (outcomes, execution.error)
    assert LEDGER == ["do:s0", "do:s1", "do:s2"], LEDGER


def test_a_soft_limit_after_a_period_s_success_mark_ends_the_run_as_it_succeeded(
    nobody_queue: str,
) -> None:
    """Found by a scan of a reactor-level period's delivery: cut after the reactor's release
    had marked the bucket done (every step had succeeded) and before the run's end was
    written, the next delivery found the bucket marked, took the mark for another run's and
    failed the run, undoing all three steps of a success. Its own mark ends the run as the
    cut delivery would have: succeeded, nothing undone, the bucket its own."""
    tag = uuid.uuid4().hex
    inputs = {"fail": False, "tag": tag}
    execution, outcomes = _run_cut_once(PeriodThreeEffects, inputs, nobody_queue, method="finish")
    assert outcomes[0] == "time_up", outcomes  # the end was never written
    assert coordination_state().period_marked_by(f"soft-limit:{tag}", "day") == str(execution.id)
    assert execution.status == ExecutionStatus.SUCCEEDED, (outcomes, execution.error)
    assert LEDGER == ["do:s0", "do:s1", "do:s2"], LEDGER


@pytest.mark.parametrize("fail", [False, True])
def test_a_soft_limit_after_a_step_s_period_mark_runs_the_step_again(
    nobody_queue: str, fail: bool
) -> None:
    """Found by reading, after the scan's reactor-level case, and confirmed by a probe: cut
    after a step's release had marked its period bucket and before its checkpoint, the next
    delivery found the bucket marked and skipped the step — its body had run, but the run did
    not know, so a later failure left its effect in place, never undone. The mark of the
    unit's own success now lets the unit run again (at least once, as any unit whose record
    was lost), and it is undone with the others."""
    tag = uuid.uuid4().hex
    inputs = {"fail": fail, "tag": tag}
    when = ["do:s0", "do:s1"]
    execution, outcomes = _run_cut_once(StepPeriodThreeEffects, inputs, nobody_queue, when)
    assert outcomes[0] == "time_up", outcomes
    assert saga_problems(fail, execution) == [], (outcomes, LEDGER, execution.error)
    ran = ["do:s0", "do:s1", "do:s1", "do:s2"]
    if fail:
        assert list(LEDGER) == [*ran, "compensate:s2", "undo:s1", "undo:s0"], LEDGER
    else:
        assert execution.status == ExecutionStatus.SUCCEEDED, execution.error
        assert list(LEDGER) == ran, LEDGER
        marked_by = coordination_state().period_marked_by(f"soft-limit-step:{tag}", "day")
        assert marked_by == str(execution.id)


def test_a_soft_limit_before_a_place_in_line_is_recorded_costs_a_sweep_not_the_pill(
    nobody_queue: str, settings: Any
) -> None:
    """Found by a scan with an ordered lock: cut after the line gave ``s1`` its place and
    before the execution recorded it, the next delivery took a new place and parked behind
    the lost one — its own — until ``poison_pill_timeout`` (ten minutes by default). The
    sweep now completes a silent head whose execution records a later place for the same
    unit, and the run goes on."""
    settings.REACTOR_SWEEP_AFTER = 0.2
    tag = uuid.uuid4().hex
    inputs = {"fail": False, "tag": tag}
    execution, outcomes = _run_cut_once(
        OrderedThreeEffects, inputs, nobody_queue, ["do:s0"], method="persist", sweeps=False
    )
    assert outcomes[0] == "time_up", outcomes
    assert execution.status == ExecutionStatus.PARKED, outcomes  # behind its own lost place
    line = coordination_state().ordered_lock(f"soft-limit-line:{tag}")
    assert [p.execution for p in line.positions] == [str(execution.id)] * 2, line
    time.sleep(0.4)  # the lost place silent for REACTOR_SWEEP_AFTER
    assert complete_stranded_heads() == [f"soft-limit-line:{tag}#{line.positions[0].nonce}"]
    outcomes = _until_ended(execution, {}, nobody_queue)
    assert execution.status == ExecutionStatus.SUCCEEDED, (outcomes, execution.error)
    assert LEDGER == ["do:s0", "do:s1", "do:s2"], LEDGER


def test_a_soft_limit_while_a_renewal_starts_leaves_no_renewal_running(
    nobody_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by reading, after the property's check of renewals: the gate started a step's
    renewal and only then kept it, so a soft limit landing in between (a signal handler runs
    at any call, here the scheduler's) left the renewal running after the delivery ended —
    renewing a semaphore's lease with no work under it until the next delivery gave the slot
    back, then logging it lost. The gate now holds the renewal before it starts."""
    original = RenewalScheduler.add

    def add_then_cut(self: RenewalScheduler, renewal: Renewal) -> None:
        original(self, renewal)
        if renewal.holds[0].claim.primitive == "semaphore":
            monkeypatch.setattr(RenewalScheduler, "add", original)
            raise SoftTimeLimitExceeded()  # once, as Celery's signal handler raises it

    monkeypatch.setattr(RenewalScheduler, "add", add_then_cut)
    renewing_before = scheduler().renewing()
    execution, first = _started(
        PeriodsThreeEffects, {"fail": False, "tag": uuid.uuid4().hex}, nobody_queue
    )
    outcomes = _until_ended(execution, first, nobody_queue)
    assert outcomes[0] == "time_up", outcomes
    assert execution.status == ExecutionStatus.SUCCEEDED, (outcomes, execution.error)
    assert LEDGER == ["do:s0", "do:s1", "do:s2"], LEDGER  # cut before s0's body
    assert renewing_since(renewing_before) == []


@with_semaphore(lambda args: f"soft-limit-slot:{args['tag']}", limit=1, ttl=30)
class CancelsItself(Effect):
    """``Effect`` under a semaphore that raises its own execution's cancel flag in its body,
    as another process would: the release after it finds the flag and keeps the slot."""

    inputs = ("name", "fail", "tag")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        request = {"reason": "mid-body", "by": "test", "at": "now"}
        get_client().set(cancel_flag._key(context.execution_id), json.dumps(request), ex=60)
        return super().run(args, context)


class CancelledInItsFirstStep(ThreeEffects):
    inputs = ("fail", "tag")
    s0 = step(CancelsItself, name=value("s0"), fail=value(False), tag=from_input("tag"))


def test_a_soft_limit_while_a_kept_renewal_restarts_leaves_no_renewal_running(
    nobody_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same order, where a release finds the run cancelled and keeps its holds (renewed
    again while the step is undone under them): the gate restarted the renewal, then kept
    it. Now it keeps it first."""
    original = RenewalScheduler.add
    adds: list[Renewal] = []

    def second_add_cut(self: RenewalScheduler, renewal: Renewal) -> None:
        original(self, renewal)
        adds.append(renewal)
        if len(adds) == 2:  # the restart after the release found the cancel flag
            monkeypatch.setattr(RenewalScheduler, "add", original)
            raise SoftTimeLimitExceeded()  # once, as Celery's signal handler raises it

    monkeypatch.setattr(RenewalScheduler, "add", second_add_cut)
    renewing_before = scheduler().renewing()
    inputs = {"fail": False, "tag": uuid.uuid4().hex}
    execution, first = _started(CancelledInItsFirstStep, inputs, nobody_queue)
    outcomes = _until_ended(execution, first, nobody_queue)
    assert adds[0] is adds[1]  # the same renewal, restarted
    assert outcomes[0] == "time_up", outcomes
    assert execution.status == ExecutionStatus.CANCELLED, (outcomes, execution.error)
    assert renewing_since(renewing_before) == []


def test_a_soft_limit_in_a_signal_receiver_ends_the_delivery(nobody_queue: str) -> None:
    """Seen in the log of a scan of the fan-out property (``test_soft_limit_fan_out.py``; the
    runs' outcomes were right, so its checks passed), where the limit landed in the metrics'
    receiver of ``step_started``: the signals' dispatch caught it as that receiver's failure,
    logged it, and the delivery ran on past its soft limit. It now goes on up as from any
    other line: the delivery stops before ``s1``'s body, and the next one runs it."""
    cuts = [1]

    def cut_at_s1(sender: Any, step: str, **payload: Any) -> None:
        if step == "s1" and cuts[0]:
            cuts[0] -= 1
            raise SoftTimeLimitExceeded()  # once, as Celery's signal handler raises it

    signals.step_started.connect(cut_at_s1)
    try:
        execution, first = _started(ThreeEffects, {"fail": False}, nobody_queue)
        outcomes = _until_ended(execution, first, nobody_queue)
    finally:
        signals.step_started.disconnect(cut_at_s1)
    assert cuts == [0]
    assert outcomes[0] == "time_up", outcomes
    assert execution.status == ExecutionStatus.SUCCEEDED, (outcomes, execution.error)
    assert LEDGER == ["do:s0", "do:s1", "do:s2"], LEDGER
