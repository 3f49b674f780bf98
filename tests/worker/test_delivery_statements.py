"""The statements a worker delivery and an in-process run send (issue 32, item 2).

A delivery runs in this process (``deliver``, the body of the worker task) so that its
statements can be captured: one claim statement (``UPDATE ... RETURNING``: no ``SELECT`` of the
row, before it or after) that also writes the start when the message names the first step (as
``run_async``'s does), one checkpoint per step but the last (the finish carries it), the
history in bulk and one finish — on PostgreSQL the history rides in the finish's statement.
Only a park's countdown requeue reads the row first, to drop
itself when stale. (The count went from six to five statements when the start rode with the
claim: the row the claim returns already says ``running``, and to four on PostgreSQL when the
history rode with the finish.)
A sequential map on a worker checkpoints its elements in batches; in process it writes none of
them before its end. These are behaviour tests of how many statements are sent, not timings.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from reactor_app import (
    Reactor,
    Step,
    Success,
    element,
    from_input,
    map_step,
    step,
    with_lock,
    with_rate_limit,
)
from reactor_app.engine.dispatch import deliver
from reactor_app.engine.state import ExecutionState
from reactor_app.models import Execution
from reactor_app.signals import engine_event
from reactor_app.status import EngineEvent, ExecutionStatus

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

TABLE = '"reactor_app_execution"'
STEP_RUNS = '"reactor_app_steprun"'
TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")


class Body(Step):
    inputs = ("n",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success({"n": args["n"], "payload": "x" * 200})


class ThreeSteps(Reactor):
    inputs = ("n",)

    one = step(Body, n=from_input("n"))
    two = step(Body, n=from_input("n"))
    three = step(Body, n=from_input("n"))


class SixSteps(ThreeSteps):
    four = step(Body, n=from_input("n"))
    five = step(Body, n=from_input("n"))
    six = step(Body, n=from_input("n"))


class HandedOff(ThreeSteps):
    """Runs ``one`` in the caller's process, then a worker delivery resumes after it."""

    background = "after:one"


@with_lock(lambda inputs: f"statements:{inputs['n']}", ttl=30)
class GatedThreeSteps(ThreeSteps):
    """A reactor-level lock: leaving it decides things in Redis, so its last checkpoint stays."""


@with_rate_limit(lambda inputs: f"statements:{inputs['n']}", limit=100, period=60)
class RateLimitedThreeSteps(ThreeSteps):
    """A reactor-level rate limit: its admission is written down before the first body."""


class MapOver(Reactor):
    inputs = ("items",)

    each = map_step(Body, over=from_input("items"), n=element("n"))


def statements(captured: CaptureQueriesContext) -> list[str]:
    return [
        q["sql"]
        for q in captured.captured_queries
        if not q["sql"].upper().startswith(TRANSACTION_CONTROL)
    ]


PROGRESS = '"reactor_app_executionprogress"'


def on_execution(sqls: list[str], verb: str) -> list[str]:
    """Statements of ``verb`` on the execution row; a write that appends progress rows is one
    ``WITH claimed AS (UPDATE ...) INSERT ...`` on PostgreSQL, counted as an UPDATE."""
    verbs = ("UPDATE", "WITH") if verb == "UPDATE" else (verb,)
    return [sql for sql in sqls if sql.startswith(verbs) and TABLE in sql.split(" WHERE ")[0]]


def progress_inserts(sqls: list[str]) -> list[str]:
    """The progress rows' own INSERTs (SQLite: after the conditional UPDATE, in its
    transaction; PostgreSQL appends them inside the UPDATE's statement)."""
    return [sql for sql in sqls if sql.startswith("INSERT") and PROGRESS in sql.split("(")[0]]


def deliver_captured(reactor: type[Reactor], **inputs: Any) -> list[str]:
    execution = reactor.run_async(**inputs)
    with CaptureQueriesContext(connection) as captured:
        # what the task passes from a new execution's message (its START_HEADER)
        outcome = deliver(str(execution.id), start=reactor.plan.order[0])
    assert outcome["status"] == ExecutionStatus.SUCCEEDED, outcome
    return statements(captured)


