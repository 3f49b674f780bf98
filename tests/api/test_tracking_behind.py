"""Tracking written behind the work: what a caller waits for, and what readers see.

* ``Step.call`` waits for no database statement; an in-process run waits for a number of
  statements that does not grow with its steps (counted on the caller's thread).
* A step slower than the freshness bound shows ``started`` in the API while it runs.
* After a run, its events are all there, stamped when they happened — not when written — on
  success, failure and when a signal receiver raises; a ``Step.call``'s within the freshness
  bound; a process that exits right after its work still wrote them (``atexit``).

Transactional tests: rows written from inside a test's transaction would be written at once,
in it (``reactor_app.write_behind``), which is not the path under test here.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from reactor_app import Reactor, Step, Success, signals, step, with_lock
from reactor_app.models import CoordinationEvent, StepRun
from reactor_app.testing import within_freshness_bound
from reactor_app.write_behind import get_writer
from tests.renewing import KEPT_LEASE, wait_for_rounds

pytestmark = pytest.mark.django_db(transaction=True)


def without_transaction_control(captured: CaptureQueriesContext) -> list[str]:
    """The statements captured, without ``BEGIN``/``COMMIT``/savepoints (SQLite's transaction
    around a checkpoint and the progress rows it appends)."""
    control = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")
    return [q["sql"] for q in captured.captured_queries if not q["sql"].startswith(control)]


#: a write of the execution row: an UPDATE, or (appending progress rows on PostgreSQL) one
#: ``WITH claimed AS (UPDATE ...) INSERT ...``, or (a final write carrying the pass's history
#: on PostgreSQL) one ``WITH leading_0 AS (INSERT ...), ... UPDATE ...``
EXECUTION_UPDATES = (
    'UPDATE "reactor_app_execution"',
    'WITH claimed AS (UPDATE "reactor_app_execution"',
    "WITH leading_0 AS (INSERT INTO ",
)

API = "/api/reactor"


def stamp() -> datetime:
    from django.utils import timezone

    return timezone.now()


@with_lock(lambda args: "behind:call", ttl=30)
class LockedNoop(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(context.fencing_token())


def locked_step(n: int) -> Any:
    """A no-op step class holding its own lock (one key per position in the run)."""

    @with_lock(lambda args: f"behind:step:{n}", ttl=30)
    class Locked(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success(n)

    Locked.__qualname__ = f"Locked{n}"
    return Locked


class OneLockedStep(Reactor):
    s0 = step(locked_step(0))


class TenLockedSteps(Reactor):
    s0 = step(locked_step(0))
    s1 = step(locked_step(1))
    s2 = step(locked_step(2))
    s3 = step(locked_step(3))
    s4 = step(locked_step(4))
    s5 = step(locked_step(5))
    s6 = step(locked_step(6))
    s7 = step(locked_step(7))
    s8 = step(locked_step(8))
    s9 = step(locked_step(9))


# -- what a caller waits for ------------------------------------------------------------------


def test_step_call_waits_for_no_database_statement() -> None:
    assert LockedNoop.call().ok  # warm: the first call may start the writer thread
    with CaptureQueriesContext(connection) as caller:
        outcome = LockedNoop.call()
    assert outcome.ok
    assert [q["sql"] for q in caller.captured_queries] == []
    # its history is still written, behind the call
    assert within_freshness_bound(
        lambda: (
            CoordinationEvent.objects.filter(key="behind:call", token=outcome.value).count() == 2
        )
    )


def test_an_in_process_run_waits_for_as_many_statements_with_ten_steps_as_with_one(
    settings: Any,
) -> None:
    # A long freshness bound: the writer thread stays out of the way, so everything the runs
    # wrote was written by the caller (at the end of the run) or is counted as missing below.
    settings.REACTOR_TRACKING_FLUSH_INTERVAL = 60.0
    assert OneLockedStep.run().ok  # warm
    with CaptureQueriesContext(connection) as one:
        first = OneLockedStep.run()
    with CaptureQueriesContext(connection) as ten:
        second = TenLockedSteps.run()
    assert first.ok and second.ok
    statements_one = [q["sql"] for q in one.captured_queries]
    statements_ten = [q["sql"] for q in ten.captured_queries]
    assert len(statements_ten) == len(statements_one), (statements_one, statements_ten)
    assert len(statements_one) <= 10, statements_one
    # the execution row: inserted already running at the start, updated once at the finish
    # (with its progress rows: ``WITH claimed AS (UPDATE ...) INSERT ...`` on PostgreSQL)
    row_writes = [
        "UPDATE" if sql.startswith(EXECUTION_UPDATES) else sql.split()[0]
        for sql in statements_one
        if '"reactor_app_execution"' in sql and sql.split()[0] in ("INSERT", "UPDATE", "WITH")
    ]
    assert row_writes == ["INSERT", "UPDATE"], statements_one
    # and nothing was skipped: every step run and event of the ten steps is there
    assert (
        StepRun.objects.filter(execution_id=second.execution_id, status="succeeded").count() == 10
    )
    events = CoordinationEvent.objects.filter(execution_id=second.execution_id)
    assert events.filter(kind="acquired").count() == 10
    assert events.filter(kind="released").count() == 10


# -- what readers see -------------------------------------------------------------------------


@pytest.fixture
def slow_run() -> Iterator[tuple[threading.Event, dict[str, Any]]]:
    """A run whose only step waits for ``release`` (set by the test) in another thread."""
    release = threading.Event()
    seen: dict[str, Any] = {}

    class Slow(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            seen["execution"] = context.execution_id
            seen["entered"] = stamp()
            release.wait(30)
            return Success(None)

    class SlowReactor(Reactor):
        slow = step(Slow)

    def run() -> None:
        try:
            seen["before"] = stamp()
            seen["result"] = SlowReactor.run()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield release, seen
    finally:
        release.set()
        thread.join(30)


def test_a_step_slower_than_the_freshness_bound_shows_started_while_it_runs(
    staff_client: Client, slow_run: tuple[threading.Event, dict[str, Any]]
) -> None:
    release, seen = slow_run
    execution = within_freshness_bound(lambda: seen.get("execution"), timeout=10)
    assert execution

    def running_in_api() -> list[dict[str, Any]]:
        body = staff_client.get(f"{API}/executions/{execution}/").json()
        return [r for r in body.get("step_runs", []) if r["status"] == "started"]

    (live,) = within_freshness_bound(running_in_api)
    assert live["step"] == "slow" and live["finished_at"] is None
    # stamped when the step started, not when the row was written (after the body began):
    # between the call and the body, however long either took on a loaded machine
    started_at = datetime.fromisoformat(live["started_at"].replace("Z", "+00:00"))
    assert seen["before"] <= started_at <= seen["entered"], (seen, started_at)
    release.set()
    assert within_freshness_bound(lambda: seen.get("result"), timeout=30).ok
    (done,) = StepRun.objects.filter(execution_id=execution)
    assert done.status == "succeeded" and done.finished_at is not None


BODY_SECONDS = 0.4


@pytest.mark.parametrize("fails", [False, True], ids=["success", "failure"])
def test_a_runs_events_are_all_there_when_it_ends_with_their_true_times(fails: bool) -> None:
    times: dict[str, datetime] = {}

    @with_lock(lambda args: "behind:timed", ttl=30)
    class Timed(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            times["body_start"] = stamp()
            time.sleep(BODY_SECONDS)
            times["body_end"] = stamp()
            if fails:
                raise RuntimeError("the body failed")
            return Success(None)

    class TimedReactor(Reactor):
        timed = step(Timed)

    result = TimedReactor.run()
    assert result.ok is not fails
    # read at once: the end of the run wrote its history before the result came back
    events = {e.kind: e for e in CoordinationEvent.objects.filter(execution_id=result.execution_id)}
    assert set(events) == {"acquired", "released"}
    assert events["acquired"].at <= times["body_start"]
    assert events["released"].at >= times["body_end"]
    assert (events["released"].at - events["acquired"].at).total_seconds() >= BODY_SECONDS
    assert events["released"].detail["outcome"] == ("failure" if fails else "success")
    (run,) = StepRun.objects.filter(execution_id=result.execution_id)
    assert run.status == ("failed" if fails else "succeeded")
    assert run.started_at <= times["body_start"] and run.finished_at >= times["body_end"]


def test_a_raising_signal_receiver_loses_no_event() -> None:
    def broken(**payload: Any) -> None:
        raise RuntimeError("a broken receiver")

    signals.acquired.connect(broken)
    try:
        result = OneLockedStep.run()
    finally:
        signals.acquired.disconnect(broken)
    assert result.ok
    kinds = set(
        CoordinationEvent.objects.filter(execution_id=result.execution_id).values_list(
            "kind", flat=True
        )
    )
    assert kinds == {"acquired", "released"}


def test_a_step_calls_events_keep_their_true_times() -> None:
    before = stamp()
    outcome = LockedNoop.call()
    after = stamp()
    events = within_freshness_bound(
        lambda: (
            list(CoordinationEvent.objects.filter(key="behind:call", token=outcome.value))
            if CoordinationEvent.objects.filter(key="behind:call", token=outcome.value).count() == 2
            else []
        )
    )
    assert sorted(e.kind for e in events) == ["acquired", "released"]
    assert all(before <= e.at <= after for e in events)  # stamped during the call


def test_a_process_exiting_right_after_its_work_still_writes_its_rows(
    subprocess_env: Callable[..., dict[str, str]],
) -> None:
    script = textwrap.dedent(
        """
        import django
        django.setup()
        from django.conf import settings
        from reactor_app import Step, Success, with_lock

        # the writer thread would not write for a minute: only the exit can
        settings.REACTOR_TRACKING_FLUSH_INTERVAL = 60.0

        @with_lock(lambda args: "behind:exit", ttl=30)
        class Quick(Step):
            def run(self, args, context):
                return Success(None)

        assert Quick.call().ok
        # exits at once: the freshness bound has not passed, atexit writes the rows
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=subprocess_env(),
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    kinds = sorted(
        CoordinationEvent.objects.filter(key="behind:exit").values_list("kind", flat=True)
    )
    assert kinds == ["acquired", "released"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a session the database server ends")
def test_regression_a_flush_that_finds_its_connection_lost_writes_its_rows_again(
    settings: Any,
) -> None:
    """A database that restarts, or ends the session, between two flushes: the bulk write
    fails on the lost connection, and so did each row written one by one after it, on the
    same connection — the whole flush was dropped ("dropped tracking row" for every row).
    Now the lost connection is closed first, and the rows one by one connect again."""
    import psycopg

    settings.REACTOR_TRACKING_FLUSH_INTERVAL = 60.0  # the writer thread stays out of it
    writer = get_writer()
    writer.flush()
    outcome = LockedNoop.call()
    assert writer.pending >= 2
    connection.ensure_connection()
    session = connection.connection.info.backend_pid
    params = connection.get_connection_params()
    with psycopg.connect(**{**params, "autocommit": True}) as other:
        other.execute("SELECT pg_terminate_backend(%s)", (session,))
    assert writer.flush() >= 2
    assert CoordinationEvent.objects.filter(key="behind:call", token=outcome.value).count() == 2


def test_rows_wait_in_the_buffer_for_the_writer_not_the_caller(settings: Any) -> None:
    """The write-behind path itself: rows are buffered at once and written by the writer
    thread within the freshness bound, not by the caller."""
    settings.REACTOR_TRACKING_FLUSH_INTERVAL = 2.0  # long enough to look before the writer
    writer = get_writer()
    writer.flush()
    outcome = LockedNoop.call()
    assert writer.pending >= 2  # both events wait for the writer...
    assert not CoordinationEvent.objects.filter(token=outcome.value, key="behind:call").exists()
    started = time.monotonic()
    assert within_freshness_bound(
        lambda: (
            CoordinationEvent.objects.filter(key="behind:call", token=outcome.value).count() == 2
        )
    )
    waited = time.monotonic() - started
    assert waited < 2.0 + 1.5  # ...which writes them within the bound (plus scheduling)


def test_the_writer_leaves_the_database_alone_when_another_flush_took_its_rows(
    settings: Any, connection_checks: list[str]
) -> None:
    """A flush on another thread (a test's teardown, after which the test has no database
    access) may take the rows the writer thread woke up for. The writer must then not touch
    the database at all: it used to check its connection first and log a failed flush."""
    from reactor_app.tracking import record_coordination

    settings.REACTOR_TRACKING_FLUSH_INTERVAL = 1.0  # this thread takes the rows well before
    writer = get_writer()
    writer.flush()
    for attempt in range(2):
        record_coordination("acquired", primitive="lock", key=f"behind:taken:{attempt}", owner="")
        time.sleep(0.05)  # the writer thread wakes and waits out the flush interval
        assert writer.flush() == 1  # ...while this thread takes the row
        time.sleep(1.2)  # past the interval: the writer wakes for a row that is gone
    assert connection_checks == [], connection_checks
    assert CoordinationEvent.objects.filter(key__startswith="behind:taken:").count() == 2


def test_without_the_flush_on_finish_a_run_waits_for_none_of_its_history(settings: Any) -> None:
    settings.REACTOR_TRACKING_FLUSH_ON_FINISH = False
    assert OneLockedStep.run().ok  # warm
    with CaptureQueriesContext(connection) as caller:
        result = TenLockedSteps.run()
    assert result.ok
    statements = without_transaction_control(caller)
    # the execution row at start and at the end: nothing per step, no history at all
    assert not [s for s in statements if "steprun" in s or "coordinationevent" in s], statements
    # (SQLite appends the run's progress rows in an INSERT of their own, PostgreSQL in the
    # final write's statement)
    appended = [s for s in statements if s.startswith('INSERT INTO "reactor_app_executionprog')]
    assert len(appended) <= 1 and len(statements) - len(appended) <= 3, statements

    def history() -> tuple[int, ...]:
        runs = StepRun.objects.filter(execution_id=result.execution_id, status="succeeded")
        events = CoordinationEvent.objects.filter(execution_id=result.execution_id)
        found = (runs.count(), events.count())
        return found if found == (10, 20) else ()

    assert within_freshness_bound(history) == (10, 20)
    # the final write was not undone by a late progress write
    from reactor_app.models import Execution

    assert Execution.objects.get(pk=result.execution_id).current_step == ""


def test_extended_events_keep_the_time_of_their_renewal() -> None:
    @with_lock(lambda args: "behind:renewed", ttl=KEPT_LEASE)
    class Long(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            wait_for_rounds(2)  # renewed every KEPT_LEASE / 3
            time.sleep(0.2)
            return Success(None)

    class LongReactor(Reactor):
        long = step(Long)

    result = LongReactor.run()
    assert result.ok, result.error
    events = list(CoordinationEvent.objects.filter(execution_id=result.execution_id))
    (released,) = [e for e in events if e.kind == "released"]
    extended = sorted(e.at for e in events if e.kind == "extended")
    assert len(extended) >= 2, events
    # recorded together when the step ended, yet stamped when each renewal happened: a
    # renewal interval apart, the release later still
    assert (extended[-1] - extended[0]).total_seconds() > 0.1, extended
    assert released.at > extended[-1], (released.at, extended)
    assert extended == sorted(set(extended))


def test_a_worker_delivery_checkpoints_once_per_completed_step() -> None:
    """A delivery, run here by calling the task's body (no Celery, no eager mode: the worker
    path itself). Each completed step costs it one statement — the checkpoint a redelivery
    resumes from — and its step runs and events are written in bulk at the end."""
    from reactor_app.engine.dispatch import deliver
    from reactor_app.models import Execution

    def delivered(reactor: type[Reactor]) -> tuple[list[str], str]:
        execution = Execution.objects.start(
            reactor=reactor.path(), inputs={}, status="pending", context={"worker": True}
        )
        with CaptureQueriesContext(connection) as caller:
            summary = deliver(str(execution.pk))
        assert summary["outcome"] == "succeeded", summary
        return without_transaction_control(caller), str(execution.pk)

    delivered(OneLockedStep)  # warm
    one, _ = delivered(OneLockedStep)
    ten, ten_id = delivered(TenLockedSteps)
    extra = len(ten) - len(one)
    # a checkpoint appends the step's progress rows: in its own statement on PostgreSQL, in
    # an INSERT after it on SQLite
    per_step = 1 if connection.vendor == "postgresql" else 2
    assert extra == 9 * per_step, (one, ten)
    checkpoints = [s for s in ten if s.startswith(EXECUTION_UPDATES)]
    assert len(checkpoints) - len([s for s in one if s.startswith(EXECUTION_UPDATES)]) == 9
    # the history is there when the delivery returns
    assert StepRun.objects.filter(execution_id=ten_id, status="succeeded").count() == 10
    assert CoordinationEvent.objects.filter(execution_id=ten_id).count() == 20


@pytest.fixture(params=["copy", "insert"])
def bulk_path(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both bulk paths: ``COPY`` on PostgreSQL (from ``COPY_FROM`` rows; multi-row INSERT
    elsewhere), and a multi-row INSERT (fewer rows than that)."""
    from reactor_app import tracking_store

    monkeypatch.setattr(tracking_store, "COPY_FROM", 1 if request.param == "copy" else 10**6)
    return str(request.param)


def test_events_written_in_bulk_keep_every_character_and_value(bulk_path: str) -> None:
    """The writer's bulk path (``COPY`` on PostgreSQL, multi-row INSERT elsewhere) stores
    keys, owners and details exactly: tabs, newlines, backslashes and quotes (which COPY's text
    format must escape), non-ASCII text, nested JSON, big tokens and absent values."""
    from reactor_app.tracking import flush, record_coordination

    awkward = 'tab\there\nnew\\line "quoted" ünïcode ✓ \\N'
    record_coordination(
        "acquired",
        primitive="lock",
        key=f"bulk:{awkward}",
        owner=f"owner {awkward}",
        step="Bulk",
        token=2**62 + 7,
        detail_text=awkward,
        nested={"list": [1, 2.5, None, "x"], "flag": True},
    )
    record_coordination("released", primitive="lock", key="bulk:plain", owner="")
    flush()
    first = CoordinationEvent.objects.get(key=f"bulk:{awkward}")
    assert first.owner == f"owner {awkward}"
    assert first.step == "Bulk" and first.reactor == "" and first.execution_id is None
    assert first.token == 2**62 + 7
    assert first.detail == {
        "detail_text": awkward,
        "nested": {"list": [1, 2.5, None, "x"], "flag": True},
    }
    second = CoordinationEvent.objects.get(key="bulk:plain")
    assert second.token is None and second.owner == "" and second.detail == {}


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SQLite does not enforce a column's length"
)
@pytest.mark.parametrize("commit_behind", [False, True])
def test_a_key_too_long_for_its_column_is_refused_never_cut_short(commit_behind: bool) -> None:
    """The statement that commits behind (``INSERT ... SELECT ... FROM (VALUES ...)``) states
    each value's type; a ``varchar(n)`` stated there would cut a longer key to ``n``
    characters without a word, where a plain ``INSERT ... VALUES`` refuses it. Both refuse."""
    from django.db import DataError
    from django.utils import timezone

    from reactor_app.tracking_store import _insert

    too_long = "k" * 600  # CoordinationEvent.key holds 512
    row = (None, "", "", "lock", too_long, "acquired", "", None, timezone.now(), {})
    with pytest.raises(DataError):
        _insert(CoordinationEvent, [row], returning=False, commit_behind=commit_behind)
    assert not CoordinationEvent.objects.filter(key__startswith="kkkk").exists()


def test_small_details_that_compare_equal_keep_their_own_json(bulk_path: str) -> None:
    """The writer keeps the JSON text of the small details that recur in nearly every row;
    details equal as Python keys but not as JSON (``1`` and ``True``, ``1`` and ``1.0``) or
    holding a container keep their own text, written back as they were (on PostgreSQL through
    ``COPY``, where that text is used)."""
    from reactor_app.tracking import flush, record_coordination

    details: list[dict[str, Any]] = [
        {"reentrant": True},
        {"reentrant": 1},
        {"reentrant": 1.0},
        {"reentrant": "1"},
        {"reentrant": None},
        {"reentrant": [True]},
        {"outcome": "success"},
        {"outcome": "success", "reentrant": False},
    ]
    for round_ in range(2):  # the second round meets the kept texts
        for index, detail in enumerate(details):
            record_coordination(
                "acquired", primitive="lock", key=f"small:{round_}:{index}", owner="o", **detail
            )
        flush()
    for round_ in range(2):
        stored = [
            CoordinationEvent.objects.get(key=f"small:{round_}:{index}").detail
            for index in range(len(details))
        ]
        assert stored == details
        assert [type(d["reentrant"]) for d in stored if "reentrant" in d] == [
            bool,
            int,
            float,
            str,
            type(None),
            list,
            bool,
        ]


# -- flushes and the caller's transaction ------------------------------------------------------


def _short_lock_waits() -> None:
    """This thread's connection gives up a lock wait after 3 s instead of the busy timeout (a
    deadlock, if the code under test had one, then ends the test in seconds, not hangs it)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET lock_timeout = '3s'")
        elif connection.vendor == "sqlite":
            cursor.execute("PRAGMA busy_timeout = 3000")


def test_a_flush_inside_a_transaction_never_waits_for_a_flush_waiting_on_that_transaction(
    settings: Any,
) -> None:
    """The writer's flush can be stuck on a lock the caller's transaction holds — SQLite's
    write lock, or an execution row locked FOR UPDATE that its rows reference on PostgreSQL. A
    row recorded inside that transaction must not wait for that flush in turn (each would wait
    for the other; on SQLite until the busy timeout, failing every other writer meanwhile):
    it is left to the writer, and no row of either side is lost."""
    from django.db import transaction
    from django.utils import timezone

    from reactor_app.models import Execution
    from reactor_app.tracking import record_coordination

    settings.REACTOR_TRACKING_FLUSH_INTERVAL = 60  # only the flushes below write
    execution = Execution.objects.start(reactor="behind.Deadlock", inputs={})
    writer = get_writer()
    writer.flush()
    locked, errors = threading.Event(), []
    took: dict[str, float] = {}

    def record(key: str) -> None:
        record_coordination("acquired", primitive="lock", key=key, execution_id=execution.pk)

    def flush_on_the_side() -> None:
        # the writer's part: a flush of a row that references the locked execution
        try:
            _short_lock_waits()
            record("behind:deadlock:outside")
            assert locked.wait(10)
            writer.flush()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    def transaction_side() -> None:
        try:
            _short_lock_waits()
            with transaction.atomic():
                Execution.objects.select_for_update().get(pk=execution.pk)
                Execution.objects.filter(pk=execution.pk).update(heartbeat_at=timezone.now())
                locked.set()
                deadline = time.monotonic() + 10
                while writer.pending and time.monotonic() < deadline:
                    time.sleep(0.01)  # the other flush has taken the buffer...
                time.sleep(0.3)  # ...and waits for this transaction's lock
                started = time.monotonic()
                record("behind:deadlock:inside")
                took["inside"] = time.monotonic() - started
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=flush_on_the_side),
        threading.Thread(target=transaction_side),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert took["inside"] < 1.0, took  # it did not wait for the stuck flush
    writer.flush()
    keys = set(
        CoordinationEvent.objects.filter(execution_id=execution.pk).values_list("key", flat=True)
    )
    assert keys == {"behind:deadlock:outside", "behind:deadlock:inside"}


@contextlib.contextmanager
def flush_in_flight() -> Iterator[threading.Event]:
    """Another thread holds the writer's flush lock, as a flush in flight does, until the
    yielded event is set (or the block ends)."""
    writer = get_writer()
    held, let_go = threading.Event(), threading.Event()

    def hold() -> None:
        with writer.turn():
            held.set()
            let_go.wait(10)

    other = threading.Thread(target=hold)
    other.start()
    assert held.wait(10)
    try:
        yield let_go
    finally:
        let_go.set()
        other.join(10)


def assert_history_of_one_locked_step(result: Any) -> None:
    assert result.ok
    runs = StepRun.objects.filter(execution_id=result.execution_id, status="succeeded")
    assert runs.count() == 1
    assert CoordinationEvent.objects.filter(execution_id=result.execution_id).count() == 2


def test_a_runs_final_write_waits_for_a_flush_in_flight_and_carries_its_history(
    settings: Any,
) -> None:
    """A run's final write flushes the buffer first, outside any transaction of its own (so it
    never holds the database while it waits for another flush): a flush in flight on another
    thread delays it, and its history is still written before it — there when ``run``
    returns."""
    settings.REACTOR_TRACKING_FLUSH_INTERVAL = 60  # only the final write writes
    get_writer().flush()
    with flush_in_flight() as let_go:
        threading.Timer(0.3, let_go.set).start()
        result = OneLockedStep.run()
    assert_history_of_one_locked_step(result)


def test_a_run_inside_a_callers_transaction_keeps_its_history_beside_a_flush_in_flight(
    settings: Any,
) -> None:
    """Rows recorded inside a caller's transaction go into that transaction, not the buffer:
    left to the writer thread, they would be written from its own connection before the
    commit — pointing to an execution row it cannot see yet (PostgreSQL drops them as foreign
    key violations) — whenever a flush happened to be in flight as the run ended."""
    from django.db import transaction

    settings.REACTOR_TRACKING_FLUSH_INTERVAL = 0.1
    get_writer().flush()
    with flush_in_flight() as let_go, transaction.atomic():
        result = OneLockedStep.run()
        let_go.set()
        time.sleep(0.5)  # several freshness bounds with the transaction still open
    # no flush needed: the rows committed with the transaction
    assert_history_of_one_locked_step(result)


def test_a_transaction_that_rolls_back_takes_none_of_the_buffers_rows_with_it(
    settings: Any,
) -> None:
    """The buffer holds other work's rows (recorded outside any transaction); a flush asked
    for inside some thread's transaction must not carry them into it, or its rollback
    silently loses them."""
    from django.db import transaction

    settings.REACTOR_TRACKING_FLUSH_INTERVAL = 60  # only the flushes below write
    writer = get_writer()
    writer.flush()
    outcome = LockedNoop.call()  # its two events wait in the buffer
    assert writer.pending >= 2
    errors: list[BaseException] = []

    class Rollback(Exception):
        pass

    def rolled_back() -> None:
        try:
            with transaction.atomic():
                writer.flush()
                raise Rollback
        except Rollback:
            pass
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=rolled_back)
    thread.start()
    thread.join(30)
    assert errors == []
    writer.flush()
    kinds = CoordinationEvent.objects.filter(key="behind:call", token=outcome.value)
    assert sorted(kinds.values_list("kind", flat=True)) == ["acquired", "released"]


def test_a_final_write_that_fails_rolls_back_no_other_works_rows(settings: Any) -> None:
    """A run's final write flushes the buffer first — which also holds other work's rows. The
    buffer commits on its own: a final write that then fails (here: the run's row was
    deleted while it ran) must not take those rows down with it."""
    from reactor_app.models import Execution

    settings.REACTOR_TRACKING_FLUSH_INTERVAL = 60  # only the flushes below write
    writer = get_writer()
    writer.flush()
    outcome = LockedNoop.call()  # another piece of work: its two events wait in the buffer

    class Vanishing(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            Execution.objects.filter(pk=context.execution_id).delete()
            return Success(None)

    class Doomed(Reactor):
        only = step(Vanishing)

    with pytest.raises(Exception, match="did not affect any rows"):
        Doomed.run()
    writer.flush()
    kinds = CoordinationEvent.objects.filter(key="behind:call", token=outcome.value)
    assert sorted(kinds.values_list("kind", flat=True)) == ["acquired", "released"]
