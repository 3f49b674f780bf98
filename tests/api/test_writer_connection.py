"""The tracking writer's database connection: kept while rows keep coming, replaced when lost.

At Django's default ``CONN_MAX_AGE = 0`` the writer thread used to close its connection before
every flush (Django's ``close_old_connections``, made for a request cycle), so a busy process
opened a new database connection per flush — four a second at the default freshness bound.
It now keeps one while rows keep coming (``write_behind._check_connections``) and closes it
when idle; a session the server ended between two flushes costs no row.

Transactional tests: rows written from inside a test's transaction would be written at once,
in it, never by the writer thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.backends.signals import connection_created

from reactor_app.models import CoordinationEvent
from reactor_app.testing import within_freshness_bound
from reactor_app.tracking import record_coordination
from reactor_app.write_behind import get_writer

pytestmark = pytest.mark.django_db(transaction=True)

WRITER_THREAD = "reactor-tracking-writer"


@pytest.fixture
def writer_connections() -> Iterator[list[Any]]:
    """The database connections the writer thread opens from now on (their wrappers' backend
    ids on PostgreSQL, else None), starting from a writer with none open."""
    writer = get_writer()
    writer.flush()
    assert writer.release_connection()
    opened: list[Any] = []

    def seen(sender: Any, connection: Any, **_: Any) -> None:
        if threading.current_thread().name == WRITER_THREAD:
            info = getattr(connection.connection, "info", None)
            opened.append(getattr(info, "backend_pid", None))

    connection_created.connect(seen, weak=False)
    try:
        yield opened
    finally:
        connection_created.disconnect(seen)


def record(key: str) -> None:
    record_coordination("acquired", primitive="lock", key=key, owner="writer-connection")


def written(prefix: str) -> int:
    return CoordinationEvent.objects.filter(key__startswith=prefix).count()


def test_the_writer_keeps_one_connection_while_rows_keep_coming(
    settings: Any, connection_checks: list[str], writer_connections: list[Any]
) -> None:
    """Rows arriving for several flush intervals: the writer flushes several times on the one
    connection it opened (it opened one per flush before)."""
    assert connection.settings_dict["CONN_MAX_AGE"] == 0  # the project's, and Django's default
    settings.REACTOR_TRACKING_FLUSH_INTERVAL = 0.05
    rows = 40
    for n in range(rows):
        record(f"kept:{n}")
        time.sleep(0.02)  # 0.8 s of rows: about a flush every 2.5 rows
    assert within_freshness_bound(lambda: written("kept:") == rows)
    assert written("kept:") == rows
    assert connection_checks.count(WRITER_THREAD) >= 4, connection_checks
    assert len(writer_connections) == 1, writer_connections


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a session the server ends")
def test_a_writer_whose_session_ended_between_flushes_writes_every_row_on_a_new_one(
    settings: Any, writer_connections: list[Any]
) -> None:
    """The kept connection lost between two flushes (a database restart, an ended session):
    the next flush fails on it, and its rows are written again on a new connection."""
    import psycopg

    settings.REACTOR_TRACKING_FLUSH_INTERVAL = 0.05
    record("lost:before")
    assert within_freshness_bound(lambda: written("lost:") == 1)
    assert len(writer_connections) == 1, writer_connections
    params = connection.get_connection_params()
    with psycopg.connect(**{**params, "autocommit": True}) as other:
        other.execute("SELECT pg_terminate_backend(%s)", (writer_connections[0],))
    for n in range(5):
        record(f"lost:after:{n}")
    assert within_freshness_bound(lambda: written("lost:") == 6)
    assert written("lost:") == 6
    assert len(writer_connections) == 2, writer_connections
