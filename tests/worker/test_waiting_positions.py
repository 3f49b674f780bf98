"""Places in line of executions waiting in the database (``engine.waiting_positions``), and a
unit that finds the place it kept gone (``engine.gate``).

The counterexample these keep: on a loaded machine, a worker schedule's reactor-level ordered
line (``poison_pill_timeout`` 1 s) had two positions taken at enqueue passed over by later
deliveries while their own executions still sat in the queue; those executions then took new
places at the back, and the line counted six positions for four executions
(``tests/chaos/test_worker_lost_replies.py``). Now the sweep vouches for the positions of
queued and parked executions, and a unit whose place went anyway says so with an
``ordered_skipped`` event before taking a new one.

Everything runs against the real Redis, with real waits past a short poison pill.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from reactor_app.coordination import ordered_lock
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    Admitted,
    Holder,
    OrderedLockClaim,
    OrderedPosition,
    Refused,
)
from reactor_app.dsl.declarations import OrderedLockDeclaration
from reactor_app.engine.gate import Gate, GateScope
from reactor_app.engine.state import REACTOR_SLOT
from reactor_app.engine.sweeper import sweep
from reactor_app.models import CoordinationEvent, Execution
from reactor_app.tracking import flush

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

#: the pill of these lines, and how long each waits before a later position asks (past it)
PILL = 1.0
SILENT = PILL + 0.3
LINE_TTL = 3600.0

#: what became of the execution that took the first place, and whether the sweep keeps it
FATES = {
    "queued": True,  # pending and due: in the broker's queue
    "parked": True,
    "deferred": False,  # pending, due later (run_after): not waited for
    "running": False,  # its delivery heartbeats, or the sweep re-enqueues it
    "succeeded": False,  # ended: left to the pill (or engine.stranded_positions)
}


def claim(key: str, position: OrderedPosition) -> OrderedLockClaim:
    return OrderedLockClaim(
        key=key, position=position, ttl=LINE_TTL, poison_pill_timeout=PILL, strict=False
    )


def waiting_row(fate: str, slot: str, key: str, position: OrderedPosition) -> Execution:
    status = {"queued": "pending", "deferred": "pending"}.get(fate, fate)
    due = timezone.now() + (timedelta(hours=1) if fate == "deferred" else timedelta(0))
    return Execution.objects.create(
        reactor="tests.waiting",
        status=status,
        inputs={},
        heartbeat_at=due,
        context={
            "worker": True,
            "ordered": {slot: {"key": key, "nonce": position.nonce, "epoch": position.epoch}},
        },
    )


def test_the_sweep_keeps_exactly_the_places_of_executions_waiting_to_run(
    settings: Any,
) -> None:
    """One line per fate: its first place taken for an execution in that state, a second by a
    later arrival. After more than the pill of silence and a sweep, the later arrival is still
    refused behind the first place exactly when that execution is queued or parked; otherwise
    it passes it over. The sweep leaves each line's lifetime as it was."""
    settings.REACTOR_SWEEP_AFTER = 3600  # the sweep re-enqueues nothing here
    coordinator = Coordinator()
    lines = {}
    for fate in FATES:
        key = f"waiting:{fate}:{uuid.uuid4().hex}"
        # a reactor-level place for most, a step's for the parked one (any kept slot counts)
        slot = "charge" if fate == "parked" else REACTOR_SLOT
        first = coordinator.assign_position(key, Holder(owner=f"first:{fate}"), LINE_TTL)
        waiting_row(fate, slot, key, first)
        later = Holder(owner=f"later:{fate}")
        second = coordinator.assign_position(key, later, LINE_TTL)
        lines[fate] = (key, first, claim(key, second), later)
    time.sleep(SILENT)

    sweep()

    for fate, kept in FATES.items():
        key, first, second, later = lines[fate]
        answer = coordinator.admit([second], later)
        if kept:
            assert isinstance(answer, Refused), (fate, answer)
            assert (answer.detail.stale, answer.detail.head) == (False, first.nonce), fate
        else:
            assert isinstance(answer, Admitted), (fate, answer)
            assert ordered_lock.ordered_state(key).last_completed == first.nonce, fate
        ttl_ms = coordinator.client.pttl(ordered_lock.state_key(key, coordinator.prefix))
        assert 0 < ttl_ms <= LINE_TTL * 1000, (fate, ttl_ms)