def test_a_delivery_reads_the_row_once_claims_once_and_writes_once_per_step() -> None:
    sqls = deliver_captured(ThreeSteps, n=1)
    selects = on_execution(sqls, "SELECT")
    updates = on_execution(sqls, "UPDATE")
    assert selects == []  # no look before the claim; the claim returns the row
    claims = [sql for sql in updates if '"claim_generation" + 1' in sql.split(" WHERE ")[0]]
    assert len(claims) == 1 and "RETURNING" in claims[0], claims
    # the claim with the start (the message named the first step), a checkpoint after each
    # step but the last, the finish (carrying the last step's progress)
    assert len(updates) == 1 + 2 + 1, updates
    assert '"started_at"' in updates[0].split(" WHERE ")[0], updates
    # every write after the claim is conditional on the claim generation
    assert all('"claim_generation" = ' in sql.split(" WHERE ")[1] for sql in updates[1:])
    # the history of the pass (its three step runs): on PostgreSQL it rides in the finish's
    # own statement, in front of it; elsewhere one bulk insert just before the finish
    appended = progress_inserts(sqls)
    inserts = [sql for sql in sqls if sql.startswith("INSERT") and sql not in appended]
    if connection.vendor == "postgresql":
        assert inserts == [], inserts
        assert updates[-1].startswith(f"WITH leading_0 AS (INSERT INTO {STEP_RUNS} "), updates
        assert sqls[-1] == updates[-1], sqls
    else:
        assert len(inserts) == 1 and STEP_RUNS in inserts[0], inserts
        # just before the finish (whose progress rows follow it)
        assert sqls.index(inserts[0]) + 1 == sqls.index(updates[-1]), sqls
    # what a step adds is appended as rows in its write's statement (PostgreSQL) or right
    # after it (SQLite): the two checkpoints and the finish
    assert len(appended) == (0 if connection.vendor == "postgresql" else 3), appended
    # the progress checkpoints skip the WAL-flush wait on PostgreSQL (in the same statement);
    # the claim with the start and the end (which carries the last step's checkpoint and the
    # history) do not
    expected_async = [1, 2] if connection.vendor == "postgresql" else []
    assert [i for i, sql in enumerate(updates) if "synchronous_commit" in sql] == expected_async
    assert not any("synchronous_commit" in sql for sql in inserts), inserts
    assert len(sqls) == len(selects) + len(updates) + len(inserts) + len(appended), sqls


def test_each_more_step_costs_one_statement() -> None:
    three = deliver_captured(ThreeSteps, n=1)
    six = deliver_captured(SixSteps, n=1)
    per_step = 1 if connection.vendor == "postgresql" else 2  # SQLite: UPDATE, then INSERT
    assert len(six) - len(three) == 3 * per_step, (three, six)


def test_a_delivery_that_resumes_reads_the_progress_rows_once() -> None:
    started = HandedOff.run(n=7)
    assert started.status == "handed_off", started
    with CaptureQueriesContext(connection) as captured:
        outcome = deliver(str(started.execution_id))
    assert outcome["status"] == ExecutionStatus.SUCCEEDED, outcome
    sqls = statements(captured)
    reads = [sql for sql in sqls if sql.startswith("SELECT") and PROGRESS in sql]
    assert len(reads) == 1, reads  # the state assembled once, when the delivery starts
    # the result of the step run before the hand-off came back from the rows
    row = Execution.objects.get(pk=started.execution_id)
    assert row.result["one"]["n"] == 7 and set(row.result) == {"one", "two", "three"}
    assert "results" not in row.context  # kept in the rows, not in the context


@pytest.mark.parametrize("count", [10, 250])
def test_a_worker_map_writes_its_elements_in_batches(settings: Any, count: int) -> None:
    settings.REACTOR_MAP_CHECKPOINT_EVERY = 50
    settings.REACTOR_MAP_CHECKPOINT_SECONDS = 60
    sqls = deliver_captured(MapOver, items=[{"n": i} for i in range(count)])
    updates = on_execution(sqls, "UPDATE")
    # the claim with the start, one write per full batch of 50, the finish (carrying the
    # step's checkpoint: the map is the last step)
    assert len(updates) == 1 + count // 50 + 1, len(updates)


