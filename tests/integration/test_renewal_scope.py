"""A soft limit that cuts a gate's exit leaves no renewal running (``renewals_scope``).

Celery's soft time limit is raised by a signal handler, which the interpreter may run at a
function's entry: at the start of ``Gate.exit``, before it stopped the renewal of the holds
it releases. The delivery's renewal scope stops what its gates did not. Found by the cancel
variant of the soft-limit property with random seeds (a cut in a rollback hook's ``finally``,
before its gate's exit)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from reactor_app import Reactor, from_input, step, value
from reactor_app.coordination.renewal import scheduler
from reactor_app.coordination.renewal_scope import note_started, renewals_scope
from reactor_app.engine.gate import Gate
from reactor_app.status import ExecutionStatus
from reactor_app.testing import coordination_state
from tests.integration.test_soft_limit_anywhere import (
    LEDGER,
    Effect,
    SlotEffect,
    _deliver,
    _started,
    _until_ended,
    renewing_since,
)

pytestmark = pytest.mark.django_db(transaction=True)


class SlotInTheMiddle(Reactor):
    inputs = ("fail", "tag")
    s0 = step(Effect, name=value("s0"), fail=value(False))
    s1 = step(SlotEffect, name=value("s1"), fail=value(False), tag=from_input("tag"))
    s2 = step(Effect, name=value("s2"), fail=from_input("fail"))


class FailsInTheSlot(SlotInTheMiddle):
    s1 = step(SlotEffect, name=value("s1"), fail=from_input("fail"), tag=from_input("tag"))
    s2 = step(Effect, name=value("s2"), fail=value(False))


def _cut_first_exit_when(monkeypatch: pytest.MonkeyPatch, ledger: list[str]) -> list[Gate]:
    """``Gate.exit`` raises the soft limit at its entry once, the first time it is called with
    the ledger at ``ledger``; the gate it cut."""
    original = Gate.exit
    cut: list[Gate] = []

    def exit_cut(self: Gate, *args: Any, **kwargs: Any) -> Any:
        if not cut and list(LEDGER) == ledger:
            cut.append(self)
            raise SoftTimeLimitExceeded()  # as Celery's handler, at the function's entry
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Gate, "exit", exit_cut)
    return cut


@pytest.mark.parametrize(
    ("reactor", "ledger"),
    [
        # the step's exit after its compensate, still under its slot
        (FailsInTheSlot, ["do:s0", "do:s1", "compensate:s1"]),
        # the exit of the undo's re-taken slot
        (SlotInTheMiddle, ["do:s0", "do:s1", "do:s2", "compensate:s2", "undo:s1"]),
    ],
    ids=["a failed step", "an undo"],
)
def test_a_soft_limit_at_a_gates_exit_leaves_no_renewal_running(
    nobody_queue: str,
    monkeypatch: pytest.MonkeyPatch,
    reactor: type[SlotInTheMiddle],
    ledger: list[str],
) -> None:
    before = scheduler().renewing()
    cut = _cut_first_exit_when(monkeypatch, ledger)
    execution, first = _started(reactor, {"fail": True, "tag": uuid.uuid4().hex}, nobody_queue)
    assert _deliver(execution, first, None) == "time_up"
    assert cut, "the exit was not cut"
    # the cut gate never stopped its renewal: the delivery's scope did
    renewal = cut[0].keep_alive
    assert renewal is not None and renewal.stopped
    assert renewing_since(before) == []
    monkeypatch.undo()
    _until_ended(execution, {}, nobody_queue)
    assert execution.status == ExecutionStatus.FAILED, execution.error
    assert not [h for h in coordination_state().holds() if h["execution"] == str(execution.id)]


class _Stub:
    def __init__(self) -> None:
        self.stopped = False
        self.stops = 0

    def stop(self, timeout: float = 5.0) -> None:
        self.stopped = True
        self.stops += 1


def test_a_scope_stops_what_started_in_it_and_still_renews_only() -> None:
    outside, stopped_early, left, other_thread = _Stub(), _Stub(), _Stub(), _Stub()
    note_started(outside)  # no scope: nothing keeps it
    with pytest.raises(SoftTimeLimitExceeded), renewals_scope():
        note_started(stopped_early)
        stopped_early.stop()
        note_started(left)
        worker = threading.Thread(target=note_started, args=(other_thread,))
        worker.start()
        worker.join()
        raise SoftTimeLimitExceeded()
    assert (outside.stops, stopped_early.stops, left.stops, other_thread.stops) == (0, 1, 1, 0)


class _CutAfterSet:
    """Stands in for the scope's ``ContextVar``: its first ``set`` is made, then the soft limit
    raised, as Celery's handler would run once the call returned."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.cut = False

    def get(self) -> Any:
        return self.real.get()

    def set(self, value: Any) -> Any:
        token = self.real.set(value)
        if not self.cut:
            self.cut = True
            raise SoftTimeLimitExceeded()
        return token


def test_a_soft_limit_right_after_the_scope_set_its_list_leaves_no_scope_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scope's list was set before its ``try``: a soft limit landing just after left it
    in the context, and every renewal started later outside any scope was kept in it."""
    from reactor_app.coordination import renewal_scope

    cut = _CutAfterSet(renewal_scope._started)
    monkeypatch.setattr(renewal_scope, "_started", cut)
    with pytest.raises(SoftTimeLimitExceeded), renewals_scope():
        pytest.fail("the block ran although the scope was cut before it")
    assert cut.cut
    assert renewal_scope._started.get() is None  # no scope left behind
    later = _Stub()
    note_started(later)  # outside any scope: nothing keeps it, nothing stops it
    assert not later.stopped
    with renewals_scope():  # and a later scope works as before
        note_started(later)
    assert later.stops == 1
