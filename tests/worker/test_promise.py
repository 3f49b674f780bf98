"""The saga promise under cancel and retry (issue 30, items 1 and 2).

Every effect a step's body made either stands at the end of a successful run, or is undone
exactly once. Each step writes ``do``/``undo``/``compensate`` to a ledger the test owns (a
Redis list, ``promise_reactors.ledger``), and the tests assert its exact sequence:

* a cancel that lands while a body runs which then **completes** stops the run at that step's
  boundary and undoes the step with the other completed ones, newest first — no compensate;
  a body that stops at its ``checkpoint()`` does not complete and is compensated. Generated
  (Hypothesis): which step the cancel lands in, whether the body completes, whether the step
  holds a lock (the cancel then read by the lock's release). In this process (the cancel from
  another thread) and on a real Celery worker;
* a retry after a rollback never reuses a result whose undo ran: by default it restarts at the
  first undone step; a later ``from_step`` is refused naming the undone steps; a step without
  an undo is reused;
* two cancels keep both reasons (the first wins the error, the second is an event);
* cancelling a parked parent (a parallel map, ``async_step`` children) returns at once with the
  parent still ``parked`` — a worker rolls it back — and children that had not started never
  start, while those that completed are undone once by the parent, newest first.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from django.db import connection
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reactor_app.conf import reactor_settings
from reactor_app.exceptions import ExecutionNotRetryable
from reactor_app.models import CoordinationEvent, Execution
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from tests.worker.helpers import wait_until
from tests.worker.promise_reactors import (
    BackgroundPayOrder,
    BackgroundPlaceOrder,
    BackgroundPlaceOrderLocked,
    PayOrder,
    PlaceOrder,
    PlaceOrderLocked,
    go,
    ledger,
    set_failing,
)

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

STEPS = ["reserve", "charge", "email"]


def expected_after_cancel(land: str, completes: bool) -> list[str]:
    """The ledger of a ``PlaceOrder`` cancelled while ``land``'s body runs: the steps before
    it done; ``land`` done and then undone with them newest first (a completed body), or
    compensated (when its step has a compensate) and not done (a body stopped at its
    checkpoint); nothing after it."""
    index = STEPS.index(land)
    before = STEPS[:index]
    entries = [f"do:{name}" for name in before]
    if completes:
        entries.append(f"do:{land}")
        undone = [*before, land]
    else:
        if land != "charge":  # the charge has an undo and no compensate
            entries.append(f"compensate:{land}")
        undone = before
    entries += [f"undo:{name}:{name}-done" for name in reversed(undone)]
    return entries


def effects(order: str) -> tuple[str, list[str]]:
    """The execution id the landed body wrote, and the ledger without its ``enter`` line."""
    lines = ledger(order)
    [entered] = [line for line in lines if line.startswith("enter:")]
    return entered.rsplit(":", 1)[1], [line for line in lines if not line.startswith("enter:")]


def entered_id(order: str) -> str | None:
    lines = [line for line in ledger(order) if line.startswith("enter:")]
    return lines[0].rsplit(":", 1)[1] if lines else None


def run_in_thread(reactor: Any, inputs: dict[str, Any], box: dict[str, Any]) -> threading.Thread:
    def target() -> None:
        try:
            box["result"] = reactor.run(**inputs)
        except BaseException as exc:  # pragma: no cover - reported by the test
            box["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def cancel_when_entered(order: str, reason: str = "customer left") -> str:
    wait_until(lambda: entered_id(order) is not None, 20, message="the body never started")
    execution_id = entered_id(order)
    assert execution_id is not None
    Execution.objects.get(pk=execution_id).cancel(reason, by="ops")
    # A run reads its flag at a step boundary only when its last read is REACTOR_CANCEL_POLL
    # old (docs/operations.md); its last read came before the body entered, so once a poll
    # interval has passed since the cancel, the boundary after the body reads it. Without this
    # wait a fast body could end within the interval and the run stop one step later (CI).
    time.sleep(reactor_settings.CANCEL_POLL)
    go(order)
    return execution_id


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(land=st.sampled_from(STEPS), completes=st.booleans(), locked=st.booleans())
# the case, found on the code before this change: the charge stood after the cancel
@example(land="charge", completes=True, locked=False)
@example(land="charge", completes=True, locked=True)
def test_a_cancel_during_a_body_undoes_it_once_if_it_completed_in_process(
    land: str, completes: bool, locked: bool
) -> None:
    order = f"o-{uuid.uuid4().hex[:10]}"
    box: dict[str, Any] = {}
    reactor = PlaceOrderLocked if locked else PlaceOrder
    thread = run_in_thread(
        reactor, {"order": order, "land": land, "stop_at_checkpoint": not completes}, box
    )
    execution_id = cancel_when_entered(order)
    thread.join(30)
    assert not thread.is_alive() and "error" not in box, box
    row = Execution.objects.get(pk=execution_id)
    assert row.status == ExecutionStatus.CANCELLED, (row.status, row.error)
    assert row.rollback_failures == []
    assert row.error["type"] == "ExecutionCancelled" and row.error["reason"] == "customer left"
    assert effects(order)[1] == expected_after_cancel(land, completes)


@pytest.mark.parametrize("reactor", [BackgroundPlaceOrder, BackgroundPlaceOrderLocked])
def test_a_cancel_during_a_charge_that_succeeds_refunds_it_on_a_worker(
    worker: Any, reactor: Any
) -> None:
    """The issue's example: the charge's body charges and returns ``Success`` after the
    cancel; the charge is refunded (its undo), then the reservation, newest first."""
    order = f"o-{uuid.uuid4().hex[:10]}"
    execution = reactor.run_async(order=order, land="charge", stop_at_checkpoint=False)
    cancel_when_entered(order)
    wait_until(
        lambda: Execution.objects.get(pk=execution.pk).status == ExecutionStatus.CANCELLED,
        30,
        message="the run did not end cancelled",
    )
    row = Execution.objects.get(pk=execution.pk)
    assert row.rollback_failures == []
    assert effects(order)[1] == [
        "do:reserve",
        "do:charge",
        "undo:charge:charge-done",
        "undo:reserve:reserve-done",
    ]


def test_a_second_cancel_keeps_both_reasons() -> None:
    """The first request wins the error; the second is recorded as an audit event with its
    own reason, and does not replace the first."""
    order = f"o-{uuid.uuid4().hex[:10]}"
    box: dict[str, Any] = {}
    thread = run_in_thread(
        PlaceOrder, {"order": order, "land": "charge", "stop_at_checkpoint": False}, box
    )
    wait_until(lambda: entered_id(order) is not None, 20, message="the body never started")
    execution_id = entered_id(order)
    Execution.objects.get(pk=execution_id).cancel("customer left", by="ops")
    Execution.objects.get(pk=execution_id).cancel("fraud suspected", by="risk")
    go(order)
    thread.join(30)
    row = Execution.objects.get(pk=execution_id)
    assert row.status == ExecutionStatus.CANCELLED
    assert (row.error["reason"], row.error["by"]) == ("customer left", "ops")
    events = CoordinationEvent.objects.filter(
        execution_id=execution_id, kind=CoordinationEventKind.CANCELLED
    ).order_by("at", "id")
    assert [(e.detail["reason"], e.detail["by"]) for e in events] == [
        ("customer left", "ops"),
        ("fraud suspected", "risk"),
    ]
    assert events[1].detail.get("first_reason") == "customer left"


# ---- retry after a rollback ---------------------------------------------------------------


def failed_pay(reactor: Any, order: str) -> Execution:
    set_failing(order, True)
    result = reactor.run(order=order)
    assert result.status == ExecutionStatus.FAILED
    failed = Execution.objects.get(pk=result.execution_id)
    reservation = f"reservation-{failed.pk}"
    assert ledger(order) == [
        "do:quote",
        f"do:reserve:{failed.pk}",
        f"do:charge:{reservation}",
        "fail:email",
        f"undo:charge:charge-of-{reservation}",
        f"undo:reserve:{reservation}",
    ]
    set_failing(order, False)
    return failed


def assert_ran_again_from_reserve(order: str, failed: Execution, retried: Execution) -> None:
    assert retried.status == ExecutionStatus.SUCCEEDED, retried.error
    reservation = f"reservation-{retried.pk}"
    # the quote (no undo: its effect stands) is reused; reserve and charge run again, so the
    # email names the new charge, never the refunded one
    assert ledger(order)[6:] == [
        f"do:reserve:{retried.pk}",
        f"do:charge:{reservation}",
        f"do:email:paid:charge-of-{reservation}",
    ]
    assert retried.context["retry"]["from_step"] == "reserve"
    assert retried.context["retry"]["reused"] == ["quote"]


def test_a_retry_restarts_at_the_first_step_the_rollback_undid() -> None:
    order = f"o-{uuid.uuid4().hex[:10]}"
    failed = failed_pay(PayOrder, order)
    from reactor_app.engine.retry import retry_plan  # new in this change

    assert retry_plan(failed).undone == ["reserve", "charge"]
    retried = failed.retry()
    assert_ran_again_from_reserve(order, failed, retried)


def test_a_retry_from_after_an_undone_step_is_refused_naming_it() -> None:
    order = f"o-{uuid.uuid4().hex[:10]}"
    failed = failed_pay(PayOrder, order)
    for later, named in (("email", "'reserve', 'charge'"), ("charge", "'reserve'")):
        with pytest.raises(ExecutionNotRetryable, match=f"rollback undid {named}") as refused:
            failed.retry(from_step=later)
        assert refused.value.fields()["undone"] == named.replace("'", "").split(", ")
    assert not failed.retries.exists()
    # from the first undone step (or earlier) it is allowed
    again = failed.retry(from_step="quote")
    assert again.status == ExecutionStatus.SUCCEEDED
    assert again.context["retry"]["reused"] == []


def test_a_retry_on_a_worker_restarts_at_the_first_undone_step(worker: Any) -> None:
    order = f"o-{uuid.uuid4().hex[:10]}"
    set_failing(order, True)
    first = BackgroundPayOrder.run_async(order=order)
    assert first.wait(timeout=30).status == ExecutionStatus.FAILED
    first.refresh_from_db()
    set_failing(order, False)
    retried = first.retry()
    wait_until(
        lambda: (
            Execution.objects.get(pk=retried.pk).status
            in (
                ExecutionStatus.SUCCEEDED,
                ExecutionStatus.FAILED,
            )
        ),
        30,
    )
    retried.refresh_from_db()
    assert_ran_again_from_reserve(order, first, retried)


# ---- a parked parallel map -----------------------------------------------------------------


def test_cancelling_a_parked_parallel_map_returns_at_once_and_unstarted_elements_never_start(
    worker: Any,
) -> None:
    """Six elements on a worker of concurrency 2: elements 0 and 1 wait inside their bodies
    (both slots busy), 2-5 have not started. The cancel returns with the parent still
    ``parked`` (no rollback in the caller); 0 and 1 complete (``succeeded``) and the parent,
    on a worker, undoes each once, newest first; 2-5 are cancelled without starting; the
    parent ends ``cancelled``."""
    from tests.worker.promise_reactors import ShipAll

    order = f"o-{uuid.uuid4().hex[:10]}"
    parent = ShipAll.run_async(order=order, items=list(range(6)))

    def entered() -> list[str]:
        return sorted(line for line in ledger(order) if line.startswith("enter:"))

    wait_until(lambda: len(entered()) == 2, 30, message="two elements never started")
    wait_until(
        lambda: Execution.objects.get(pk=parent.pk).status == ExecutionStatus.PARKED,
        30,
        message="the parent never parked",
    )
    answer = Execution.objects.get(pk=parent.pk).cancel("order withdrawn", by="ops")
    assert answer.status == ExecutionStatus.PARKED  # handed to a worker, not rolled back here
    assert not [line for line in ledger(order) if line.startswith("undo:")]
    go(order)
    wait_until(
        lambda: Execution.objects.get(pk=parent.pk).status == ExecutionStatus.CANCELLED,
        60,
        message="the parent did not end cancelled",
    )
    lines = ledger(order)
    started = sorted(int(line.rsplit(":", 1)[1]) for line in lines if line.startswith("enter:"))
    assert len(started) == 2
    # each element that started did its effect and had it undone exactly once; no other did
    for item in range(6):
        expected = 1 if item in started else 0
        assert lines.count(f"do:ship:{item}") == expected, lines
        assert lines.count(f"undo:ship:{item}") == expected, lines
        assert (
            lines.index(f"undo:ship:{item}") > lines.index(f"do:ship:{item}") if expected else True
        )
    rows = {int(row.inputs["item"]): row for row in Execution.objects.filter(parent_id=parent.pk)}
    assert sorted(rows) == list(range(6))
    for item, row in rows.items():
        assert row.status == (
            ExecutionStatus.SUCCEEDED if item in started else ExecutionStatus.CANCELLED
        ), (item, row.status)
        assert row.started_at is not None or item not in started
    # Newest first is by when each body returned; both were let go at the same instant, so
    # their order is a race of microseconds (the rows' finished_at come later still and can
    # cross it). Each is undone once, after both effects (above); the order across steps is
    # the saga model's and tests/sagas/test_regressions_workers.py's to check.
    undone = [int(line.rsplit(":", 1)[1]) for line in lines if line.startswith("undo:ship:")]
    assert sorted(undone) == sorted(started)
    assert min(lines.index(f"undo:ship:{i}") for i in started) > max(
        lines.index(f"do:ship:{i}") for i in started
    )
    assert Execution.objects.get(pk=parent.pk).rollback_failures == []


def test_cancelling_a_parent_awaiting_async_steps_never_starts_the_queued_one(
    worker: Any,
) -> None:
    """``async_step`` children: the two running complete and are undone by the parent,
    once each; the one still queued when the cancel came never starts."""
    from tests.worker.promise_reactors import ShipEach

    order = f"o-{uuid.uuid4().hex[:10]}"
    parent = ShipEach.run_async(order=order)
    wait_until(
        lambda: len([line for line in ledger(order) if line.startswith("enter:")]) == 2,
        30,
        message="two children never started",
    )
    wait_until(
        lambda: Execution.objects.get(pk=parent.pk).status == ExecutionStatus.PARKED,
        30,
        message="the parent never parked",
    )
    assert Execution.objects.get(pk=parent.pk).cancel("not needed").status == "parked"
    go(order)
    wait_until(
        lambda: Execution.objects.get(pk=parent.pk).status == ExecutionStatus.CANCELLED,
        60,
        message="the parent did not end cancelled",
    )
    lines = ledger(order)
    assert "enter:ship:2" not in lines and "do:ship:2" not in lines, lines
    # let go at the same instant, both complete at once: newest first is by when each body
    # returned, microseconds apart on two processes (the order of their ledger lines can
    # differ), so only "each once" is asserted here (tests/sagas has the order by completion)
    undone = [line.removeprefix("undo:") for line in lines if line.startswith("undo:")]
    assert sorted(undone) == ["ship:0", "ship:1"], lines
    rows = {int(row.inputs["item"]): row for row in Execution.objects.filter(parent_id=parent.pk)}
    assert rows[2].status == ExecutionStatus.CANCELLED and rows[2].started_at is None
    assert {rows[0].status, rows[1].status} == {ExecutionStatus.SUCCEEDED}