def test_vouching_never_revives_a_place_that_is_gone() -> None:
    """A place completed, passed over or reset meanwhile stays gone: the vouch names the
    exact position and answers False."""
    coordinator = Coordinator()
    key = f"waiting:gone:{uuid.uuid4().hex}"
    first = coordinator.assign_position(key, Holder(owner="first"), LINE_TTL)
    later = Holder(owner="later")
    second = claim(key, coordinator.assign_position(key, later, LINE_TTL))
    time.sleep(SILENT)
    assert isinstance(coordinator.admit([second], later), Admitted)  # passes the first over
    assert ordered_lock.vouch(key, first) is False
    line = ordered_lock.ordered_state(key)
    assert first.nonce not in [p.nonce for p in line.positions]
    assert line.last_completed == first.nonce
    # after a reset the old epoch's places are gone too
    third = coordinator.assign_position(key, Holder(owner="third"), LINE_TTL)
    ordered_lock.reset(key)
    assert ordered_lock.vouch(key, third) is False
    assert ordered_lock.ordered_state(key).positions == []


@pytest.mark.parametrize("lost_by", ["poison_pill", "reset"])
def test_a_unit_whose_kept_place_is_gone_says_so_and_takes_a_new_one(lost_by: str) -> None:
    """A gate entered with a kept position that a later arrival passed over (or an operator's
    reset wiped) records an ``ordered_skipped`` event naming that position and why, takes a
    new place at the back of the line, keeps it in the execution's positions and runs."""
    coordinator = Coordinator()
    key = f"waiting:gate:{uuid.uuid4().hex}"
    row = Execution.objects.create(reactor="tests.Waiting", status="running", inputs={})
    execution_id = str(row.pk)
    kept = coordinator.assign_position(key, Holder(owner=execution_id), LINE_TTL)
    if lost_by == "poison_pill":
        later = Holder(owner="later")
        second = claim(key, coordinator.assign_position(key, later, LINE_TTL))
        time.sleep(SILENT)
        admitted = coordinator.admit([second], later)
        assert isinstance(admitted, Admitted)
        coordinator.release(admitted, "success")
    else:
        ordered_lock.reset(key)
    positions = {REACTOR_SLOT: {"key": key, "nonce": kept.nonce, "epoch": kept.epoch}}
    gate = Gate(
        [OrderedLockDeclaration(key_fn=lambda inputs: key, poison_pill_timeout=PILL)],
        {},
        GateScope(
            reactor="tests.Waiting",
            step=None,
            owner=execution_id,
            execution_id=execution_id,
            held_keys=None,
            positions=positions,
            position_slot=REACTOR_SLOT,
        ),
        coordinator=coordinator,
    )
    assert gate.enter(wait=5.0, park=False) is None
    assert gate.admitted is not None
    now_kept = positions[REACTOR_SLOT]
    assert now_kept["key"] == key and (now_kept["nonce"], now_kept["epoch"]) != (
        kept.nonce,
        kept.epoch,
    )
    gate.exit("success")
    flush()
    event = CoordinationEvent.objects.get(key=key, kind="ordered_skipped")
    assert (event.detail["by"], event.detail["nonce"]) == (lost_by, kept.nonce)
    assert event.execution_id == row.pk


def test_a_deferred_run_is_vouched_for_once_it_is_due(settings: Any) -> None:
    """``run_after``: the place is left to the pill until the run is due, kept from then on."""
    settings.REACTOR_SWEEP_AFTER = 3600
    coordinator = Coordinator()
    key = f"waiting:due:{uuid.uuid4().hex}"
    first = coordinator.assign_position(key, Holder(owner="first"), LINE_TTL)
    row = waiting_row("deferred", REACTOR_SLOT, key, first)
    time.sleep(2.0)  # an age a stall of a loaded machine cannot fake after the vouch below
    sweep()
    assert ordered_lock.ordered_state(key).positions[0].heartbeat_age >= 2.0  # not vouched
    Execution.objects.filter(pk=row.pk).update(heartbeat_at=timezone.now())
    sweep()
    assert ordered_lock.ordered_state(key).positions[0].heartbeat_age < 1.5
