"""A unit that kills every delivery running it fails after a few, and the saga is undone
(``engine.lost_deliveries``; docs/operations.md, "Lost deliveries").

A real prefork worker. The ``Deadly`` steps SIGKILL their own pool process, as the
out-of-memory killer or a hard time limit would; Celery sends the task again
(``reject_on_worker_lost``) and the next delivery takes over once the dead one's claim lapses
(1 s here). Every effect is on the order's ledger.

Before the guard, a body that killed its process every time was run again without end: the
execution stayed ``running`` and its completed steps were never undone
(``test_a_body_that_kills_every_delivery_fails_at_the_limit_and_its_saga_is_undone`` waits in
vain). Now the unit at a point where ``REACTOR_LOST_DELIVERY_LIMIT`` (3) deliveries were lost
in a row fails with ``DeliveryLost`` instead of running again; losses at different points do
not add up, those inside a composed child included; a parallel map's element counts its own.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reactor_app.models import CoordinationEvent, Execution, StepRun
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from tests.worker.helpers import wait_until
from tests.worker.lost_delivery_reactors import (
    ALWAYS,
    RATE,
    DeadlyComposed,
    DeadlyMap,
    DeadlyParallelMap,
    DeadlyRated,
    DeadlyReactor,
    ran,
)
from tests.worker.promise_reactors import ledger

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

LIMIT = 3
WORKER_SETTINGS = {
    "REACTOR_EXECUTION_CLAIM_TTL": 1,
    "REACTOR_LOST_DELIVERY_LIMIT": LIMIT,
    # a map's elements are written in batches of 50 or once a second: never by age here, so
    # the batch a first loss cuts short is certainly unwritten, however slow the machine
    "REACTOR_MAP_CHECKPOINT_SECONDS": 60,
}
#: a loss costs a claim TTL, a new pool process and a requeue: well under 5 s each here
SETTLES_WITHIN = 90.0


#: kill plans per run: a few in ``make test`` (each costs up to nine losses of a few seconds),
#: more under ``make soak``'s random seeds
EXAMPLES = 20 if os.environ.get("REACTOR_HYPOTHESIS_PROFILE") == "reactor-explore" else 3
#: how often a generated step's body or undo kills its process: never, once, every time
KILLS = st.sampled_from([0, 1, ALWAYS])
NAMES = ("s0", "s1", "s2")


def expected(plan: dict[str, Any]) -> tuple[str | None, str | None, list[str], dict[str, int]]:
    """What ``DeadlyReactor`` under ``plan`` ends in: the failing step and its error type (None
    for a success), the ledger, and how many times each body and undo starts."""
    effects: list[str] = []
    runs: dict[str, int] = {}
    failed_at, error = None, None
    for index, name in enumerate(NAMES):
        kills = plan[name]["body"]
        runs[f"{name}:body"] = LIMIT if kills >= LIMIT else kills + 1
        effects += [f"enter:{name}"] * runs[f"{name}:body"]
        if kills >= LIMIT or plan[name]["fail"]:
            failed_at, error = index, ("DeliveryLost" if kills >= LIMIT else "StepFailed")
            effects.append(f"compensate:{name}")
            break
        effects.append(f"do:{name}")
    if failed_at is None:
        return None, None, effects, runs
    for name in reversed(NAMES[:failed_at]):
        kills = plan[name]["undo"]
        runs[f"{name}:undo"] = LIMIT if kills >= LIMIT else kills + 1
        if kills < LIMIT:
            effects.append(f"undo:{name}")
    return NAMES[failed_at], error, effects, runs


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    plan=st.fixed_dictionaries(
        {
            name: st.fixed_dictionaries({"body": KILLS, "undo": KILLS, "fail": st.booleans()})
            for name in NAMES
        }
    )
)
@example(  # a kill on every side of the limit: s0 once, s1's undo every time, s2 every time
    plan={
        "s0": {"body": 1, "undo": 1, "fail": False},
        "s1": {"body": 0, "undo": ALWAYS, "fail": False},
        "s2": {"body": ALWAYS, "undo": 0, "fail": False},
    }
)
def test_the_saga_promise_holds_whatever_the_kills(worker: Any, plan: dict[str, Any]) -> None:
    """Every body that completed wrote its effect once and, after a failure, is undone once,
    newest first — but for an undo that killed its deliveries up to the limit, reported not
    done; a body or undo killed fewer times than the limit runs again until it completes; one
    killed up to the limit fails its step with ``DeliveryLost`` and is not started again."""
    failing, error, effects, runs = expected(plan)
    order, execution = start(DeadlyReactor, plan)
    ended = settled(execution)

    assert ledger(order) == effects, plan
    for counted_run, times in runs.items():
        name, kind = counted_run.split(":")
        assert ran(order, name, kind) == times, (counted_run, plan)
    if failing is None:
        assert ended.status == ExecutionStatus.SUCCEEDED, (ended.error, plan)
        return
    assert ended.status == ExecutionStatus.FAILED, plan
    assert (ended.error["type"], ended.error["step"]) == (error, failing), (ended.error, plan)
    not_undone = sorted(f["step"] for f in ended.rollback_failures if f["kind"] == "undo")
    assert not_undone == sorted(
        name for name in NAMES[: NAMES.index(failing)] if plan[name]["undo"] >= LIMIT
    ), (ended.rollback_failures, plan)


def settled(execution: Execution, within: float = SETTLES_WITHIN) -> Execution:
    """The execution's row once it ended (within ``within`` seconds)."""
    wait_until(
        lambda: Execution.objects.get(pk=execution.pk).is_terminal,
        within,
        interval=0.2,
        message=f"{execution.id} did not end",
    )
    return Execution.objects.get(pk=execution.pk)


