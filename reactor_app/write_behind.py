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
The one exception: while another thread's flush is writing, a flush inside a transaction does
not wait for it (that flush may be waiting for the transaction's own locks — a deadlock no
database can see); its rows stay buffered and the writer thread writes them after the
transaction ends (``TrackingWriter._take_turn``).

A hard crash (SIGKILL, power loss) loses what was buffered: at most one freshness bound of rows
(or one buffer's worth) of that process. Executions themselves are never written behind.

This module is the buffer and its thread: when rows are written. What a flush writes, and how
(one transaction of multi-row INSERTs, ``COPY`` on PostgreSQL), is ``tracking_store``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from celery import signals as celery_signals
from django.db import close_old_connections, connections, transaction

from reactor_app.conf import reactor_settings
from reactor_app.tracking_store import PendingStepRun, write_rows

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
        #: one flush at a time, so a step run is inserted before its update is written.
        #: Re-entrant: a run's final write holds it around its transaction (``turn``), then
        #: flushes inside it. See ``_take_turn`` for the order it is taken in.
        self._flushing = threading.RLock()
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
        flush in flight is waited for, so its progress write cannot land after that one —
        unless the caller is inside a transaction (``_take_turn``); a late progress write
        changes only a row still ``running`` (``tracking_store``), so it cannot undo the final
        write either way."""
        taken = self._take_turn()
        try:
            with self._lock:
                self._progress.pop(pk, None)
        finally:
            if taken:
                self._flushing.release()

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
        if transaction.get_connection().in_atomic_block and self._flush() is not None:
            # Inside the caller's transaction: the rows belong to it (see the module docstring).
            return
        if self._thread is None:
            # Also when a flush inside a transaction had to leave its rows to the writer.
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
            return self._size()

    # -- writing ----------------------------------------------------------------------------

    def _take_turn(self) -> bool:
        """Take the flush lock; whether it was taken.

        Outside a transaction the caller waits for a flush in flight. Inside one it must not:
        that flush (the writer thread's) may itself be waiting for a lock this transaction
        holds — SQLite's write lock, taken when the transaction begins, or on PostgreSQL an
        execution row locked ``FOR UPDATE`` that its rows reference — and neither database
        can see a wait on a Python lock, so the two would wait for each other (on SQLite until
        the busy timeout, failing every other process's writes meanwhile). So the lock is
        always taken before a database lock, never after: inside a transaction only if it is
        free (or already this thread's)."""
        if transaction.get_connection().in_atomic_block:
            return self._flushing.acquire(blocking=False)
        self._flushing.acquire()
        return True

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Hold the flush lock around a transaction that will ``flush`` inside it (a run's
        final write), so that it is taken before the transaction's database locks."""
        taken = self._take_turn()
        try:
            yield
        finally:
            if taken:
                self._flushing.release()

    def flush(self, *, finishing: Any = None) -> int:
        """Write every buffered row now, on the calling thread; the number of rows written.

        ``finishing``: the pk of an execution whose final write follows at once (its buffered
        progress is dropped, that write supersedes it). Inside a transaction, while another
        thread's flush is writing, this writes nothing (0): the rows stay buffered for the
        writer thread, which writes them once that transaction has ended (``_take_turn``)."""
        written = self._flush(finishing=finishing)
        if written is None:
            if self._thread is None:
                self._start()
            return 0
        return written

    def _flush(self, *, finishing: Any = None) -> int | None:
        """``flush``; None when it could not take its turn (see ``_take_turn``)."""
        if not self._take_turn():
            return None
        try:
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
            written = write_rows(events, snapshot, progress)
            self.written += written
            return written
        finally:
            self._flushing.release()

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

    def on_shutdown(**_: Any) -> None:
        _flush_at_exit()

    celery_signals.worker_process_shutdown.connect(on_shutdown, weak=False)
    celery_signals.worker_shutdown.connect(on_shutdown, weak=False)
