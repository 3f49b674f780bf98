"""The sweep completes an ordered line's head left by an execution that ended
(``engine.stranded_positions``).

A release lost with a failed-over master leaves the ended execution's position registered and
in flight on the new master; here that state is made directly — the position admitted and
never released, its execution then ended — on the real Redis. Every combination of the three
conditions is tried: the head is completed exactly when its registration names an execution,
that execution has ended or is gone, and the position has been silent for
``REACTOR_SWEEP_AFTER``; then the parked waiter behind it is woken and admitted, the line keeps
its own lifetime, and the completion is recorded. (The failover itself is exercised on real
workers by ``tests/chaos/test_worker_failover_histories.py``.)
"""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any

import pytest

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, OrderedLockClaim, Refused
from reactor_app.coordination.ordered_lock import ordered_state, state_key
from reactor_app.engine import stranded_positions
from reactor_app.models import ContentionState, CoordinationEvent, Execution
from reactor_app.status import ExecutionStatus
from reactor_app.tracking import flush

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

LINE_TTL = 3600.0

CASES = list(
    itertools.product(
        ["execution", "call"],  # who holds the head: an execution, or a Step.call owner
        ["running", "succeeded", "gone"],  # what became of that execution
        [True, False],  # silent for REACTOR_SWEEP_AFTER
    )
)


def execution(status: str) -> Execution:
    return Execution.objects.create(reactor="tests.stranded", status=status, inputs={})


@pytest.mark.parametrize(("holder_kind", "fate", "silent"), CASES)
def test_the_sweep_completes_exactly_the_heads_whose_execution_ended(
    settings: Any, monkeypatch: pytest.MonkeyPatch, holder_kind: str, fate: str, silent: bool
) -> None:
    woken: list[str] = []
    monkeypatch.setattr(stranded_positions, "wake", lambda ids: woken.extend(ids))
    settings.REACTOR_SWEEP_AFTER = 0.2 if silent else 60.0
    coordinator = Coordinator()
    key = f"stranded:{uuid.uuid4().hex}"

    head_row = execution(ExecutionStatus.RUNNING)
    head = Holder(
        owner=str(head_row.pk) if holder_kind == "execution" else f"call:{uuid.uuid4().hex}",
        execution_id=str(head_row.pk) if holder_kind == "execution" else None,
        step="Stranded",
    )
    first = coordinator.assign_position(key, head)
    claim = OrderedLockClaim(key=key, position=first, ttl=LINE_TTL)
    assert isinstance(coordinator.admit([claim], head), Admitted)  # in flight, never released
    if fate == "succeeded":
        Execution.objects.filter(pk=head_row.pk).update(status=ExecutionStatus.SUCCEEDED)
    elif fate == "gone":
        Execution.objects.filter(pk=head_row.pk).delete()

    waiter_row = execution(ExecutionStatus.PARKED)
    waiter = Holder(owner=str(waiter_row.pk), execution_id=str(waiter_row.pk), step="Stranded")
    second = OrderedLockClaim(
        key=key, position=coordinator.assign_position(key, waiter), ttl=LINE_TTL
    )
    assert isinstance(coordinator.admit([second], waiter, waiter_id=str(waiter_row.pk)), Refused)
    ContentionState.objects.create(
        execution=waiter_row, step="Stranded", primitive="ordered_lock", key=key
    )
    time.sleep(0.4)

    completed = stranded_positions.complete_stranded_heads()

    line = ordered_state(key)
    expected = holder_kind == "execution" and fate != "running" and silent
    if not expected:
        assert completed == [] and woken == []
        assert (line.last_completed, line.in_flight) == (0, first.nonce)
        assert isinstance(coordinator.admit([second], waiter), Refused)
        return
    assert completed == [f"{key}#{first.nonce}"]
    assert (line.last_completed, line.in_flight) == (first.nonce, None)
    assert woken == [str(waiter_row.pk)]
    # the line keeps its own lifetime (the release would refresh it with a day's)
    assert 0 < coordinator.client.pttl(state_key(key, coordinator.prefix)) <= LINE_TTL * 1000
    assert isinstance(coordinator.admit([second], waiter), Admitted)
    flush()
    event = CoordinationEvent.objects.get(key=key, kind="ordered_skipped")
    assert event.detail["by"] == "sweep" and event.detail["nonce"] == first.nonce
    assert event.execution_id == (head_row.pk if fate == "succeeded" else None)