def start(reactor: Any, plan: dict[str, Any], **inputs: Any) -> tuple[str, Execution]:
    order = uuid.uuid4().hex
    return order, reactor.run_async(order=order, plan=plan, **inputs)


def test_a_body_that_kills_every_delivery_fails_at_the_limit_and_its_saga_is_undone(
    worker: Any,
) -> None:
    order, execution = start(DeadlyReactor, {"s1": {"body": ALWAYS}})
    ended = settled(execution)

    assert ended.status == ExecutionStatus.FAILED
    assert ended.error["type"] == "DeliveryLost"
    assert (ended.error["step"], ended.error["lost"], ended.error["limit"]) == ("s1", LIMIT, LIMIT)
    # the body ran once per delivery until the limit, then not again; s2 never started; the
    # failed step is compensated (its body may have done part of its work) and s0 undone once
    assert ran(order, "s1", "body") == LIMIT
    assert ledger(order) == [
        "enter:s0",
        "do:s0",
        *["enter:s1"] * LIMIT,
        "compensate:s1",
        "undo:s0",
    ]


def test_a_verdict_outlasts_a_park_before_the_unit_it_is_for(worker: Any) -> None:
    # s1's three killed runs spend its rate limit, so the delivery that takes over after the
    # third loss parks at s1's admission before any unit runs. The verdict is the
    # execution's, not that delivery's: the one after the park fails s1 without running it,
    # and compensates it (a park is not a loss: nothing says its compensate killed anyone)
    assert LIMIT == RATE
    order, execution = start(DeadlyRated, {"s1": {"body": ALWAYS}})
    ended = settled(execution)

    parks = CoordinationEvent.objects.filter(
        execution_id=execution.pk, kind=CoordinationEventKind.PARKED, primitive="rate_limit"
    )
    assert parks.exists(), "it never parked"
    assert ended.status == ExecutionStatus.FAILED
    assert (ended.error["type"], ended.error["lost"]) == ("DeliveryLost", LIMIT)
    assert ran(order, "s1", "body") == LIMIT
    assert ledger(order)[-2:] == ["compensate:s1", "undo:s0"]


def test_a_body_killed_fewer_times_than_the_limit_completes(worker: Any) -> None:
    order, execution = start(DeadlyReactor, {"s1": {"body": LIMIT - 1}})
    ended = settled(execution)

    assert ended.status == ExecutionStatus.SUCCEEDED
    assert ran(order, "s1", "body") == LIMIT
    assert [e for e in ledger(order) if not e.startswith("enter:")] == ["do:s0", "do:s1", "do:s2"]


def test_losses_at_different_points_do_not_add_up(worker: Any) -> None:
    # four losses in all, never three at one point: progress starts the count again
    order, execution = start(DeadlyReactor, {"s0": {"body": 2}, "s1": {"body": 2}})
    ended = settled(execution)

    assert ended.status == ExecutionStatus.SUCCEEDED
    assert (ran(order, "s0", "body"), ran(order, "s1", "body")) == (3, 3)
    assert "undo:s0" not in ledger(order)


