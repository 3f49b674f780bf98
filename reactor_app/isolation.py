"""The isolation level of the app's own transactions: READ COMMITTED, whatever the project's.

A project may run its PostgreSQL transactions at a stricter level (``DATABASES[...]["OPTIONS"]
["isolation_level"]``: REPEATABLE READ or SERIALIZABLE; Django documents the option). The
app's transactions are written for READ COMMITTED, where each statement sees what committed
before it started:

* a transaction that waits its turn (the advisory lock of a debounce burst's settles) then
  reads the rows the previous holder committed;
* the first override of a limit inserts, and when a concurrent first wins the unique
  constraint, locks and changes the row that one committed (``LimitOverrideManager.put``);
* a conditional update of a row another transaction changed meanwhile re-checks its condition
  on the row's newest version (a cancel's status, a retry's source row).

At REPEATABLE READ a transaction sees only what committed before its first statement, and an
update of a row changed since fails ("could not serialize access", SQLSTATE 40001): the
settles of a burst failed one after another and were run again, and concurrent first
overrides of a limit were a server error in the API and the admin (the row the winner
committed was invisible to the loser's read). SERIALIZABLE adds failures of its own.

So the app opens its transactions with ``atomic`` here: the outermost one runs at READ
COMMITTED. The level is set on the driver's connection before the transaction starts,
and the driver sends it with the transaction's ``BEGIN`` (``BEGIN ISOLATION LEVEL READ
COMMITTED``): no statement more. Afterwards the connection gets its own level back, for the
project's code. A transaction of the app inside a caller's (``ATOMIC_REQUESTS``, a caller's
``atomic`` around ``run_async``) is a savepoint of the caller's and runs at the caller's level:
there the caller's level decides, as it decides everything else in that transaction. The app's
single statements outside a transaction (a delivery's claim, its checkpoints) run at the
server's default, which Django's option leaves alone but a database's or role's
``default_transaction_isolation`` raises; those statements are sent again when the database
aborts them as a serialization failure (``_one_statement`` in ``reactor_app.managers``).
docs/operations.md, "Transaction isolation", says the same for users.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction


@contextlib.contextmanager
def atomic(using: str | None = None) -> Iterator[None]:
    """``transaction.atomic(using)``, at READ COMMITTED when it is the outermost transaction
    on a PostgreSQL connection (see the module docstring); otherwise exactly ``atomic``."""
    alias = using or DEFAULT_DB_ALIAS
    connection = connections[alias]
    if (
        connection.vendor != "postgresql"
        or connection.in_atomic_block
        or not connection.get_autocommit()  # (connects) a transaction opened by hand
    ):
        with transaction.atomic(using=alias):
            yield
        return
    # the driver's own numbering (psycopg and psycopg2 number the levels differently)
    from django.db.backends.postgresql.psycopg_any import IsolationLevel

    read_committed = IsolationLevel.READ_COMMITTED
    driver: Any = connection.connection
    own_level = driver.isolation_level
    if own_level == read_committed:
        with transaction.atomic(using=alias):
            yield
        return
    # Named even when the project names no level (None: the server's default, which a
    # database or role may have raised): the BEGIN then says READ COMMITTED itself.
    driver.isolation_level = read_committed
    try:
        with transaction.atomic(using=alias):
            yield
    finally:
        # the same connection, still open and out of the transaction: give it its level back
        if connection.connection is driver and not driver.closed:
            driver.isolation_level = own_level
