"""A soft limit in the engine's own code ends the delivery there: the places that did not.

docs/operations.md ("Celery time limits"): the task's soft limit running out in the engine's
own code ends the delivery as if its worker had been killed there. Code that catches every
``Exception`` around the engine's own work — a best-effort write, a poll that reads an outage
as "nothing to see" — caught Celery's ``SoftTimeLimitExceeded`` too, and the delivery ran on
past its limit: further steps, a whole rollback, towards the hard limit that kills the process.
The soft-limit properties (``test_soft_limit_anywhere.py`` and the fan-out and cancel variants)
now check that a cut in the engine's own code starts no body or hook after it and does not end
the run (``stop_problems``); a scan of every 23rd line of every generated reactor's delivery
(and of the fan-out property's deliveries) found the places below, each kept here cut on
purpose.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.db import connection

from reactor_app import step, tracking_store, value, with_lock
from reactor_app.coordination import registry
from reactor_app.engine import cancel_flag, enqueueing
from reactor_app.engine.claim import ExecutionClaim
from reactor_app.engine.progress import ProgressStore
from reactor_app.models import Execution, StepRun
from reactor_app.status import ExecutionStatus
from reactor_app.testing import coordination_state
from tests.integration.test_soft_limit_anywhere import (
    LEDGER,
    STOPPED,
    Effect,
    GatedThreeEffects,
    ThreeEffects,
    _started,
    _until_ended,
)
from tests.integration.test_soft_limit_fan_out import ELEMENTS, UNITS, run_fanned

pytestmark = pytest.mark.django_db(transaction=True)


class CutOnce:
    """Calls ``original`` — but the first time ``when`` says so of a call's arguments, raises
    the soft limit instead, once, as Celery's signal handler does. ``fired``: it has."""

    def __init__(self, original: Callable[..., Any], when: Callable[..., bool]) -> None:
        self.original = original
        self.when = when
        self.fired = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.fired and self.when(*args, **kwargs):
            self.fired = True
            raise SoftTimeLimitExceeded()
        return self.original(*args, **kwargs)


def _ledger_after_first(seen: list[list[str]]) -> Any:
    """A ``before`` hook of the delivery loop that keeps the ledger as the first delivery
    left it (the hook runs before the second)."""

    def keep(execution: Execution, delivery: int) -> None:
        if delivery == 1:
            seen.append(list(LEDGER))

    return keep


