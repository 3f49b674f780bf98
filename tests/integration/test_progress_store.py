"""Checkpoints write what changed (``engine.progress``), and the row reads back as the state.

Property: after any sequence of the changes the engine makes between two writes (results and
rollback-log entries appended, a sequential map's elements appended, its progress replaced or
dropped, the log emptied by a rollback, notes set and cleared), the row's ``context`` reads
back as the state written, and the in-memory copy equals the row. Behaviour: the bytes a
checkpoint sends do not grow with the number of units completed before it; a write whose claim
generation is no longer the row's writes nothing.
"""

from __future__ import annotations

import threading
import time
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, connections, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor_app.engine.progress import ProgressStore, load_state
from reactor_app.engine.state import CompletedStep, ExecutionState
from reactor_app.engine.worker import ClaimLost
from reactor_app.models import Execution, ExecutionProgress
from reactor_app.status import ExecutionStatus

pytestmark = pytest.mark.django_db

NAMES = st.sampled_from(["a", "b", "c", "step one", "ü", "x.y", "it's", "a[0]"])
VALUES = st.one_of(
    st.none(),
    st.integers(-(10**6), 10**6),
    st.text(max_size=8),
    st.builds(lambda n: Decimal(n) / 100, st.integers(-9999, 9999)),
    st.lists(st.integers(0, 9), max_size=3),
)

# one change of the state, as (kind, name, value)
CHANGES = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "result",
                "completed",
                "map_element",
                "map_skipped",
                "map_replace",
                "map_drop",
                "rollback",
                "contention",
                "note",
                "note_clear",
                "write",
                "redeliver",
                "write_whole",
            ]
        ),
        NAMES,
        VALUES,
    ),
    max_size=40,
)


def fresh_row(context: dict[str, Any] | None = None) -> Execution:
    return Execution.objects.start(
        reactor="tests.Reactor",
        inputs={},
        status=ExecutionStatus.RUNNING,
        **({"context": context} if context is not None else {}),
    )


def apply(state: ExecutionState, kind: str, name: str, value: Any, counter: list[int]) -> None:
    counter[0] += 1
    n = counter[0]
    progress = state.children.progress()
    if kind == "result":
        state.results[f"{name}{n}"] = value
    elif kind == "completed":
        state.completed.append(CompletedStep(step=name, kind="step", args={"v": value}))
    elif kind in ("map_element", "map_skipped"):
        entry = progress.setdefault(name, {"elements": [], "values": [], "index": 0})
        if kind == "map_element":
            entry["elements"].append({"label": f"{name}[{entry['index']}]", "result": value})
        entry["values"].append(value)
        entry["index"] += 1
    elif kind == "map_replace":
        progress[name] = {"elements": [{"label": "x", "result": value}], "values": [], "index": 7}
    elif kind == "map_drop":
        progress.pop(name, None)
    elif kind == "rollback":
        state.completed.clear()
    elif kind == "contention":
        state.contention[name] = n
    elif kind == "note":
        state.continuation.parked_on = {
            "execution": "e",
            "step": name,
            "primitive": "lock",
            "key": str(value),
        }
    elif kind == "note_clear":
        state.continuation.parked_on = None


def assert_row_is(execution: Execution, state: ExecutionState) -> None:
    row = Execution.objects.get(pk=execution.pk)
    assert load_state(row).to_json() == state.to_json()
    assert row.context == execution.context  # the in-memory copy follows the row
    # what grows is in rows, not in the context
    assert not {"results", "completed", "map_progress"} & set(row.context)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(changes=CHANGES, start=st.sampled_from(["new", "old", "empty"]))
def test_the_row_reads_back_as_the_state_after_any_changes(
    changes: list[tuple[str, str, Any]], start: str
) -> None:
    # each example in a savepoint of its own: one that fails in the database leaves the
    # test's transaction usable, so the failure shrinks to its own example
    with transaction.atomic():
        reads_back_after(changes, start)


