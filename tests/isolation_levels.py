"""A project's transaction isolation level, for the tests that must hold at every level.

``at_level(level)`` makes every database connection opened from then on — this thread's and
every other thread's — start its transactions at ``level``, as a project's
``DATABASES["default"]["OPTIONS"]["isolation_level"]`` does: Django reads that option when it
connects, from the settings dictionary every thread's connection shares, and hands it to the
driver. ``LEVELS`` are the levels to run such tests at: the project's default (None) and, on
PostgreSQL, REPEATABLE READ and SERIALIZABLE (SQLite has one writer at a time and no such
option). reactor_app/isolation.py says what the app does about them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import connection, connections

LEVELS: list[str | None] = (
    [None, "REPEATABLE_READ", "SERIALIZABLE"] if connection.vendor == "postgresql" else [None]
)


@contextlib.contextmanager
def at_level(level: str | None) -> Iterator[None]:
    """Connections opened inside start their transactions at ``level`` (a name of
    ``psycopg.IsolationLevel``; None: the project's default, nothing changed)."""
    if level is None:
        yield
        return
    from django.db.backends.postgresql.psycopg_any import IsolationLevel

    options = connections.settings["default"].setdefault("OPTIONS", {})
    assert "isolation_level" not in options, "the suite's settings name a level already"
    connections.close_all()  # this thread's connection reconnects with the option
    options["isolation_level"] = IsolationLevel[level]
    try:
        yield
    finally:
        del options["isolation_level"]
        connections.close_all()