def test_progress_inside_a_composed_child_starts_the_count_again(worker: Any) -> None:
    # the child's units run in its parent's deliveries: its progress is the parent's
    order, execution = start(DeadlyComposed, {"c0": {"body": 2}, "c1": {"body": 2}})
    ended = settled(execution)

    assert ended.status == ExecutionStatus.SUCCEEDED
    assert (ran(order, "c0", "body"), ran(order, "c1", "body")) == (3, 3)
    assert [e for e in ledger(order) if e.startswith("do:")] == ["do:a0", "do:c0", "do:c1"]


def test_an_undo_that_kills_every_delivery_is_reported_not_done_and_the_rollback_goes_on(
    worker: Any,
) -> None:
    order, execution = start(DeadlyReactor, {"s1": {"undo": ALWAYS}, "s2": {"fail": True}})
    ended = settled(execution)

    assert ended.status == ExecutionStatus.FAILED
    assert ended.error["type"] == "StepFailed" and ended.error["step"] == "s2"
    [failure] = [f for f in ended.rollback_failures if f["step"] == "s1"]
    assert failure["error"]["type"] == "UndoFailed"
    assert "DeliveryLost" in str(failure["error"]["cause"])
    assert ran(order, "s1", "undo") == LIMIT
    # s1's undo never completed; s0, before it, is undone once
    assert [e for e in ledger(order) if e.startswith("undo:")] == ["undo:s0"]


def test_a_compensate_that_kills_every_delivery_is_passed_over_the_second_time(
    worker: Any,
) -> None:
    # the compensate runs before the step's failure is recorded, so its losses come back to
    # the step: the first verdict fails the body (its compensate runs, and kills again), the
    # second skips that compensate too
    order, execution = start(DeadlyReactor, {"s1": {"fail": True, "compensate": ALWAYS}})
    ended = settled(execution)

    assert ended.status == ExecutionStatus.FAILED
    assert ended.error["type"] == "DeliveryLost" and ended.error["step"] == "s1"
    assert ended.error["lost"] == LIMIT + 1
    assert ran(order, "s1", "body") == LIMIT
    assert ran(order, "s1", "compensate") == LIMIT + 1
    [failure] = [f for f in ended.rollback_failures if f["step"] == "s1"]
    assert failure["error"]["type"] == "CompensationFailed"
    assert [e for e in ledger(order) if e.startswith("undo:")] == ["undo:s0"]


def test_a_map_element_that_kills_every_delivery_is_the_one_that_fails(worker: Any) -> None:
    # the elements before it complete in an unwritten batch, so the first loss re-runs them;
    # after a loss each element is written, and the verdict falls on the deadly one
    names = [f"e{i}" for i in range(6)]
    order, execution = start(DeadlyMap, {"e3": {"body": ALWAYS}}, names=names)
    ended = settled(execution)

    assert ended.status == ExecutionStatus.FAILED
    assert ended.error["type"] == "DeliveryLost"
    assert ran(order, "e3", "body") == LIMIT + 1  # one loss before the batch was written
    assert all(ran(order, name, "body") == 2 for name in names[:3])
    assert [ran(order, name, "body") for name in names[4:]] == [0, 0]
    undone = [e for e in ledger(order) if e.startswith("undo:")]
    assert undone == ["undo:e2", "undo:e1", "undo:e0"]
    failed = StepRun.objects.filter(execution_id=execution.pk, status="failed")
    assert any("DeliveryLost" in str(run.error) for run in failed)


def test_a_parallel_map_element_that_kills_every_delivery_fails_its_map(worker: Any) -> None:
    # each element is an execution of its own, with its own count: the deadly one fails with
    # DeliveryLost, the map fails with it, and the elements that completed are undone once
    names = [f"p{i}" for i in range(3)]
    order, execution = start(DeadlyParallelMap, {"p1": {"body": ALWAYS}}, names=names)
    ended = settled(execution)

    assert ended.status == ExecutionStatus.FAILED
    assert "DeliveryLost" in str(ended.error)
    assert ran(order, "p1", "body") == LIMIT
    assert (ran(order, "p0", "body"), ran(order, "p2", "body")) == (1, 1)
    undone = sorted(e for e in ledger(order) if e.startswith("undo:"))
    assert undone == ["undo:p0", "undo:p2"]
    element = Execution.objects.get(parent_id=execution.pk, error__type="DeliveryLost")
    assert element.status == ExecutionStatus.FAILED
