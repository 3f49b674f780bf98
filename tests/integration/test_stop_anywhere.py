"""A stop that is not an ``Exception`` may land at any line of a worker delivery: the saga
promise holds, and the run ends as it would have without the stop.

gevent's hard time limit is a ``gevent.Timeout`` raised in the task at its next switch, and
prefork's pool sends a child it terminates SIGTERM — a ``SystemExit`` in the task — 0.1 s
before its SIGKILL (docs/operations.md, "Celery time limits"). Neither is an ``Exception``: no
``except Exception`` of the engine's or of a body's catches it, and it unwinds through every
``finally`` on its way out of the task. Such a stop is a kill that runs the cleanups: the
delivery ends where it landed, and the next one — sent by the sweep once the claim lapses —
takes over from the last checkpoint, the unit the stop cut running again (the at-least-once
rule of a killed delivery). It decides nothing: a run whose steps all succeed must succeed.
A release on the way out that took the stop for a failure ended a strict ordered line, and
the step's own next run was skipped (``test_hard_limit_in_line`` on real workers).

The same generated runs as ``test_soft_limit_anywhere`` (every coordinated variant, a strict
ordered line among them), with ``ProcessStopped`` raised at a generated line of the first
delivery — the engine's code, a body, a hook — then deliveries as the sweep would make them
until the run ends. Checked: the ledger's rules (each unit at most twice, nothing undone
without its body); the run succeeded when its last step does not fail and failed when it does;
nothing held or renewing after it ended; and the cut delivery ran nothing after the stop. A
second property stops any delivery of ``test_soft_limit_fan_out``'s run (a parallel map).
"""

from __future__ import annotations

import os
import uuid

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from reactor_app.coordination.renewal import scheduler
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.integration.test_soft_limit_anywhere import (
    CUTS,
    LEDGER,
    UNITS,
    OrderedThreeEffects,
    ProcessStopped,
    SoftLimitAt,
    ThreeEffects,
    _started,
    _until_ended,
    cut_settings,
    ledger_problems,
    left_behind,
    lines_of_a_clean_delivery,
)
from tests.integration.test_soft_limit_fan_out import UNITS as FANNED_UNITS
from tests.integration.test_soft_limit_fan_out import (
    left_by_the_tree,
    lines_of_a_clean_run,
    run_fanned,
    undo_order_problems,
)

pytestmark = pytest.mark.django_db(transaction=True)

#: generated cases per run (``make soak`` sets more: ``REACTOR_STOP_EXAMPLES``, and a fifth
#: of it for the fanned-out run)
EXAMPLES = int(os.environ.get("REACTOR_STOP_EXAMPLES", "100"))
FANNED_EXAMPLES = max(EXAMPLES // 5, 1)


class StopAt(SoftLimitAt):
    """The soft-limit property's tracer, raising a stop that is not an ``Exception``."""

    raises = ProcessStopped


def end_problems(fail: bool, execution: Execution, units: tuple[str, ...]) -> list[str]:
    """A stop is no step's failure: the run ends as it would have without it — succeeded with
    every body done and nothing undone, or failed at its failing last step."""
    expected = ExecutionStatus.FAILED if fail else ExecutionStatus.SUCCEEDED
    if execution.status != expected:
        return [f"ended {execution.status}, not {expected}: {execution.error}"]
    if fail:
        step = (execution.error or {}).get("step")
        return [] if step == units[-1] else [f"failed at {step!r}, not {units[-1]!r}"]
    problems = []
    if not all(f"do:{name}" in LEDGER for name in units):
        problems.append("succeeded without running every body")
    if [entry for entry in LEDGER if not entry.startswith("do:")]:
        problems.append("succeeded with effects undone or compensated")
    return problems


def stopped_there(tracer: SoftLimitAt) -> list[str]:
    """The stop left the task: the cut delivery ran no body or hook after it."""
    if tracer.fired_in is None:
        return []
    problems = []
    if tracer.outcome != "raised":
        problems.append(f"the stop did not end its delivery: it ended {tracer.outcome!r}")
    if tracer.ledger_after != tracer.ledger_then:
        ran = LEDGER[tracer.ledger_then : tracer.ledger_after]
        problems.append(f"the cut delivery ran {ran} after the stop")
    return problems


def assert_none(problems: list[str], tracer: SoftLimitAt, where: str, outcomes: list[str]) -> None:
    """No problem, the stop's own (``stopped_there``) included; else where it landed, how the
    deliveries ended, the problems and the ledger."""
    problems = problems + stopped_there(tracer)
    assert not problems, (
        f"stopped at {tracer.fired_in} ({where}); deliveries {outcomes}",
        problems,
        LEDGER,
    )


@cut_settings(EXAMPLES)
@given(**CUTS)
# a stop between a strict line's admission and the step's body (the step run's start): the
# engine released the step as a failure there, and the line ended
@example(share=0.42, fail=False, reactor=OrderedThreeEffects)
def test_a_stop_at_any_line_keeps_the_saga_promise_and_decides_nothing(
    nobody_queue: str, share: float, fail: bool, reactor: type[ThreeEffects]
) -> None:
    renewing_before = scheduler().renewing()
    lines = lines_of_a_clean_delivery(reactor, fail, nobody_queue)
    line = 1 + int(share * lines)
    tags = {"tag": uuid.uuid4().hex} if "tag" in reactor.inputs else {}
    execution, first = _started(reactor, {"fail": fail, **tags}, nobody_queue)
    tracer = StopAt(line)
    outcomes = _until_ended(execution, first, nobody_queue, tracer)

    problems = ledger_problems(UNITS[reactor])
    problems += end_problems(fail, execution, UNITS[reactor])
    problems += left_behind(execution, renewing_before)
    assert_none(problems, tracer, f"line {line} of {lines}", outcomes)


@cut_settings(FANNED_EXAMPLES)
@given(share=st.floats(min_value=0, max_value=1, exclude_max=True), fail=st.booleans())
def test_a_stop_at_any_line_of_a_fanned_out_run_keeps_the_saga_promise_and_decides_nothing(
    nobody_queue: str, share: float, fail: bool
) -> None:
    """The same stop at a line of *any* delivery of a run whose middle step is a parallel
    ``map_step`` (``test_soft_limit_fan_out``'s run: the parent's first delivery, an
    element's, or the parent's after the elements), every message then delivered and the
    sweep run as there. A failed run undoes its units newest first by completion."""
    renewing_before = scheduler().renewing()
    lines = lines_of_a_clean_run(fail, nobody_queue)
    line = 1 + int(share * lines)
    root, tracer, outcomes = run_fanned(fail, line, nobody_queue, tracer=StopAt(line))

    problems = ledger_problems(FANNED_UNITS, reversed_once=root.status == ExecutionStatus.FAILED)
    problems += end_problems(fail, root, FANNED_UNITS)
    if root.status == ExecutionStatus.FAILED:
        problems += undo_order_problems()
    problems += left_by_the_tree(root, renewing_before)
    assert_none(problems, tracer, f"line {line} of {lines}", outcomes)
