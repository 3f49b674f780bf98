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
ends (so a ``Result`` reader sees its rows) — just before the run's final write, in a
transaction of its own (the buffer holds other threads' rows: a final write that fails must not
roll them back).

**Inside a caller's transaction** (``transaction.atomic``: ``ATOMIC_REQUESTS``, a test case)
rows never enter the buffer: each is written at once on the caller's connection, in that
transaction — it may point to an execution row nobody else can see yet, and it must roll back
with it. The buffer, in turn, never rides in a caller's transaction: its rows are other
threads', which that transaction's rollback must not take with it, and a flush inside a
transaction never waits for the flush lock — the flush holding it may be waiting for a lock
that transaction holds (SQLite's write lock, an execution row locked ``FOR UPDATE``), a
deadlock neither database can see. A step run the buffer has seen stays the buffer's, so its
insert and its update keep their order.

A hard crash (SIGKILL, power loss) loses what was buffered: at most one freshness bound of rows
(or one buffer's worth) of that process. Executions themselves are never written behind.

This module is the buffer and its thread: when rows are written. What a flush writes, and how
(one transaction of multi-row INSERTs, ``COPY`` on PostgreSQL), is ``tracking_store``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from celery import signals as celery_signals
from celery.exceptions import SoftTimeLimitExceeded
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from reactor_app import forks
from reactor_app.background import BackgroundThread
from reactor_app.conf import reactor_settings
from reactor_app.row_statements import LeadingInserts
from reactor_app.tracking_store import PendingStepRun, Row, leading_inserts, write_rows

logger = logging.getLogger(__name__)

#: seconds without a row after which the writer thread closes its database connection
IDLE_CLOSE_AFTER = 1.0

#: below this many buffered rows the size bound is not even read (a settings read per row
#: would cost the caller more than the row)
MIN_SIZE_CHECK = 64


class TrackingWriter:
    """The per-process buffer of tracking rows and its background writer thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        #: one flush of the buffer at a time, committed before it is let go: a step run is
        #: inserted before its update is written, and its row is visible to the next flush
        self._flushing = threading.Lock()
        #: ``CoordinationEvent`` rows (``tracking_store.Row``), ``detail`` not yet JSON
        self._events: list[Row] = []
        self._steps: list[PendingStepRun] = []
        #: execution pk -> progress fields (``current_step``) of an in-process run, latest wins
        self._progress: dict[Any, dict[str, Any]] = {}
        self._oldest: float | None = None  # monotonic time the oldest buffered row arrived
        self._background = BackgroundThread(self._run, "reactor-tracking-writer")
        #: callers waiting for the writer thread to let go of its database connection
        self._release: list[threading.Event] = []
        self._pid = forks.pid()
        #: rows written so far (by any thread); tests and the benchmark read it
        self.written = 0

    # -- the caller's side ------------------------------------------------------------------

    def add_event(self, row: Row) -> None:
        """Buffer one ``CoordinationEvent`` row (its values in ``EVENT_COLUMNS`` order,
        ``detail`` made JSON when written) — or, inside a transaction, write it in that
        transaction (module docstring)."""
        if _in_transaction():
            self._count(write_rows([row], [], {}))
            return
        with self._lock:
            self._events.append(row)
            self._arrived()
        self._ensure_thread()

    def update_step(self, pending: PendingStepRun, **fields: Any) -> None:
        """Apply ``fields`` to ``pending`` and queue it for the next flush — or write it in
        the caller's transaction, if the buffer never had it (a step run the buffer has seen
        stays the buffer's, so its insert and update keep their order)."""
        snapshot = None
        with self._lock:
            pending.fields.update(fields)
            if not pending.buffered and _in_transaction():
                snapshot = [(pending, pending.pk, dict(pending.fields))]
            elif not pending.queued:
                pending.queued = pending.buffered = True
                self._steps.append(pending)
            if snapshot is None:
                self._arrived()
        if snapshot is not None:
            self._count(write_rows([], snapshot, {}))
            return
        self._ensure_thread()

    def update_execution(self, pk: Any, **fields: Any) -> None:
        """Progress of an in-process run (its current step), written behind like its steps
        — or, inside a transaction, at once in it (like every row there)."""
        if _in_transaction():
            self._count(write_rows([], [], {pk: fields}))
            return
        with self._lock:
            self._progress.setdefault(pk, {}).update(fields)
            self._arrived()
        self._ensure_thread()

    def forget_progress(self, pk: Any) -> None:
        """Drop an execution's buffered progress: a final write of its row supersedes it. A
        flush in flight is waited for (outside a transaction, ``turn``), so its progress
        write cannot land after that one; a late progress write changes only a row still
        ``running`` (``tracking_store``) anyway."""
        with self.turn(), self._lock:
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

    def _count(self, written: int) -> None:
        with self._lock:
            self.written += written

    def _ensure_thread(self) -> None:
        if not self._background.running():
            with self._lock:
                self._background.ensure()

    @property
    def pending(self) -> int:
        """Rows buffered and not yet written."""
        with self._lock:
            return self._size()

    # -- writing ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Hold the buffer's flush lock, after any flush in flight. Never inside a transaction:
        that flush may be waiting for a lock the transaction holds (SQLite's write lock, an
        execution row locked ``FOR UPDATE``) — a deadlock no database can see — so there this
        takes nothing."""
        if _in_transaction():
            yield
            return
        with self._flushing:
            yield

    def flush(self, *, finishing: Any = None) -> int:
        """Write every buffered row now, on the calling thread, in a transaction of its own;
        the number of rows written.

        ``finishing``: the pk of an execution whose final write follows at once (its buffered
        progress is dropped, that write supersedes it).

        Inside a transaction this writes nothing: the rows recorded in that transaction are
        already in it, and the buffer's rows — other threads', recorded outside any
        transaction — must not ride in a transaction that may roll back, nor wait for a flush
        in flight that may be waiting for this transaction's locks."""
        if _in_transaction():
            return 0
        with self._flushing:
            return self._write_buffer(finishing)

    def discard(self) -> int:
        """Drop every buffered row unwritten; the number dropped. For a test that ends inside
        its own transaction (``reactor_app.testing``): its rows would be rolled back with it,
        and written later by the writer thread they would land in the next test's data."""
        with self._lock:
            dropped = self._size()
            for pending in self._steps:
                pending.queued = False  # a later update queues it again
            self._events, self._steps, self._progress = [], [], {}
            self._oldest = None
            return dropped

    def flush_into(
        self, finishing: Any, final_write: Callable[[LeadingInserts | None], None]
    ) -> None:
        """Write every buffered row and then ``final_write`` — the final write of execution
        ``finishing``'s row — in one statement where they fit (PostgreSQL: the rows as
        ``INSERT``s in front of that write, ``tracking_store.leading_inserts``), else as
        ``flush`` then ``final_write(None)``.

        WHY: at the end of a pass its history (step runs, events) must be written before, or
        with, the row's final status; as two statements that was two round trips, the
        final one waiting for the WAL flush (docs/operations.md, "Checkpoints"). Riding
        together they share one round trip and one synchronous commit, and they are atomic.
        If that statement fails, nothing of it was written: the rows are written on their own
        (each one alone if need be, as any flush), then ``final_write`` alone, whose error is
        the caller's. Inside a transaction this writes no buffered row (``flush``).

        Celery's soft time limit raised in that statement is not a failed write to try again:
        the rows are written on their own, and the limit goes on up without the final write —
        the pass stops there, as a delivery killed there would, and the next delivery ends it
        (docs/operations.md, "Celery time limits")."""
        if _in_transaction():
            final_write(None)
            return
        with self._flushing:
            events, snapshot, progress = self._take(finishing)
            if not events and not snapshot and not progress:
                final_write(None)
                return
            leading = leading_inserts(events, snapshot, progress)
            if leading is not None:
                try:
                    final_write(leading)
                except Exception as error:
                    if leading.written:
                        self._count(leading.rows)
                        raise
                    if isinstance(error, SoftTimeLimitExceeded):
                        self._count(write_rows(events, snapshot, progress))
                        raise
                    logger.warning("history carried by an execution's final write failed")
                else:
                    self._count(leading.rows)
                    return
            self._count(write_rows(events, snapshot, progress))
        final_write(None)

    def _flush_from_thread(self) -> None:
        """The writer thread's flush: its connection checked first (the database may have
        restarted while it slept), unless another thread's flush took the rows meanwhile.
        Checked under ``_flushing``, which that flush holds too: a test's teardown flush, after
        which the test loses its database access, leaves the thread nothing to touch the
        database for (it used to log a failed flush at the end of such tests)."""
        with self._flushing:
            with self._lock:
                if not self._size():
                    return
            _check_connections()
            self._write_buffer(None)

    def _write_buffer(self, finishing: Any) -> int:
        """Write what is buffered; the caller holds ``_flushing``."""
        events, snapshot, progress = self._take(finishing)
        if not events and not snapshot and not progress:
            return 0
        written = write_rows(events, snapshot, progress)
        self._count(written)
        return written

    def _take(
        self, finishing: Any
    ) -> tuple[list[Row], list[tuple[PendingStepRun, Any, dict[str, Any]]], dict[Any, Any]]:
        """Empty the buffer; what it held. ``finishing``'s progress is dropped (the final
        write that follows supersedes it). The caller holds ``_flushing``."""
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
        return events, snapshot, progress

    def release_connection(self, timeout: float = 5.0) -> bool:
        """Have the writer thread write what is buffered and close its database connection now,
        not after ``IDLE_CLOSE_AFTER`` without rows (a test database about to be dropped).
        True once it has (or when there is no writer thread)."""
        if not self._background.running():
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
                        self._flush_from_thread()
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


def _check_connections() -> None:
    """Before the writer thread's flush: drop its database connection when it is broken (an
    error since its last commit, and it no longer answers) or older than a positive
    ``CONN_MAX_AGE`` — and otherwise keep it, at ``CONN_MAX_AGE = 0`` too.

    Django's ``close_old_connections`` is made for a request cycle: at ``CONN_MAX_AGE = 0``
    (Django's default) every call closes the connection. Called before each flush, it had the
    writer open a new database connection four times a second in a busy process — on
    PostgreSQL a server process started and ended each time. The writer's connection lives
    as long as rows keep coming instead: ``_run`` closes it after ``IDLE_CLOSE_AFTER`` without
    one, and a flush that finds it lost (a restart, an ended session) writes its rows again
    on a new one (``tracking_store.write_rows``)."""
    for connection in connections.all(initialized_only=True):
        if connection.settings_dict.get("CONN_MAX_AGE") == 0:
            connection.close_at = None  # the writer's own rule: closed when idle
        connection.close_if_unusable_or_obsolete()


_writer = TrackingWriter()


def _in_transaction() -> bool:
    """Whether the calling thread is inside ``transaction.atomic`` (its default connection).

    Asked for every tracking row. In synchronous code Django keeps a thread's connections in a
    plain thread-local store (asgiref's ``Local(thread_critical=True)``); read it directly, as
    ``connections[alias]`` would, without asgiref's check for a running event loop on each
    access — ``asyncio.get_running_loop()`` raising and catching ``RuntimeError``. A thread
    that has not used its connection yet is in no transaction. Anywhere else (an event loop
    running in this thread, another asgiref), Django answers."""
    if _THREAD_CONNECTIONS is not None and asyncio._get_running_loop() is None:
        connection = getattr(_THREAD_CONNECTIONS, DEFAULT_DB_ALIAS, None)
        return connection is not None and bool(connection.in_atomic_block)
    return bool(transaction.get_connection().in_atomic_block)


def _thread_connections() -> threading.local | None:
    """The thread-local store behind ``django.db.connections`` in synchronous code (asgiref
    3.8 and later keep one ``threading.local`` there for the handler's lifetime), or None
    (another asgiref: ``_in_transaction`` asks Django). Looked up once: on an older asgiref the
    lookup itself goes through its ``Local`` machinery."""
    storage = getattr(getattr(connections, "_connections", None), "_storage", None)
    return storage if type(storage) is threading.local else None


_THREAD_CONNECTIONS = _thread_connections()


def get_writer() -> TrackingWriter:
    """The process's writer (a forked child gets a fresh, empty one)."""
    global _writer
    if _writer._pid != forks.pid():
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

    def on_shutdown(**_: Any) -> None:
        _flush_at_exit()

    celery_signals.worker_process_shutdown.connect(on_shutdown, weak=False)
    celery_signals.worker_shutdown.connect(on_shutdown, weak=False)