@pytest.mark.parametrize("count", [10, 250])
def test_an_in_process_map_writes_no_element_before_its_end(count: int) -> None:
    with CaptureQueriesContext(connection) as captured:
        result = MapOver.run(items=[{"n": i} for i in range(count)])
    assert result.status == ExecutionStatus.SUCCEEDED
    assert len(result.value["each"]) == count
    updates = on_execution(statements(captured), "UPDATE")
    assert len(updates) == 1, updates  # its end; the start was the row's INSERT


def test_a_stale_countdown_requeue_reads_the_row_once_and_writes_nothing() -> None:
    """A park's countdown requeue (it carries the park's token) reads the row before taking
    the claim: one that an earlier park left (the execution parked again since, under another
    token) goes without a claim statement."""
    execution = ThreeSteps.run_async(n=1)
    state = ExecutionState.from_json(execution.context)
    state.continuation.requeue_token = "the-newer-park"
    Execution.objects.filter(pk=execution.pk).update(
        status=ExecutionStatus.PARKED, context=state.to_json()
    )
    with CaptureQueriesContext(connection) as captured:
        outcome = deliver(str(execution.id), requeue_token="an-older-park")
    assert outcome["outcome"] == "stale_requeue"
    sqls = statements(captured)
    assert len(on_execution(sqls, "SELECT")) == 1
    assert on_execution(sqls, "UPDATE") == []
    assert Execution.objects.get(pk=execution.pk).claim_generation == 0


def test_a_reactor_level_gate_keeps_the_last_checkpoint() -> None:
    sqls = deliver_captured(GatedThreeSteps, n=2)
    updates = on_execution(sqls, "UPDATE")
    # the claim with the start, a checkpoint after every step, the finish
    assert len(updates) == 1 + 3 + 1, updates


def test_a_reactor_level_rate_limit_writes_its_admission_before_the_first_body() -> None:
    """One statement more than a lock's gate, not waiting for the disk: a delivery that takes
    over from one killed in the first step continues the admission instead of charging again
    (``tests/worker/test_execution.py`` kills one)."""
    sqls = deliver_captured(RateLimitedThreeSteps, n=3)
    updates = on_execution(sqls, "UPDATE")
    # the claim with the start, the admission, a checkpoint after every step, the finish
    assert len(updates) == 1 + 1 + 3 + 1, updates
    assert '"context"' in updates[1].split(" WHERE ")[0], updates
    if connection.vendor == "postgresql":
        assert "synchronous_commit" in updates[1], updates


def test_the_first_delivery_starts_the_execution_and_a_later_one_resumes_it() -> None:
    seen: list[str] = []

    def receiver(sender: Any, kind: str, execution: Any, **payload: Any) -> None:
        seen.append(kind)

    engine_event.connect(receiver, weak=False)
    try:
        deliver_captured(ThreeSteps, n=3)
        first_delivery = list(seen)
        started = HandedOff.run(n=4)
        seen.clear()
        deliver(str(started.execution_id))
    finally:
        engine_event.disconnect(receiver)
    # a first delivery's pass is a start, not a resume
    assert first_delivery[0] == EngineEvent.EXECUTION_STARTED, first_delivery
    assert EngineEvent.EXECUTION_RESUMED not in first_delivery, first_delivery
    assert seen[0] == EngineEvent.EXECUTION_RESUMED, seen  # the hand-off ran before
    first = Execution.objects.get(reactor=ThreeSteps.path())
    assert first.started_at is not None and first.current_step == ""
    # the last step's result, carried by the finish
    assert first.result["three"]["n"] == 3 and set(first.result) == {"one", "two", "three"}


def set_clause(sql: str) -> str:
    return sql.split(" WHERE ")[0]


@pytest.mark.parametrize("sweep_after", [120.0, 1e-6])
def test_a_progress_checkpoint_refreshes_the_heartbeat_only_when_it_is_due(
    settings: Any, sweep_after: float
) -> None:
    settings.REACTOR_SWEEP_AFTER = sweep_after
    updates = on_execution(deliver_captured(ThreeSteps, n=8), "UPDATE")
    claim, checkpoints, finish = updates[0], updates[1:-1], updates[-1]  # [0]: with the start
    assert len(checkpoints) == 2, updates
    # the heartbeat is indexed (the sweeper's query): a checkpoint that leaves it alone
    # changes no indexed column; the claim and every status write always refresh it
    assert '"heartbeat_at"' in set_clause(claim) and '"heartbeat_at"' in set_clause(finish)
    refreshed = ['"heartbeat_at"' in set_clause(sql) for sql in checkpoints]
    assert refreshed == ([False, False] if sweep_after == 120.0 else [True, True]), checkpoints