def test_a_soft_limit_in_a_pass_s_final_write_ends_the_delivery_and_keeps_its_history(
    nobody_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The final write of a pass carries its buffered history (step runs, events) in the same
    statement (``write_behind.flush_into``). A failed statement is written again on its own —
    and a soft limit raised in it was taken for a failed statement: the write was made again
    and the delivery ended the run (``succeeded``). Now the history is written on its own and
    the limit goes on up: the delivery ends ``time_up``, and the next one ends the run."""
    if connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL carries a pass's history in its final write")
    cut = CutOnce(ProgressStore.write, lambda store, *a, **kw: kw.get("leading") is not None)
    monkeypatch.setattr(ProgressStore, "write", lambda *a, **kw: cut(*a, **kw))
    execution, first = _started(ThreeEffects, {"fail": False}, nobody_queue)
    outcomes = _until_ended(execution, first, nobody_queue)
    assert cut.fired, "no final write carried history"
    assert outcomes[0] == "time_up", outcomes
    assert execution.status == ExecutionStatus.SUCCEEDED, (outcomes, execution.error)
    assert LEDGER[:3] == ["do:s0", "do:s1", "do:s2"] and "undo:s0" not in LEDGER, LEDGER
    # the cut statement's history was written on its own: every body's step run is there
    names = set(StepRun.objects.filter(execution=execution).values_list("step", flat=True))
    assert names == {"s0", "s1", "s2"}, names


def test_a_soft_limit_in_a_pass_s_history_write_ends_the_delivery_and_keeps_the_rows(
    nobody_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the history cannot ride in the final write (SQLite), the pass writes it first
    (``tracking_store.write_rows``), and a bulk statement that fails is written again row by
    row — a soft limit raised in it was taken for a bad row: the rows were written again and
    the delivery ended the run (``succeeded``). Now the rows are written (they may be other
    threads') and the limit goes on up: the delivery ends ``time_up``; the next ends the run."""
    if connection.vendor == "postgresql":
        pytest.skip("PostgreSQL carries the history in the final write (the test above)")
    delivering = threading.get_ident()
    cut = CutOnce(
        tracking_store._insert,
        lambda *a, **kw: (
            LEDGER == ["do:s0", "do:s1", "do:s2"] and threading.get_ident() == delivering
        ),
    )
    monkeypatch.setattr(tracking_store, "_insert", cut)
    execution, first = _started(ThreeEffects, {"fail": False}, nobody_queue)
    outcomes = _until_ended(execution, first, nobody_queue)
    assert cut.fired, "the delivery wrote no history of its own"
    assert outcomes[0] == "time_up", outcomes
    assert execution.status == ExecutionStatus.SUCCEEDED, (outcomes, execution.error)
    names = set(StepRun.objects.filter(execution=execution).values_list("step", flat=True))
    assert names == {"s0", "s1", "s2"}, names


def test_a_soft_limit_in_the_cancel_poll_ends_the_delivery_and_the_poll_goes_on(
    nobody_queue: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel flag's poll reads an unreachable Redis as "not cancelled" and rests for
    ``POLL_REST`` seconds. A soft limit raised in its read was taken for such an outage: the
    delivery ran on through the rest of the run, and this process's polls then rested —
    a cancel requested meanwhile went unseen by every run of the process. Now the limit goes
    on up: the delivery stops at the step boundary, and the next poll reads the flag."""
    settings.REACTOR_CANCEL_POLL = 0  # every boundary reads the flag
    cut = CutOnce(cancel_flag.get_client, lambda: LEDGER == ["do:s0"])
    monkeypatch.setattr(cancel_flag, "get_client", cut)
    seen: list[list[str]] = []
    execution, first = _started(ThreeEffects, {"fail": False}, nobody_queue)
    outcomes = _until_ended(execution, first, nobody_queue, before=_ledger_after_first(seen))
    assert cut.fired, "the poll was never cut"
    assert outcomes[0] in STOPPED, outcomes
    assert seen == [["do:s0"]], seen  # s1 was not started by the cut delivery
    assert execution.status == ExecutionStatus.SUCCEEDED, (outcomes, execution.error)
    # no rest: a cancel requested now is read at once
    cancel_flag.request_cancel(execution.pk, reason="operator", by=None)
    assert cancel_flag.cancel_request(execution.pk) is not None


def test_a_soft_limit_while_forgetting_a_released_key_ends_the_delivery(
    nobody_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker forgets a key in its held-key registry once the key is given back, best
    effort (a leftover entry costs the next takeover a no-op). A soft limit raised in that
    forgetting was logged as a failed one: the delivery went on with ``s2``. Now it ends
    there; the next delivery takes over, and the run succeeds holding nothing."""
    # after s1's body, the registry's first use is forgetting s1's released lock
    cut = CutOnce(registry.get_client, lambda: LEDGER == ["do:s0", "do:s1"])
    monkeypatch.setattr(registry, "get_client", cut)
    seen: list[list[str]] = []
    tags = {"fail": False, "tag": uuid.uuid4().hex}
    execution, first = _started(GatedThreeEffects, tags, nobody_queue)
    outcomes = _until_ended(execution, first, nobody_queue, before=_ledger_after_first(seen))
    assert cut.fired, "the registry was never cut"
    assert outcomes[0] in STOPPED, outcomes
    assert seen == [["do:s0", "do:s1"]], seen  # s2 was not started by the cut delivery
    assert execution.status == ExecutionStatus.SUCCEEDED, (outcomes, execution.error)
    held = [h for h in coordination_state().holds() if h["execution"] == str(execution.id)]
    assert held == [], held


#: how many more times the key function below raises the soft limit in a rollback
ROLLBACK_CUTS: list[int] = [0]


def _key_cut_in_rollback(args: dict[str, Any]) -> str:
    # s0's undo re-takes its lock (after s1's undo): the limit lands in its key function then
    if LEDGER[-1:] == ["undo:s1"] and ROLLBACK_CUTS[0]:
        ROLLBACK_CUTS[0] -= 1
        raise SoftTimeLimitExceeded()
    return f"rollback-key-cut:{args['name']}"


@with_lock(_key_cut_in_rollback, ttl=30)
class LockedInRollback(Effect):
    """``Effect`` under a lock whose key function may be cut off while its undo re-takes it."""


class RollbackKeyCut(ThreeEffects):
    s0 = step(LockedInRollback, name=value("s0"), fail=value(False))


def test_a_soft_limit_in_a_key_function_while_an_undo_re_takes_its_lock_runs_the_undo_later(
    nobody_queue: str,
) -> None:
    """Found by the scan (a semaphore's key function, as ``s0``'s undo re-took its slot): a
    rollback hook re-takes what its step held, and a declaration's key function failing there
    is reported as a rollback failure (the hook could not be run under its exclusion). A soft
    limit raised in that function was reported the same way: the run failed with ``s0`` not
    undone and its effect standing. Now, as in the forward path, the limit ends the delivery
    (the function's failure is not the hook's) and the next delivery runs the undo."""
    ROLLBACK_CUTS[0] = 1
    execution, first = _started(RollbackKeyCut, {"fail": True}, nobody_queue)
    outcomes = _until_ended(execution, first, nobody_queue)
    assert not ROLLBACK_CUTS[0], "the key function was never cut"
    assert outcomes[0] == "time_up", outcomes
    assert execution.status == ExecutionStatus.FAILED, (outcomes, execution.error)
    assert execution.error["step"] == "s2", execution.error
    assert not execution.rollback_failures, execution.rollback_failures
    assert LEDGER == ["do:s0", "do:s1", "do:s2", "compensate:s2", "undo:s1", "undo:s0"], LEDGER


def test_a_soft_limit_while_a_delivery_gives_back_its_claim_ends_the_task_with_it(
    nobody_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the cancel variant of the property: the delivery's last act, giving back its
    execution claim, caught the limit with the claim's own failures (lapsed, Redis away: the
    TTL frees it either way) and reported the run's end as if nothing had happened. Now the
    task ends with the limit, as on the lines before and after; the run had ended, and the
    claim's TTL frees it."""
    original = ExecutionClaim.release
    cuts = [1]

    def cut_in_release(claim: ExecutionClaim) -> None:
        if cuts[0]:
            cuts[0] -= 1
            lock = claim._lock
            real = lock.release

            def cut() -> None:
                lock.release = real  # type: ignore[method-assign]
                raise SoftTimeLimitExceeded()

            lock.release = cut  # type: ignore[method-assign]
        original(claim)

    monkeypatch.setattr(ExecutionClaim, "release", cut_in_release)
    execution, first = _started(ThreeEffects, {"fail": False}, nobody_queue)
    outcomes = _until_ended(execution, first, nobody_queue)
    assert outcomes == ["raised"], outcomes
    assert execution.status == ExecutionStatus.SUCCEEDED, execution.error
    assert LEDGER == ["do:s0", "do:s1", "do:s2"], LEDGER


def test_a_soft_limit_while_a_finished_element_wakes_its_parent_ends_that_delivery(
    nobody_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the fan-out property: a message that cannot be sent is left to the sweeper
    (``enqueue_quietly``, ``wake``), and a soft limit raised while sending it was taken for
    a broker's refusal — the delivery of a parallel map's last element, waking its parent,
    reported ``succeeded`` past its limit. Now that delivery ends with the limit; the sweep
    sends the parent again, and the run succeeds with each body once."""
    elements = {f"do:{name}" for name in ELEMENTS}
    cut = CutOnce(
        enqueueing.enqueue,
        lambda *a, **kw: elements <= set(LEDGER) and "do:s2" not in LEDGER,
    )
    monkeypatch.setattr(enqueueing, "enqueue", cut)
    root, _, outcomes = run_fanned(False, 0, nobody_queue)
    assert cut.fired, "no message was cut"
    # the element's delivery ended with the limit (the task's exception), not succeeded
    assert [o for o in outcomes if o.endswith((":raised", ":time_up"))], outcomes
    assert root.status == ExecutionStatus.SUCCEEDED, (outcomes, root.error)
    assert sorted(LEDGER) == sorted(f"do:{name}" for name in UNITS), LEDGER
