"""A pass's history rides with its end (``write_behind.TrackingWriter.flush_into``).

On PostgreSQL the buffered step runs and events of a pass are ``INSERT``s in front of the
pass's final write, one statement (``row_statements.LeadingInserts``); elsewhere they are
written just before it. Either way whoever sees the end finds the history, a history row the
database refuses costs neither the end nor the other rows, and rows carried by a write whose
update matched nothing (a lost claim) are still written, as they were when they went first.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from reactor_app import Reactor, Step, Success, from_input, step
from reactor_app.engine.dispatch import deliver
from reactor_app.models import CoordinationEvent, Execution, StepRun
from reactor_app.row_statements import conditional_update
from reactor_app.status import ExecutionStatus
from reactor_app.tracking_store import leading_inserts
from reactor_app.write_behind import get_writer

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


class Note(Step):
    inputs = ("n",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success({"n": args["n"]})


class TwoNotes(Reactor):
    inputs = ("n",)

    first = step(Note, n=from_input("n"))
    second = step(Note, n=from_input("n"))


def event_row(execution_id: Any, key: str) -> tuple[Any, ...]:
    """A coordination event's values in ``tracking_store.EVENT_COLUMNS`` order."""
    return (execution_id, "", "tests", "lock", key, "acquired", "", None, timezone.now(), {})


def test_the_end_finds_its_history_written() -> None:
    execution = TwoNotes.run_async(n=3)
    outcome = deliver(str(execution.id), start="first")
    assert outcome["status"] == ExecutionStatus.SUCCEEDED, outcome
    runs = StepRun.objects.for_execution(execution.id)
    assert [(r.step, r.status) for r in runs] == [("first", "succeeded"), ("second", "succeeded")]
    assert all(r.started_at and r.finished_at and r.finished_at >= r.started_at for r in runs)
    assert get_writer().pending == 0


def test_a_refused_history_row_costs_neither_the_end_nor_the_other_rows() -> None:
    """An event of an execution that does not exist (its foreign key is checked at commit)
    fails the statement that carries it; the other rows and the end are written anyway."""
    execution = TwoNotes.run_async(n=4)
    kept, refused = f"kept-{uuid.uuid4().hex}", f"refused-{uuid.uuid4().hex}"
    get_writer().add_event(event_row(execution.id, kept))
    get_writer().add_event(event_row(uuid.uuid4(), refused))
    outcome = deliver(str(execution.id), start="first")
    assert outcome["status"] == ExecutionStatus.SUCCEEDED, outcome
    assert Execution.objects.get(pk=execution.id).status == ExecutionStatus.SUCCEEDED
    assert StepRun.objects.for_execution(execution.id).count() == 2
    assert CoordinationEvent.objects.filter(key=kept).count() == 1
    assert not CoordinationEvent.objects.filter(key=refused).exists()


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="rows ride in front of a write on PostgreSQL only"
)
def test_rows_carried_by_a_write_that_matched_nothing_are_written() -> None:
    execution = TwoNotes.run_async(n=5)
    key = f"carried-{uuid.uuid4().hex}"
    leading = leading_inserts([event_row(execution.id, key)], [], {})
    assert leading is not None
    stale = conditional_update(
        Execution, "default", execution.id, 999, {"current_step": "elsewhere"}
    )
    assert Execution.objects.write_conditional(stale, leading) == 0
    assert leading.written
    assert CoordinationEvent.objects.filter(key=key).count() == 1
    assert Execution.objects.get(pk=execution.id).current_step != "elsewhere"
