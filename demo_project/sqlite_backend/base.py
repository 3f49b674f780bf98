"""SQLite for several processes on Django < 5.1: WAL and ``BEGIN IMMEDIATE``.

Django 5.1 reads ``"transaction_mode": "IMMEDIATE"`` and ``"init_command"`` from a SQLite
database's ``OPTIONS``; Django 4.2 passes ``OPTIONS`` to ``sqlite3.connect``, which knows
neither. Without them, racing processes (a web process and its workers, the test suite's
forked racers) fail with ``database is locked`` instead of waiting: a transaction opened with a
plain ``BEGIN`` reads first and asks for the write lock later, and SQLite refuses that upgrade
at once, without the busy timeout, when another process wrote in between (in WAL mode the
snapshot is stale; in rollback mode two readers upgrading deadlock).

This wrapper gives 4.2 the same two settings: every new connection switches the file to WAL
(readers never block the writer) and every transaction starts ``BEGIN IMMEDIATE`` (the write
lock is taken first, under the busy timeout). The demo's settings use it on Django < 5.1 only.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.sqlite3 import base

#: run on every new connection, as Django 5.1's ``init_command`` would
PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL")


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        connection = super().get_new_connection(conn_params)
        for pragma in PRAGMAS:
            connection.execute(pragma)
        return connection

    def _start_transaction_under_autocommit(self) -> None:
        self.cursor().execute("BEGIN IMMEDIATE")