def reads_back_after(changes: list[tuple[str, str, Any]], start: str) -> None:
    # "old": the whole context as a version that rewrote it wrote it; "empty": a whole
    # context of an empty state (``run_async`` writes one: empty results and log in it)
    seed = ExecutionState(results={"seed": 1}, completed=[CompletedStep("seed", "step")])
    contexts = {"new": None, "old": seed.to_json(), "empty": ExecutionState().to_json()}
    execution = fresh_row(contexts[start])
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    counter = [0]
    for kind, name, value in changes:
        if kind == "write":
            store.write(state, {"current_step": name}, durable=False)
            assert_row_is(execution, state)
        elif kind in ("redeliver", "write_whole"):
            # what is written is what the next delivery reads; unwritten changes are lost
            store.write(state, {}, durable=False)
            execution = Execution.objects.get(pk=execution.pk)
            state = load_state(execution)
            if kind == "write_whole":
                # a whole context written from the assembled state (the interrupt resume)
                execution.context = state.to_json()
                execution.save(update_fields=["context"])
                assert load_state(Execution.objects.get(pk=execution.pk)) == state
            store = ProgressStore(execution, state)
        else:
            apply(state, kind, name, value, counter)
    store.write(state, {}, durable=True)
    assert_row_is(execution, state)


def test_regression_an_empty_map_progress_written_whole_reads_back_empty_not_absent() -> None:
    # found by the property above: a whole context written with ``map_progress: {}`` lost the
    # key when the next write moved the growing parts out of the context (an empty map
    # progress was taken for an empty results dict, which reads the same absent)
    execution = fresh_row()
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    state.children.progress()
    store.write(state, {}, durable=False)
    row = Execution.objects.get(pk=execution.pk)
    assembled = load_state(row)
    row.context = assembled.to_json()
    row.save(update_fields=["context"])
    ProgressStore(row, assembled).write(assembled, {"current_step": "a"}, durable=False)
    assert_row_is(row, assembled)
    assert load_state(Execution.objects.get(pk=row.pk)).children.map_progress == {}


def test_a_new_worker_row_costs_no_progress_row_before_its_first_result() -> None:
    # run_async writes a whole empty state (``{}`` results, ``[]`` log): the start of the
    # first pass drops them from the context without appending rows that set them empty
    execution = fresh_row(ExecutionState().to_json())
    state = ExecutionState.from_json(execution.context)
    ProgressStore(execution, state).write(state, {"current_step": "a"}, durable=True)
    assert not ExecutionProgress.objects.filter(execution=execution).exists()
    assert "progress_rows" not in execution.context
    assert_row_is(execution, state)


def test_deleting_an_execution_deletes_its_progress_rows() -> None:
    execution = fresh_row()
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    steps_written(store, state, 0, 3)
    assert ExecutionProgress.objects.filter(execution=execution).count() == 6
    Execution.objects.filter(pk=execution.pk).delete()  # as retention deletes a tree
    assert not ExecutionProgress.objects.filter(execution_id=execution.pk).exists()


def test_regression_a_map_named_with_a_non_ascii_character_keeps_its_elements() -> None:
    # SQLite matched the path ."ü" against the stored key text "\u00fc" and found nothing:
    # the second element of map "ü" was never appended (found by the property above)
    execution = fresh_row()
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    counter = [0]
    for _ in range(3):
        apply(state, "map_element", "ü", None, counter)
        store.write(state, {}, durable=False)
    assert_row_is(execution, state)
    assert len(state.children.progress()["ü"]["elements"]) == 3
    # a new key spelt escaped in its path was stored with the backslash itself ("\\u00fc1")
    apply(state, "result", "ü", 1, counter)
    store.write(state, {}, durable=False)
    assert_row_is(execution, state)


def test_regression_a_map_dropped_and_started_again_under_its_name() -> None:
    execution = fresh_row()
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    counter = [0]
    for kind in ("map_element", "write", "map_drop", "write", "map_element", "write"):
        if kind == "write":
            store.write(state, {}, durable=False)
        else:
            apply(state, kind, "m", 1, counter)
    assert_row_is(execution, state)


class SentBytes:
    """The sizes of what each write sends: the parameters and SQL of its statements on the
    execution and progress tables (one statement on PostgreSQL, two on SQLite)."""

    def __init__(self) -> None:
        self.statements = 0
        self.current = 0
        self.sizes: list[int] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        head = sql.split(" WHERE ")[0]
        if sql.startswith(("UPDATE", "WITH", "INSERT")) and "reactor_app_execution" in head:
            self.statements += 1
            self.current += len(sql) + sum(len(str(p)) for p in params or ())
        return execute(sql, params, many, context)

    def write_done(self) -> None:
        self.sizes.append(self.current)
        self.current = 0


