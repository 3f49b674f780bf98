"""Celery's time limits bound one delivery, not a workflow (docs/operations.md, "Celery time
limits"; ``engine.time_slice``).

A real prefork worker with ``CELERY_TASK_SOFT_TIME_LIMIT = 2`` (and a hard limit of 8 s). Each
body writes to a ledger the test owns (``enter``/``do``/``undo``), so a test reads every effect.

Before ``engine.time_slice``, a workflow of half-second steps failed after two seconds: the
step running when the delivery's soft limit ran out raised ``SoftTimeLimitExceeded``, and the
whole saga was rolled back for a limit no step exceeded (found by
``test_regression_six_half_second_steps_outlast_the_soft_limit_and_succeed``). Now:

* a delivery that has used half its limit starts no further step or map element: the
  execution goes on at once in a fresh delivery (not contention, no attempt spent);
* a body cut off after other work of its delivery runs again first thing in the next one;
* a body cut off although it started its delivery had the whole limit: the step fails with
  ``TaskTimeLimitExceeded`` and the steps before it are undone once, newest first; a retry due
  at once starts a fresh delivery;
* a long rollback starts no further undo once its delivery used half the limit, and the next
  delivery goes on with it: every completed step is undone exactly once;
* an in-delivery wait for a contended key parks at the delivery's share instead of being cut.

The property generates step durations on both sides of the limit and checks the saga promise
on the ledger, whatever the deliveries' boundaries turned out to be.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.engine.dispatch import wake
from reactor_app.exceptions import TaskTimeLimitExceeded
from reactor_app.models import ContentionState, Execution, StepRun
from reactor_app.status import ExecutionStatus
from tests.worker.helpers import wait_until
from tests.worker.promise_reactors import ledger
from tests.worker.time_limit_reactors import (
    STEPS,
    PacedComposed,
    PacedMapReactor,
    PacedReactor,
    RetriedAtOnce,
)
from tests.worker.trust_reactors import QueuedReactor

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SOFT = 2
WORKER_SETTINGS = {
    "CELERY_TASK_SOFT_TIME_LIMIT": SOFT,
    "CELERY_TASK_TIME_LIMIT": 8,
    # an in-delivery wait longer than the limit: cut short at the delivery's share
    "REACTOR_WORKER_WAIT": 30.0,
    "REACTOR_CONTENTION_BACKOFF": [20.0, 40.0],
}

#: a body well inside half the limit, one between half and the whole, one past the whole
SHORT, MIDDLE, LONG = 0.15, 1.2, 3.0


def deliveries(worker: Any, execution: Execution) -> int:
    """How many deliveries of ``execution`` the worker finished (Celery logs each once its task
    returns). The execution's end is written inside the last delivery, before that line: a
    test that has seen the end waits for the line of the delivery that wrote it, first (an
    embedded run under load counted one delivery short)."""
    status = Execution.objects.get(pk=execution.pk).status
    done = rf"succeeded in [0-9.]+s: \{{'execution_id': '{execution.id}'"
    wait_until(
        lambda: re.search(rf"{done}, 'outcome': '{status}'", worker.process.read_log()),
        10,
        message=f"no delivery of {execution.id} logged its end ({status})",
    )
    return len(re.findall(done, worker.process.read_log()))


def assert_the_promise(effects: list[str], completed: list[str], failed: bool) -> None:
    """Every body that completed wrote ``do`` once; after a failure each is undone once,
    newest first, and after a success none is; no body after a failed step started."""
    done = [e.split(":", 1)[1] for e in effects if e.startswith("do:")]
    undone = [e.split(":", 1)[1] for e in effects if e.startswith("undo:")]
    assert done == completed, effects
    assert undone == (list(reversed(completed)) if failed else []), effects


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(durations=st.lists(st.sampled_from([SHORT, MIDDLE, LONG]), min_size=STEPS, max_size=STEPS))
@example(durations=[SHORT, MIDDLE, SHORT, MIDDLE, SHORT, SHORT])  # slices, never cut
@example(durations=[SHORT, MIDDLE, LONG, SHORT, SHORT, SHORT])  # fails at s2, undoes s1, s0
def test_a_workflow_outlasting_the_soft_limit_keeps_the_saga_promise(
    worker: Any, durations: list[float]
) -> None:
    order = f"t-{uuid.uuid4().hex[:10]}"
    execution = PacedReactor.run_async(order=order, durations=durations, undo_seconds=0, fail_at="")
    result = execution.wait(timeout=120)
    effects = ledger(order)
    over = next((i for i, seconds in enumerate(durations) if seconds >= SOFT), None)
    if over is None:
        assert result.ok, (result.error, effects)
        assert_the_promise(effects, [f"s{i}" for i in range(STEPS)], failed=False)
    else:
        # the first body longer than the whole limit fails, once it started a delivery
        assert not result.ok, effects
        assert isinstance(result.error, TaskTimeLimitExceeded), result.error
        assert result.error.step == f"s{over}" and result.error.limit == SOFT, result.error
        assert_the_promise(effects, [f"s{i}" for i in range(over)], failed=True)
        assert f"enter:s{over + 1}" not in effects
    # a body cut off mid-way is started once more, never more (it starts the next delivery)
    for index in range(STEPS):
        assert effects.count(f"enter:s{index}") <= 2, effects
    assert (
        sum(durations[: over if over is not None else STEPS]) < SOFT
        or deliveries(worker, execution) >= 2
    ), "a delivery ran past its limit without being sliced"
    assert not ContentionState.objects.filter(execution=execution).exists()  # not contention


def test_regression_six_half_second_steps_outlast_the_soft_limit_and_succeed(
    worker: Any,
) -> None:
    """Six half-second steps: the first delivery stops after two (a second of its two), the
    others follow in fresh deliveries; no body is cut off or run twice."""
    order = f"t-{uuid.uuid4().hex[:10]}"
    execution = PacedReactor.run_async(
        order=order, durations=[0.5] * STEPS, undo_seconds=0, fail_at=""
    )
    result = execution.wait(timeout=60)
    assert result.ok, result.error
    assert ledger(order) == [entry for i in range(STEPS) for entry in (f"enter:s{i}", f"do:s{i}")]
    assert deliveries(worker, execution) >= 3
    assert not StepRun.objects.filter(execution=execution, error__type="DeliveryTimeUp").exists()


def test_a_body_cut_off_after_other_work_runs_again_first_in_a_fresh_delivery(
    worker: Any,
) -> None:
    """``s0`` takes 0.6 s (under half the limit, so ``s1`` starts in the same delivery);
    ``s1`` takes 1.6 s, is cut off at 2 s, and runs again — whole — in the next delivery.
    Its cut-off attempt is on record and spent no attempt: the step has only one."""
    order = f"t-{uuid.uuid4().hex[:10]}"
    durations = [0.6, 1.6, 0.0, 0.0, 0.0, 0.0]
    execution = PacedReactor.run_async(order=order, durations=durations, undo_seconds=0, fail_at="")
    result = execution.wait(timeout=60)
    assert result.ok, result.error
    effects = ledger(order)
    assert effects[:5] == ["enter:s0", "do:s0", "enter:s1", "enter:s1", "do:s1"], effects
    assert_the_promise(effects, [f"s{i}" for i in range(STEPS)], failed=False)
    cut = StepRun.objects.get(execution=execution, step="s1", error__type="DeliveryTimeUp")
    assert f"soft time limit ({SOFT} s)" in cut.error["message"]


def test_a_long_rollback_goes_on_in_fresh_deliveries_undoing_each_step_once(
    worker: Any,
) -> None:
    """Five steps completed, the sixth fails; each undo takes 0.7 s, so the rollback (3.5 s)
    outlasts the limit: a delivery that used half of it starts no further undo, and the next
    goes on with the rollback from the undos counted. Every step is undone exactly once,
    newest first, and no undo is cut off."""
    order = f"t-{uuid.uuid4().hex[:10]}"
    execution = PacedReactor.run_async(
        order=order, durations=[0.0] * STEPS, undo_seconds=0.7, fail_at="s5"
    )
    result = execution.wait(timeout=60)
    assert not result.ok and "s5 fails" in str(result.error), result.error
    row = Execution.objects.get(pk=execution.pk)
    assert row.status == ExecutionStatus.FAILED and row.rollback_failures == []
    assert_the_promise(ledger(order), [f"s{i}" for i in range(5)], failed=True)
    assert deliveries(worker, execution) >= 3


@pytest.mark.parametrize("fail", [False, True], ids=["succeeds", "fails"])
def test_a_map_outlasting_the_soft_limit_goes_on_between_elements(worker: Any, fail: bool) -> None:
    """Sixteen elements of 0.25 s in one in-process map: the map stops between two elements
    once its delivery used half the limit, and the next delivery goes on from the progress
    kept. Each element completes once; when the step after the map fails, each is undone
    once, newest first."""
    order = f"t-{uuid.uuid4().hex[:10]}"
    elements = [{"index": index, "seconds": 0.25} for index in range(16)]
    execution = PacedMapReactor.run_async(order=order, elements=elements, fail=fail)
    result = execution.wait(timeout=60)
    assert result.ok is not fail, result.error
    assert_the_promise(ledger(order), [str(index) for index in range(16)], failed=fail)
    assert deliveries(worker, execution) >= 3


def test_an_in_delivery_wait_for_a_held_key_parks_at_the_delivery_s_share(worker: Any) -> None:
    """``REACTOR_WORKER_WAIT`` is 30 s, the soft limit 2 s: a delivery waiting for a held lock
    parks once it has used half its limit, instead of being cut off inside the wait; the
    release wakes it."""
    held = Coordinator().admit([LockClaim("queue:tl-wait", ttl=60)], Holder(owner="test-holder"))
    assert isinstance(held, Admitted), held
    try:
        execution = QueuedReactor.run_async(key="tl-wait", hold=0.05)
        state = wait_until(
            lambda: ContentionState.objects.filter(execution=execution).first(),
            20,
            message="the waiter never parked",
        )
        started = Execution.objects.get(pk=execution.pk).started_at
        assert state.updated_at - started < timedelta(seconds=SOFT), (started, state.updated_at)
    finally:
        wake(Coordinator().release(held, "success").woken)
    result = execution.wait(timeout=30)
    assert result.ok, result.error


def test_an_undo_cut_off_by_the_limit_runs_again_in_the_next_delivery(worker: Any) -> None:
    """``s0`` takes 0.6 s, ``s1`` fails at once, and ``s0``'s undo takes 1.6 s: it starts
    under half the limit and is cut off at 2 s — not its failure, since the delivery's time
    went to other work first. The next delivery goes on with the rollback and runs the undo
    again, whole: ``s0`` is undone exactly once and nothing is reported as not undone."""
    order = f"t-{uuid.uuid4().hex[:10]}"
    execution = PacedReactor.run_async(
        order=order, durations=[0.6] + [0.0] * (STEPS - 1), undo_seconds=1.6, fail_at="s1"
    )
    result = execution.wait(timeout=60)
    assert not result.ok and "s1 fails" in str(result.error), result.error
    row = Execution.objects.get(pk=execution.pk)
    assert row.rollback_failures == [], row.rollback_failures
    assert_the_promise(ledger(order), ["s0"], failed=True)
    assert deliveries(worker, execution) >= 2


@pytest.mark.parametrize("fail", [False, True], ids=["succeeds", "fails"])
def test_a_composed_child_outlasting_the_soft_limit_goes_on_between_its_steps(
    worker: Any, fail: bool
) -> None:
    """``a0``, then a composed child of four 0.4 s steps, then ``a1``: the delivery's share
    runs out inside the child, which stops at its own step boundary, as when it parks; the
    next delivery goes on in the child. Each body runs once; when ``a1`` fails, everything is
    undone once, newest first — the child's steps too."""
    order = f"t-{uuid.uuid4().hex[:10]}"
    execution = PacedComposed.run_async(order=order, fail=fail)
    result = execution.wait(timeout=60)
    assert result.ok is not fail, result.error
    effects = ledger(order)
    assert_the_promise(effects, ["a0", "c0", "c1", "c2", "c3"] + ([] if fail else ["a1"]), fail)
    assert all(effects.count(f"enter:{name}") == 1 for name in ("a0", "c0", "c1", "c2", "c3"))
    assert deliveries(worker, execution) >= 2


def test_a_retry_due_at_once_after_a_cut_off_attempt_starts_a_fresh_delivery(
    worker: Any,
) -> None:
    """The step's first attempt outlasts the whole limit (it fails with
    ``TaskTimeLimitExceeded``); its policy retries with no backoff. The retry does not start
    in the delivery whose soft limit has run out (only the hard limit is left there): it
    starts a fresh one, and succeeds."""
    order = f"t-{uuid.uuid4().hex[:10]}"
    execution = RetriedAtOnce.run_async(order=order)
    result = execution.wait(timeout=60)
    assert result.ok, result.error
    assert ledger(order) == ["enter:1", "enter:2", "do:2"]
    assert deliveries(worker, execution) == 2
