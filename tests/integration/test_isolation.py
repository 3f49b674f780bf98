"""The app's own transactions run at READ COMMITTED whatever the project's level
(reactor_app/isolation.py says why), and leave the connection's level as they found it.

A property over every combination PostgreSQL offers: the level the project names for its
connections (none, or each of the four), the server's default for a transaction whose level
the driver does not name (``default_transaction_isolation``, which a database or role may
raise), and whether the app's transaction is the outermost one or inside a caller's. Inside,
the transaction runs at READ COMMITTED when it is the outermost, and at the caller's level
when it is inside a caller's; afterwards, the project's next transaction runs at its own
level again.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor_app import isolation

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="isolation levels are PostgreSQL's option"
    ),
]

#: the driver's levels by PostgreSQL's name for them (None: the driver names none)
DRIVER_LEVELS: dict[str | None, Any] = {None: None}
if connection.vendor == "postgresql":
    from django.db.backends.postgresql.psycopg_any import IsolationLevel

    DRIVER_LEVELS.update(
        {
            "read uncommitted": IsolationLevel.READ_UNCOMMITTED,
            "read committed": IsolationLevel.READ_COMMITTED,
            "repeatable read": IsolationLevel.REPEATABLE_READ,
            "serializable": IsolationLevel.SERIALIZABLE,
        }
    )
SERVER_DEFAULTS = ["read committed", "repeatable read", "serializable"]


def _level_inside() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW transaction_isolation")
        return str(cursor.fetchone()[0])


def _effective(project: str | None, server_default: str) -> str:
    # PostgreSQL runs READ UNCOMMITTED as READ COMMITTED, and reports the level asked for
    return project if project is not None else server_default


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    project=st.sampled_from(list(DRIVER_LEVELS)),
    server_default=st.sampled_from(SERVER_DEFAULTS),
    inside_a_callers=st.booleans(),
)
def test_the_app_s_transactions_run_at_read_committed_and_leave_the_level_as_found(
    project: str | None, server_default: str, inside_a_callers: bool
) -> None:
    connection.close()
    connection.ensure_connection()
    driver: Any = connection.connection
    with connection.cursor() as cursor:
        cursor.execute(f"SET SESSION default_transaction_isolation = '{server_default}'")
    driver.isolation_level = DRIVER_LEVELS[project]
    callers = _effective(project, server_default)
    try:
        if inside_a_callers:
            with transaction.atomic():
                assert _level_inside() == callers
                with isolation.atomic():
                    assert _level_inside() == callers  # a savepoint of the caller's
        else:
            with isolation.atomic():
                assert _level_inside() == "read committed"
            assert driver.isolation_level == DRIVER_LEVELS[project]
            with transaction.atomic():
                assert _level_inside() == callers  # the project's own, again
        with isolation.atomic():
            assert _level_inside() == "read committed"
    finally:
        connection.close()


def test_a_failed_transaction_of_the_app_leaves_the_level_as_found_too() -> None:
    connection.ensure_connection()
    driver: Any = connection.connection
    driver.isolation_level = DRIVER_LEVELS["serializable"]
    try:
        with pytest.raises(ZeroDivisionError), isolation.atomic():
            assert _level_inside() == "read committed"
            1 / 0  # noqa: B018
        assert driver.isolation_level == DRIVER_LEVELS["serializable"]
        with transaction.atomic():
            assert _level_inside() == "serializable"
    finally:
        connection.close()