def steps_written(store: ProgressStore, state: ExecutionState, start: int, count: int) -> None:
    payload = {"order": "x" * 200}
    for index in range(start, start + count):
        name = f"step{index:04d}"
        state.results[name] = payload
        state.completed.append(CompletedStep(name, "step", args={"i": index}, result=payload))
        state.next_index = index + 1
        store.write(state, {"current_step": name}, durable=False)


def test_a_checkpoint_sends_the_same_bytes_after_10_steps_as_after_1000() -> None:
    """A step's checkpoint carries its own result and log entry, not all before it."""
    execution = fresh_row()
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    sent = SentBytes()
    with connection.execute_wrapper(sent):
        for index in range(1000):
            steps_written(store, state, index, 1)
            sent.write_done()
    # one statement per write on PostgreSQL; an UPDATE and the rows' INSERT on SQLite
    assert sent.statements == (1000 if connection.vendor == "postgresql" else 2000)
    # every checkpoint after the first (which also writes the notes' keys) sends the same
    # size, up to the digits of the counters and timestamps (a whole context would grow by
    # ~500 bytes per step)
    assert max(sent.sizes[1:]) - min(sent.sizes[1:]) <= 16, (min(sent.sizes), max(sent.sizes))
    assert_row_is(execution, state)
    assert len(load_state(Execution.objects.get(pk=execution.pk)).results) == 1000
    # two progress rows per step (its result, its rollback-log entry)
    assert ExecutionProgress.objects.filter(execution=execution).count() == 2000


def wal_position() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint")
        return int(cursor.fetchone()[0])


def least_wal_per_write(store: ProgressStore, state: ExecutionState, start: int) -> int:
    """The least WAL one step's checkpoint wrote, of 15 in a row: the server's WAL is shared
    (other sessions' traffic only adds to a sample), so the least is this write's own."""
    least = None
    for index in range(start, start + 15):
        before = wal_position()
        steps_written(store, state, index, 1)
        used = wal_position() - before
        least = used if least is None else min(least, used)
    assert least is not None
    return least


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's WAL")
def test_a_checkpoint_writes_the_same_wal_after_10_steps_as_after_1000() -> None:
    """What the database writes per checkpoint, not only what is sent: a patch of a
    TOASTed ``context`` made PostgreSQL write the whole value again (~176 kB of WAL per step
    at 1,000 steps); an appended row is the step's own size, whatever came before."""
    execution = fresh_row()
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    steps_written(store, state, 0, 10)
    early = least_wal_per_write(store, state, 10)
    steps_written(store, state, 25, 1000 - 25)
    late = least_wal_per_write(store, state, 1000)
    # a whole 1,000-step context is ~500 kB (tens of kB compressed): far past this bound
    assert late <= early * 1.5 + 1024, (early, late)
    assert_row_is(execution, state)


def test_map_elements_are_appended_not_rewritten() -> None:
    execution = fresh_row()
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    entry = state.children.progress().setdefault(
        "lines", {"elements": [], "values": [], "index": 0}
    )
    sent = SentBytes()
    with connection.execute_wrapper(sent):
        for index in range(600):
            entry["elements"].append({"label": f"lines[{index:03d}]", "result": index % 10})
            entry["values"].append(index % 10)
            entry["index"] += 1
            if entry["index"] % 50 == 0:  # a batch of 50 elements per write
                store.write(state, {}, durable=False)
                sent.write_done()
    assert len(sent.sizes) == 12
    assert max(sent.sizes[1:]) - min(sent.sizes[1:]) <= 16, (min(sent.sizes), max(sent.sizes))
    assert_row_is(execution, state)


def test_a_write_with_a_superseded_claim_generation_writes_nothing() -> None:
    execution = fresh_row()
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    state.results["a"] = 1
    store.write(state, {}, durable=False)
    # another delivery claims the row and ends it
    claimed = Execution.objects.claim(execution.pk, (ExecutionStatus.RUNNING,))
    assert claimed is not None and claimed.claim_generation == execution.claim_generation + 1
    Execution.objects.filter(pk=execution.pk).update(status=ExecutionStatus.SUCCEEDED)
    state.results["b"] = 2
    with pytest.raises(ClaimLost):
        store.write(state, {"status": ExecutionStatus.FAILED}, durable=True)
    row = Execution.objects.get(pk=execution.pk)
    assert row.status == ExecutionStatus.SUCCEEDED
    assert load_state(row).results == {"a": 1}
    assert ExecutionProgress.objects.filter(execution=row).count() == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks of PostgreSQL")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server_default", ["read committed", "repeatable read", "serializable"])