def test_a_delivery_whose_message_names_no_first_step_writes_the_start_itself() -> None:
    """A message without the start header (a sweeper's re-send, one sent by an earlier
    version): the claim, then the start as its own statement — the same pass."""
    execution = ThreeSteps.run_async(n=5)
    with CaptureQueriesContext(connection) as captured:
        outcome = deliver(str(execution.id))
    assert outcome["status"] == ExecutionStatus.SUCCEEDED, outcome
    updates = on_execution(statements(captured), "UPDATE")
    assert len(updates) == 1 + 1 + 2 + 1, updates
    assert '"started_at"' not in set_clause(updates[0]) and '"started_at"' in set_clause(updates[1])
    row = Execution.objects.get(pk=execution.pk)
    assert row.started_at is not None and row.result["three"]["n"] == 5


def test_the_claim_starts_only_a_pending_execution_that_never_started() -> None:
    """A start named by a message is not applied to an execution that started before (one
    handed off after its first step): the pass resumes it, from its second step."""
    seen: list[str] = []

    def receiver(sender: Any, kind: str, execution: Any, **payload: Any) -> None:
        seen.append(kind)

    started = HandedOff.run(n=6)
    before = Execution.objects.get(pk=started.execution_id)
    engine_event.connect(receiver, weak=False)
    try:
        with CaptureQueriesContext(connection) as captured:
            outcome = deliver(str(started.execution_id), start="one")
    finally:
        engine_event.disconnect(receiver)
    assert outcome["status"] == ExecutionStatus.SUCCEEDED, outcome
    assert seen[0] == EngineEvent.EXECUTION_RESUMED, seen
    updates = on_execution(statements(captured), "UPDATE")
    assert '"started_at"' in set_clause(updates[1]), updates  # its own start write
    row = Execution.objects.get(pk=started.execution_id)
    assert row.started_at == before.started_at  # not restamped by the claim
    assert row.result["one"]["n"] == 6 and set(row.result) == {"one", "two", "three"}


def test_a_new_execution_s_message_names_its_first_step(settings: Any) -> None:
    """``run_async`` sends the first step in the message's headers (a worker of an earlier
    version ignores them); a debounced start is decided at delivery and names none."""
    from celery import current_app

    from reactor_app.engine.enqueueing import RUN_EXECUTION, START_HEADER

    sent: list[dict[str, Any]] = []
    task = current_app.tasks[RUN_EXECUTION]
    original = task.apply_async

    def capture(*args: Any, **options: Any) -> Any:
        sent.append(options)

    task.apply_async = capture
    try:
        ThreeSteps.run_async(n=9)
        ThreeSteps.run_async(n=9, debounce=("statements-burst", 0.01))
    finally:
        task.apply_async = original
    assert len(sent) == 2, sent
    assert sent[0].get("headers") == {START_HEADER: "one"}, sent[0]
    assert "headers" not in sent[1], sent[1]


def test_run_async_outside_a_transaction_is_one_insert() -> None:
    """The row's INSERT alone, in autocommit (a transaction of its own added BEGIN and COMMIT
    to every call); inside a caller's transaction, a savepoint keeps a lost idempotency race
    from breaking it."""
    from django.db import transaction

    with CaptureQueriesContext(connection) as captured:
        ThreeSteps.run_async(n=10)
    sqls = [q["sql"] for q in captured.captured_queries]
    assert len(sqls) == 1 and sqls[0].startswith("INSERT") and TABLE in sqls[0], sqls
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        ThreeSteps.run_async(n=11)
    sqls = [q["sql"] for q in captured.captured_queries]
    assert [sql.split()[0] for sql in sqls] == ["SAVEPOINT", "INSERT", "RELEASE"], sqls
    assert Execution.objects.filter(reactor=ThreeSteps.path()).count() == 2
