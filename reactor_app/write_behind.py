"""Write-behind of tracking rows: coordination events and step runs leave the caller's path.

The protected work must not wait on the database between admission and body, or between body
and release (docs/operations.md, "Tracking is written behind the work"). ``tracking`` hands its
rows to the process's one ``TrackingWriter``, which keeps them in memory and writes them in bulk
from a daemon thread:

* **freshness bound** — a row is written at most ``REACTOR_TRACKING_FLUSH_INTERVAL`` seconds
  (default 0.25) after it was buffered, so a slow step shows ``started`` in the admin while it
  still runs, and its events trail it by at most that much;
* **size bound** — ``REACTOR_TRACKING_BUFFER_SIZE`` buffered rows wake the writer at once;
* **true timestamps** — rows are stamped when the event happens, never when they are written.

A step run is one ``PendingStepRun``: its *started* write and its closing write mutate the same
pending row under the writer's lock; both are coalesced into one INSERT when the flush comes
after the close, otherwise the close becomes an UPDATE of the row the earlier flush inserted.

``flush()`` writes everything buffered on the calling thread (serialised with the writer
thread). It runs at interpreter exit (``atexit``), at Celery worker shutdown, when a worker
delivery ends and — unless ``REACTOR_TRACKING_FLUSH_ON_FINISH`` is off — when an in-process run
ends (so a ``Result`` reader sees its rows), and whenever the caller is inside a database
transaction: rows written from inside ``transaction.atomic`` ride in that transaction (a
background connection could neither see the uncommitted execution row nor, on SQLite, write
while the transaction holds the lock); whatever else was buffered in the process rides along.

A hard crash (SIGKILL, power loss) loses what was buffered: at most one freshness bound of rows
(or one buffer's worth) of that process. Executions themselves are never written behind.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
from typing import Any

from django.db import close_old_connections, connections, transaction

from reactor_app.conf import reactor_settings
from reactor_app.models import CoordinationEvent, Execution, StepRun
from reactor_app.serialization import _Encoder, to_json
from reactor_app.status import ExecutionStatus

logger = logging.getLogger(__name__)

#: seconds without a row after which the writer thread closes its database connection
IDLE_CLOSE_AFTER = 1.0

#: below this many buffered rows the size bound is not even read (a settings read per row
#: would cost the caller more than the row)
MIN_SIZE_CHECK = 64

#: the fields of a step run its closing write changes (the UPDATE of an already-written row)
STEP_CLOSING_FIELDS = ("status", "finished_at", "error", "detail")


class PendingStepRun:
    """One step run on its way to the database; mutate it only through ``TrackingWriter``."""

    __slots__ = ("fields", "pk", "queued")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.pk: int | None = None  # set once a flush inserted the row
        self.queued = False


class TrackingWriter:
    """The per-process buffer of tracking rows and its background writer thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        #: one flush at a time, so a step run is inserted before its update is written
        self._flushing = threading.Lock()
        #: field dicts of ``CoordinationEvent`` rows, ``detail`` not yet made JSON
        self._events: list[dict[str, Any]] = []
        self._steps: list[PendingStepRun] = []
        #: execution pk -> progress fields (``current_step``) of an in-process run, latest wins
        self._progress: dict[Any, dict[str, Any]] = {}
        self._oldest: float | None = None  # monotonic time the oldest buffered row arrived
        self._thread: threading.Thread | None = None
        #: callers waiting for the writer thread to let go of its database connection
        self._release: list[threading.Event] = []
        self._pid = os.getpid()
        #: rows written so far (by any thread); tests and the benchmark read it
        self.written = 0

    # -- the caller's side ------------------------------------------------------------------

    def add_event(self, fields: dict[str, Any]) -> None:
        """Buffer one ``CoordinationEvent`` row (its fields; ``detail`` made JSON when written)."""
        with self._lock:
            self._events.append(fields)
            self._arrived()
        self._after_add()

    def update_step(self, pending: PendingStepRun, **fields: Any) -> None:
        """Apply ``fields`` to ``pending`` and queue it for the next flush."""
        with self._lock:
            pending.fields.update(fields)
            if not pending.queued:
                pending.queued = True
                self._steps.append(pending)
            self._arrived()
        self._after_add()

    def update_execution(self, pk: Any, **fields: Any) -> None:
        """Progress of an in-process run (its current step), written behind like its steps."""
        with self._lock:
            self._progress.setdefault(pk, {}).update(fields)
            self._arrived()
        self._after_add()

    def forget_progress(self, pk: Any) -> None:
        """Drop an execution's buffered progress: a final write of its row supersedes it. A
        flush in flight is waited for, so its progress write cannot land after that one."""
        with self._flushing, self._lock:
            self._progress.pop(pk, None)

    def _arrived(self) -> None:
        # called with the lock held
        if self._oldest is None:
            self._oldest = time.monotonic()
            self._wake.notify()
        elif (size := self._size()) >= MIN_SIZE_CHECK and (
            size >= reactor_settings.TRACKING_BUFFER_SIZE
        ):
            self._wake.notify()

    def _size(self) -> int:
        return len(self._events) + len(self._steps) + len(self._progress)

    def _after_add(self) -> None:
        if transaction.get_connection().in_atomic_block:
            # Inside the caller's transaction: the rows belong to it (see the module docstring).
            self.flush()
        elif self._thread is None:
            self._start()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="reactor-tracking-writer", daemon=True
                )
                self._thread.start()

    @property
    def pending(self) -> int:
        """Rows buffered and not yet written."""
        with self._lock:
            return len(self._events) + len(self._steps) + len(self._progress)

    # -- writing ----------------------------------------------------------------------------

    def flush(self, *, finishing: Any = None) -> int:
        """Write every buffered row now, on the calling thread; the number of rows written.

        ``finishing``: the pk of an execution whose final write follows at once (its buffered
        progress is dropped, that write supersedes it)."""
        with self._flushing:
            with self._lock:
                events, self._events = self._events, []
                steps, self._steps = self._steps, []
                progress, self._progress = self._progress, {}
                progress.pop(finishing, None)
                self._oldest = None
                # a consistent copy of each step run: its owner may change it right after
                snapshot = [(pending, pending.pk, dict(pending.fields)) for pending in steps]
                for pending in steps:
                    pending.queued = False
            if not events and not snapshot and not progress:
                return 0
            written = self._write(events, snapshot, progress)
            self.written += written
            return written

    def _write(
        self,
        raw_events: list[dict[str, Any]],
        snapshot: list[tuple[PendingStepRun, int | None, dict[str, Any]]],
        progress: dict[Any, dict[str, Any]],
    ) -> int:
        new_steps = [(pending, fields) for pending, pk, fields in snapshot if pk is None]
        updates = [
            StepRun(pk=pk, **{name: _jsonable(fields)[name] for name in STEP_CLOSING_FIELDS})
            for _, pk, fields in snapshot
            if pk is not None
        ]
        try:
            with transaction.atomic():
                if raw_events:
                    _insert(CoordinationEvent, raw_events, returning=False)
                if new_steps:
                    pks = _insert(StepRun, [fields for _, fields in new_steps], returning=True)
                if updates:
                    StepRun.objects.bulk_update(updates, STEP_CLOSING_FIELDS)
                for pk, fields in progress.items():
                    _running(pk).update(**fields)
        except Exception:
            # One bad row (its execution deleted meanwhile...) must not cost the others.
            logger.warning("bulk write of tracking rows failed; writing them one by one")
            events = [CoordinationEvent(**_jsonable(fields)) for fields in raw_events]
            inserts = [(pending, StepRun(**_jsonable(fields))) for pending, fields in new_steps]
            return self._write_one_by_one(events, inserts, updates, progress)
        if new_steps:
            for (pending, _), pk in zip(new_steps, pks, strict=True):
                pending.pk = pk
        return len(raw_events) + len(new_steps) + len(updates) + len(progress)

    def _write_one_by_one(
        self,
        events: list[CoordinationEvent],
        inserts: list[tuple[PendingStepRun, StepRun]],
        updates: list[StepRun],
        progress: dict[Any, dict[str, Any]],
    ) -> int:
        written = 0
        for pk, fields in progress.items():
            try:
                written += _running(pk).update(**fields)
            except Exception:
                logger.exception("dropped progress %r of execution %s", fields, pk)
        rows: list[tuple[PendingStepRun | None, StepRun | CoordinationEvent, bool]] = [
            *((None, event, False) for event in events),
            *((pending, row, False) for pending, row in inserts),
            *((None, row, True) for row in updates),
        ]
        for pending, row, is_update in rows:
            try:
                with transaction.atomic():
                    if is_update:
                        row.save(update_fields=STEP_CLOSING_FIELDS)
                    else:
                        row.pk = None
                        row.save(force_insert=True)
            except Exception:
                logger.exception("dropped tracking row %r", row)
                continue
            if pending is not None:
                pending.pk = row.pk
            written += 1
        return written

    def release_connection(self, timeout: float = 5.0) -> bool:
        """Have the writer thread write what is buffered and close its database connection now,
        not after ``IDLE_CLOSE_AFTER`` without rows (a test database about to be dropped).
        True once it has (or when there is no writer thread)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return True
        done = threading.Event()
        with self._lock:
            self._release.append(done)
            self._wake.notify_all()
        return done.wait(timeout)

    def _run(self) -> None:
        """The writer thread: flush by age or size; close the connection when idle."""
        try:
            while True:
                with self._lock:
                    if self._oldest is None and not self._release:
                        self._wake.wait(timeout=IDLE_CLOSE_AFTER)
                    idle = self._oldest is None
                    limit = reactor_settings.TRACKING_BUFFER_SIZE
                    while self._oldest is not None and not self._release:
                        # read on every wake-up: the bound may have changed meanwhile
                        interval = reactor_settings.TRACKING_FLUSH_INTERVAL
                        left = self._oldest + interval - time.monotonic()
                        if left <= 0 or self._size() >= limit:
                            break
                        self._wake.wait(timeout=left)
                    released, self._release = self._release, []
                if not idle:
                    try:
                        close_old_connections()
                        self.flush()
                    except Exception:  # the writer must survive a database outage
                        logger.exception("tracking writer: flush failed")
                        time.sleep(reactor_settings.TRACKING_FLUSH_INTERVAL)
                if idle or released:
                    # Nothing to write for a while, or asked to let go: do not keep a database
                    # connection open (a test database could not be dropped, a pooler slot
                    # stays taken).
                    connections.close_all()
                    for done in released:
                        done.set()
        finally:
            connections.close_all()


#: the columns written per table, and what a row that lacks one gets
_COLUMNS: dict[type[Any], tuple[str, ...]] = {
    CoordinationEvent: (
        "execution_id",
        "step",
        "reactor",
        "primitive",
        "key",
        "kind",
        "owner",
        "token",
        "at",
        "detail",
    ),
    StepRun: (
        "execution_id",
        "step",
        "kind",
        "attempt",
        "status",
        "started_at",
        "finished_at",
        "error",
        "detail",
    ),
}
_MISSING: dict[str, Any] = {"finished_at": None, "error": None, "detail": {}}

#: rows per INSERT statement (10 columns each: well under every backend's parameter limit)
INSERT_BATCH = 90


def _insert(model: type[Any], rows: list[dict[str, Any]], *, returning: bool) -> list[Any]:
    """Multi-row INSERTs of ``rows`` (field dicts, JSON fields not yet JSON) on the default
    connection; the new pks when ``returning``. On PostgreSQL the rows go through ``COPY``
    instead (``_copy``), with pks taken from the table's sequence first when they are needed.

    Not ``bulk_create``: its per-field preparation made writing a step run cost the writer
    (and, at the end of a run, the caller) more than running the step. Values are adapted here
    per column kind — JSON once, datetimes and the execution key by the backend — which is all
    these two tables hold.
    """
    connection = connections["default"]
    ops = connection.ops
    quote = ops.quote_name
    meta = model._meta
    # A row may lack fields set only later (a step run still running has no finished_at).
    columns = list(_COLUMNS[model])
    fields = [meta.get_field(name.removesuffix("_id")) for name in columns]
    adapters: list[Any] = []
    for field in fields:
        kind = field.get_internal_type()
        if kind == "JSONField":
            adapters.append(
                lambda v, ops=ops: None if v is None else ops.adapt_json_value(v, _Encoder)
            )
        elif kind == "DateTimeField":
            adapters.append(ops.adapt_datetimefield_value)
        elif field.is_relation:
            target = field.target_field  # type: ignore[union-attr]
            adapters.append(
                lambda v, t=target, c=connection: None if v is None else t.get_db_prep_value(v, c)
            )
        else:
            adapters.append(None)
    names = ", ".join(quote(field.column) for field in fields)
    one_row = "(" + ", ".join(["%s"] * len(columns)) + ")"
    pks: list[Any] = []
    with connection.cursor() as cursor:
        raw: Any = getattr(cursor, "cursor", None)
        if connection.vendor == "postgresql" and hasattr(raw, "copy"):
            table = quote(meta.db_table)
            json_columns = {
                name
                for name, field in zip(columns, fields, strict=True)
                if field.get_internal_type() == "JSONField"
            }
            if not returning:
                _copy(raw, f"COPY {table} ({names}) FROM STDIN", columns, rows, json_columns)
                return pks
            # the pks first, from the table's own sequence, then the rows with them
            raw.execute(
                "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
                [table, meta.pk.column, len(rows)],
            )
            pks = [row[0] for row in raw.fetchall()]
            numbered = [{**row, "pk": pk} for row, pk in zip(rows, pks, strict=True)]
            _copy(
                raw,
                f"COPY {table} ({quote(meta.pk.column)}, {names}) FROM STDIN",
                ["pk", *columns],
                numbered,
                json_columns,
            )
            return pks
        for start in range(0, len(rows), INSERT_BATCH):
            batch = rows[start : start + INSERT_BATCH]
            params: list[Any] = []
            for row in batch:
                for name, adapt in zip(columns, adapters, strict=True):
                    value = row.get(name, _MISSING.get(name))
                    params.append(adapt(value) if adapt is not None else value)
            sql = f"INSERT INTO {quote(meta.db_table)} ({names}) VALUES " + ", ".join(
                [one_row] * len(batch)
            )
            if returning:
                sql += f" RETURNING {quote(meta.pk.column)}"
            cursor.execute(sql, params)
            if returning:
                pks.extend(row[0] for row in cursor.fetchall())
    return pks


def _copy(
    cursor: Any,
    sql: str,
    columns: list[str],
    rows: list[dict[str, Any]],
    json_columns: set[str],
) -> None:
    """``rows`` through PostgreSQL's ``COPY … FROM STDIN`` (psycopg 3).

    COPY costs the writer thread and the server a fraction of a multi-row INSERT: no statement
    text with a placeholder per value for psycopg to build and parse, no planning per batch.
    That time is taken from the callers' threads (the GIL) and cores, so it shows up in every
    ``Step.call`` (docs/benchmarks.md, "Hot path"). ``json_columns`` travel as their JSON text,
    which the server parses as it would a literal.
    """
    with cursor.copy(sql) as copy:
        for row in rows:
            values = []
            for name in columns:
                value = row.get(name, _MISSING.get(name))
                if name in json_columns and value is not None:
                    value = json.dumps(value, cls=_Encoder)
                values.append(value)
            copy.write_row(values)


def _running(pk: Any) -> Any:
    """The execution ``pk`` while it runs: progress never touches an execution that ended."""
    return Execution.objects.filter(pk=pk, status=ExecutionStatus.RUNNING)


def _jsonable(fields: dict[str, Any]) -> dict[str, Any]:
    """A row's fields with ``detail`` and ``error`` as the JSON the ORM stores."""
    converted = dict(fields)
    for name in ("detail", "error"):
        if name in converted:
            converted[name] = to_json(converted[name])
    return converted


_writer = TrackingWriter()


def get_writer() -> TrackingWriter:
    """The process's writer (a forked child gets a fresh, empty one)."""
    global _writer
    if _writer._pid != os.getpid():
        _writer = TrackingWriter()
    return _writer


def flush() -> int:
    """Write this process's buffered tracking rows now (read-your-writes); rows written."""
    return get_writer().flush()


def _flush_at_exit() -> None:
    try:
        written = flush()
        connections.close_all()
    except Exception:  # the process is going away: say what was lost, do not crash the exit
        logger.exception("tracking rows could not be written at exit")
        return
    if written:
        logger.debug("wrote %d buffered tracking rows at exit", written)


atexit.register(_flush_at_exit)


def connect_celery_shutdown() -> None:
    """Flush when a Celery worker (or one of its pool processes) shuts down cleanly."""
    try:
        from celery import signals as celery_signals
    except ImportError:  # pragma: no cover - celery is a dependency, but stay importable
        return

    def on_shutdown(**_: Any) -> None:
        _flush_at_exit()

    celery_signals.worker_process_shutdown.connect(on_shutdown, weak=False)
    celery_signals.worker_shutdown.connect(on_shutdown, weak=False)