def test_a_write_racing_a_claim_inserts_no_rows_once_the_claim_commits(
    server_default: str,
) -> None:
    """The claim of another delivery holds the row (not committed yet) when this delivery's
    checkpoint arrives: the checkpoint waits for the row, then sees the new generation and
    writes nothing — its progress rows included (they are inserted only by the statement
    whose conditional update matched).

    Whatever level the server runs single statements at (a database's or role's
    ``default_transaction_isolation``): above READ COMMITTED the waiting statement was aborted
    as a serialization failure, an ``OperationalError`` out of the checkpoint instead of the
    lost claim; it is sent again now (``managers._one_statement``)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SET SESSION default_transaction_isolation = '{server_default}'")
    try:
        _race_a_checkpoint_with_a_claim()
    finally:
        connection.close()  # the next test's connection starts at the server's default


def _race_a_checkpoint_with_a_claim() -> None:
    execution = fresh_row()
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    steps_written(store, state, 0, 1)
    claimed, release = threading.Event(), threading.Event()

    def other_delivery() -> None:
        try:
            with transaction.atomic():
                Execution.objects.claim(execution.pk, (ExecutionStatus.RUNNING,))
                claimed.set()
                release.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_delivery)
    thread.start()
    assert claimed.wait(10)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (me,) = cursor.fetchone()
    waiting: list[bool] = []

    def unblock_once_waiting() -> None:
        # commit the claim only once the checkpoint below waits for the row lock
        with connections["default"].cursor() as cursor:
            for _ in range(1000):
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE pid = %s AND wait_event_type = 'Lock'",
                    [me],
                )
                if cursor.fetchone()[0]:
                    waiting.append(True)
                    break
                time.sleep(0.01)
        connections.close_all()
        release.set()

    watcher = threading.Thread(target=unblock_once_waiting)
    watcher.start()
    with pytest.raises(ClaimLost):
        steps_written(store, state, 1, 1)
    watcher.join(10)
    thread.join(10)
    assert waiting == [True]  # the checkpoint did wait on the claim's row lock
    assert ExecutionProgress.objects.filter(execution=execution).count() == 2  # step 0 only
    assert len(load_state(Execution.objects.get(pk=execution.pk)).results) == 1


def test_the_claim_statement_returns_the_row_only_in_a_runnable_status() -> None:
    execution = fresh_row()
    claimed = Execution.objects.claim(execution.pk, (ExecutionStatus.RUNNING,))
    assert claimed is not None
    assert (claimed.pk, claimed.status, claimed.context) == (
        execution.pk,
        execution.status,
        execution.context,
    )
    assert claimed.claim_generation == 1
    assert Execution.objects.claim(execution.pk, (ExecutionStatus.PARKED,)) is None
    assert Execution.objects.get(pk=execution.pk).claim_generation == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks of PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_a_claim_that_waits_past_the_project_s_lock_timeout_is_sent_again() -> None:
    """A project may set PostgreSQL's ``lock_timeout`` (here 200 ms on this connection). A
    claim statement that waits longer than that for the row — held by another delivery's
    transaction for 0.35 s — is cancelled by the server, and was an
    ``OperationalError`` out of the delivery (found running the worker suite with a
    ``lock_timeout`` of 1 s). An aborted single statement wrote nothing: it is sent again, and
    claims the row once the other transaction ends."""
    execution = fresh_row()
    holding = threading.Event()
    committing: list[float] = []

    def other_delivery() -> None:
        try:
            with transaction.atomic():
                list(Execution.objects.select_for_update().filter(pk=execution.pk))
                holding.set()
                time.sleep(0.35)
                # the row lock is held until the commit below: a claim that waited for it ends
                # after this moment (a flag set after the commit raced the claim: CI)
                committing.append(time.monotonic())
        finally:
            connections.close_all()

    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '200ms'")
    thread = threading.Thread(target=other_delivery)
    thread.start()
    try:
        assert holding.wait(10)
        claimed = Execution.objects.claim(execution.pk, (ExecutionStatus.RUNNING,))
        claimed_at = time.monotonic()
        assert committing and claimed_at > committing[0]  # it waited the other transaction out
        assert claimed is not None and claimed.claim_generation == execution.claim_generation + 1
    finally:
        thread.join(10)
        connection.close()  # the next test's connection has no lock_timeout
