"""Celery's soft time limit at any line of any delivery of a run that fans out: the promise holds.

``test_soft_limit_anywhere`` cuts the first delivery of a run whose units all run in it. A
parallel ``map_step``'s elements run in deliveries of their own (child executions, each
coordinated on its own arguments) while the parent parks until they have all ended. Here the
soft limit lands at one generated line of *any* of the run's deliveries — the parent's first,
an element's, or the parent's after the elements ended — drawn as a share of all the lines a
clean run's deliveries take. Then every execution of the run with a message waiting is
delivered, as the workers would; when nothing runnable was sent (a cut delivery left its
execution running, or never sent an element's message), the real sweep runs, its clock moved
on by ``REACTOR_SWEEP_AFTER``, and sends those again — until the run ends. The checks are
the sequential property's: every body that ran stands, or is undone or compensated, once but
for the at-least-once rule of a cut delivery; completed units are undone newest first — here
in the order they completed, which for the elements is the order their deliveries happened
to end; and nothing is held in Redis or renewing in the process once the run has ended
(docs/operations.md, "Celery time limits").
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from celery import current_app
from django.db.models import Q
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from reactor_app import element, from_input, map_step, value
from reactor_app.conf import reactor_settings
from reactor_app.coordination.renewal import scheduler
from reactor_app.engine.claim import ExecutionClaim
from reactor_app.engine.enqueueing import START_HEADER
from reactor_app.engine.sweeper import sweep
from reactor_app.models import Execution
from reactor_app.status import TERMINAL_STATUSES, ExecutionStatus
from reactor_app.testing import coordination_state
from tests.integration.test_soft_limit_anywhere import (
    LEDGER,
    ElementEffect,
    SoftLimitAt,
    ThreeEffects,
    _deliver,
    _started,
    cut_settings,
    end_problems,
    ledger_problems,
    renewing_since,
    stop_problems,
)

pytestmark = pytest.mark.django_db(transaction=True)

#: generated cases per run (``make soak`` sets more: ``REACTOR_FAN_OUT_SOFT_LIMIT_EXAMPLES``)
EXAMPLES = int(os.environ.get("REACTOR_FAN_OUT_SOFT_LIMIT_EXAMPLES", "40"))
#: rounds of deliveries (each delivers every execution with a message waiting) a run gets
ROUNDS = 12
#: the statuses of an execution of the run that a message sends on (a parked one's requeue
#: only finds it waiting again)
RUNNABLE_HERE = (ExecutionStatus.PENDING, ExecutionStatus.RUNNING)
ELEMENTS = ("s1[0]", "s1[1]", "s1[2]")
UNITS = ("s0", *ELEMENTS, "s2")


class FannedThreeEffects(ThreeEffects):
    """``s1`` is a parallel map of three elements, each under a lock and a period of its own:
    three child executions, each delivered on its own."""

    inputs = ("fail", "tag")
    s1 = map_step(
        ElementEffect,
        over=value(list(ELEMENTS)),
        name=element(),
        fail=value(False),
        tag=from_input("tag"),
        parallel=True,
    )


def _waiting(queue: str) -> list[tuple[str, Any]]:
    """The executions the messages waiting in ``queue`` are for (consumed: nobody else reads
    it), each with its start header, in the order they were sent."""
    found = []
    with current_app.connection_for_read() as connection:
        channel = connection.default_channel
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            args = message.decode()[0]
            found.append((str(args[0]), dict(message.headers).get(START_HEADER)))
    return found


def _tree(root: Execution) -> list[Execution]:
    """``root`` and every execution of its tree (the elements' child executions)."""
    return list(Execution.objects.filter(Q(pk=root.pk) | Q(root=root.pk)))


def _deliver_once(execution_id: str, start: Any, tracer: SoftLimitAt) -> str:
    """One delivery of ``execution_id`` under ``tracer`` until it has fired. A delivery cut
    by it ends its task with the exception: its claim lapses with its TTL, as here at once
    (the sweep waits longer than that before sending the execution again)."""
    execution = Execution.objects.get(pk=execution_id)
    outcome = _deliver(execution, {START_HEADER: start} if start else {}, tracer)
    if outcome == "raised":
        lapsed = ExecutionClaim(execution_id, "lapsed")
        lapsed.client.delete(lapsed.name)
    return outcome


def run_fanned(
    fail: bool, line: int, queue: str, tracer: SoftLimitAt | None = None, rounds: int = ROUNDS
) -> tuple[Execution, SoftLimitAt, list[str]]:
    """A run of ``FannedThreeEffects`` whose deliveries are all traced until the ``line``-th
    traced line fires (0: never — it counts them), delivered until it ends (``rounds`` rounds
    at most); the root, the tracer and the outcomes as ``execution_id[:4]:outcome``. A
    ``tracer`` given is used instead (``line`` is then its)."""
    root, first = _started(FannedThreeEffects, {"fail": fail, "tag": uuid.uuid4().hex}, queue)
    tracer = tracer or SoftLimitAt(line)
    outcomes = []
    pending = [(str(root.pk), first.get(START_HEADER))]
    tree = {str(root.pk): root.status}
    # the sweep's clock, moved on by REACTOR_SWEEP_AFTER at each sweep: a sweep stamps what it
    # sends with its clock, so a second sweep on the same moved clock would find it fresh
    moved = timedelta(0)
    for _ in range(rounds):
        for execution_id, start in dict(pending).items():
            if tree.get(execution_id, ExecutionStatus.SUCCEEDED) in TERMINAL_STATUSES:
                continue  # ended, or another run's (the sweep sends any it finds)
            outcome = _deliver_once(execution_id, start, tracer)
            outcomes.append(f"{execution_id[:4]}:{outcome}")
        root.refresh_from_db()
        if root.status in TERMINAL_STATUSES:
            break
        pending = _waiting(queue)
        tree = {str(e.pk): e.status for e in _tree(root)}
        runnable = [i for i, _ in pending if tree.get(i) in RUNNABLE_HERE]
        if not runnable:
            # nothing runnable was sent: a cut delivery left its execution running, or never
            # sent an element's message. The sweep sends those again once they have been
            # silent for REACTOR_SWEEP_AFTER (its clock moved on by that much here, each time).
            moved += timedelta(seconds=reactor_settings.SWEEP_AFTER + 1)
            sweep(now=timezone.now() + moved)
            pending += _waiting(queue)
    _waiting(queue)
    root.refresh_from_db()
    return root, tracer, outcomes


def fan_out_problems(
    fail: bool, root: Execution, units: tuple[str, ...] = UNITS, cuts: int = 1
) -> list[str]:
    """What the ended run and the ledger break of the promise (``saga_problems`` of the
    sequential property, with the elements undone in the order they completed), after
    ``cuts`` cuts. Also the check of ``test_soft_limit_twice`` for any reactor: undoing in
    the order the units last completed is newest first there too."""
    if root.status not in TERMINAL_STATUSES:
        return [f"not ended: {root.status}"]
    failed = root.status == ExecutionStatus.FAILED
    # a failed run: every unit that ran was undone or compensated
    problems = ledger_problems(units, reversed_once=failed, cuts=cuts)
    problems += end_problems(fail, root, units)
    if not failed:
        return problems
    return problems + undo_order_problems()


def undo_order_problems() -> list[str]:
    """The undone units not newest first, by when each last completed (its last ``do``)."""
    undone = list(dict.fromkeys(e[5:] for e in LEDGER if e.startswith("undo:")))
    last_done = {e[3:]: i for i, e in enumerate(LEDGER) if e.startswith("do:")}
    expected = sorted(undone, key=lambda name: last_done.get(name, -1), reverse=True)
    if undone != expected:
        return [f"undone {undone}, not newest first ({expected})"]
    return []


def left_by_the_tree(root: Execution, renewing_before: list[Any]) -> list[str]:
    """Holds in Redis of any execution of the ended run, and renewals left running."""
    ids = {str(e.pk) for e in _tree(root)}
    problems = []
    held = [h for h in coordination_state().holds() if h["execution"] in ids]
    if held:
        problems.append(f"still held after the run ended: {held}")
    if renewing_since(renewing_before):
        problems.append("renewals still running after the run ended")
    return problems


def lines_of_a_clean_run(fail: bool, queue: str) -> int:
    _, counter, _ = run_fanned(fail, 0, queue)
    return counter.seen


@cut_settings(EXAMPLES)
@given(share=st.floats(min_value=0, max_value=1, exclude_max=True), fail=st.booleans())
def test_a_soft_limit_at_any_line_of_a_fanned_out_run_keeps_the_saga_promise(
    nobody_queue: str, share: float, fail: bool
) -> None:
    renewing_before = scheduler().renewing()
    lines = lines_of_a_clean_run(fail, nobody_queue)
    line = 1 + int(share * lines)
    root, tracer, outcomes = run_fanned(fail, line, nobody_queue)
    problems = fan_out_problems(fail, root) + left_by_the_tree(root, renewing_before)
    problems += stop_problems(tracer)
    assert not problems, (
        f"cut at {tracer.fired_in} (line {line} of {lines}); deliveries {outcomes}",
        problems,
        LEDGER,
    )


def test_a_clean_fanned_out_run_delivers_each_element_on_its_own(nobody_queue: str) -> None:
    """The loop above, uncut: the parent parks, each element is a delivery of its own child
    execution, and the run ends as the model says (the property's baseline)."""
    root, tracer, outcomes = run_fanned(False, 0, nobody_queue)
    assert tracer.fired_in is None and tracer.seen > 0
    assert root.status == ExecutionStatus.SUCCEEDED, (outcomes, root.error)
    assert outcomes[0] == f"{str(root.pk)[:4]}:parked", outcomes  # waiting for its elements
    children = [e for e in _tree(root) if e.pk != root.pk]
    assert len(children) == 3 and all(c.status == ExecutionStatus.SUCCEEDED for c in children)
    assert Counter(LEDGER) == Counter(f"do:{name}" for name in UNITS), LEDGER