def test_a_second_sweep_leaves_the_next_head_alone(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Completing names the exact position: once the stranded head is passed, the live
    position behind it (admitted, its execution running) is not touched by later sweeps."""
    monkeypatch.setattr(stranded_positions, "wake", lambda ids: None)
    settings.REACTOR_SWEEP_AFTER = 0.2
    coordinator = Coordinator()
    key = f"stranded:{uuid.uuid4().hex}"
    rows = [execution(ExecutionStatus.SUCCEEDED), execution(ExecutionStatus.RUNNING)]
    holders = [Holder(owner=str(r.pk), execution_id=str(r.pk), step="S") for r in rows]
    claims = [
        OrderedLockClaim(key=key, position=coordinator.assign_position(key, h), ttl=LINE_TTL)
        for h in holders
    ]
    assert isinstance(coordinator.admit([claims[0]], holders[0]), Admitted)
    ContentionState.objects.create(execution=rows[1], step="S", primitive="ordered_lock", key=key)
    time.sleep(0.4)
    assert stranded_positions.complete_stranded_heads() == [f"{key}#{claims[0].position.nonce}"]
    assert isinstance(coordinator.admit([claims[1]], holders[1]), Admitted)
    time.sleep(0.4)  # the running head is silent too now, but its execution has not ended
    assert stranded_positions.complete_stranded_heads() == []
    assert ordered_state(key).in_flight == claims[1].position.nonce


@pytest.mark.parametrize("recorded", ["a later place", "this place", "another step's place"])
def test_the_sweep_completes_a_place_its_unit_lost_and_no_other(
    settings: Any, monkeypatch: pytest.MonkeyPatch, recorded: str
) -> None:
    """A delivery that ends between the line's answer and the execution's record of it leaves
    the place registered to the unit; the unit comes back, takes a new place and parks behind
    the lost one — its own. The sweep completes a silent head whose execution (still running)
    records a later place of the same line for the same unit; not the place it records, not a
    place another unit of it holds."""
    woken: list[str] = []
    monkeypatch.setattr(stranded_positions, "wake", lambda ids: woken.extend(ids))
    settings.REACTOR_SWEEP_AFTER = 0.2
    coordinator = Coordinator()
    key = f"stranded:{uuid.uuid4().hex}"
    row = execution(ExecutionStatus.PARKED)
    unit = Holder(owner=str(row.pk), execution_id=str(row.pk), step="Ordered")
    lost = coordinator.assign_position(key, unit)  # given, never recorded
    again = coordinator.assign_position(key, unit)  # the unit's place when it came back
    claim = OrderedLockClaim(key=key, position=again, ttl=LINE_TTL)
    assert isinstance(coordinator.admit([claim], unit, waiter_id=str(row.pk)), Refused)
    place = {"a later place": again, "this place": lost, "another step's place": again}[recorded]
    slot = "Other" if recorded == "another step's place" else "Ordered"
    context = {"ordered": {slot: {"key": key, "nonce": place.nonce, "epoch": place.epoch}}}
    Execution.objects.filter(pk=row.pk).update(context=context)
    ContentionState.objects.create(execution=row, step="Ordered", primitive="ordered_lock", key=key)
    time.sleep(0.4)

    completed = stranded_positions.complete_stranded_heads()

    if recorded != "a later place":
        assert completed == [] and woken == []
        assert ordered_state(key).last_completed == 0
        assert isinstance(coordinator.admit([claim], unit), Refused)
        return
    assert completed == [f"{key}#{lost.nonce}"]
    assert woken == [str(row.pk)]
    assert isinstance(coordinator.admit([claim], unit), Admitted)
    flush()
    event = CoordinationEvent.objects.get(key=key, kind="ordered_skipped")
    assert event.detail["nonce"] == lost.nonce and "later place" in event.detail["reason"]
