"""The statements a worker delivery writes its own execution row with, built as SQL per write.

Split from ``managers`` (which holds every other query of the models) because these few
statements are a delivery's hot path and are built differently: not through
``QuerySet.filter(...).update(...)``, whose clone, lookup and compiler machinery cost more CPU
per checkpoint than the statement's own round trip (docs/benchmarks.md, "Statements built once
per write"), but as one SQL string per write from the model's field metadata, each value
adapted by its field's ``get_db_prep_save`` — what Django's UPDATE compiler does for these
columns, without the rest.

* ``claim_sql`` — a delivery's claim: one ``UPDATE ... RETURNING`` that increments
  ``claim_generation`` and, for a new execution whose message named its first step, writes
  the pass's start in the same statement;
* ``conditional_update`` — ``UPDATE ... WHERE id = ... AND claim_generation = ...`` (every
  write after the claim), optionally without waiting for the WAL flush on PostgreSQL;
* ``progress_append_sql`` — such an update and the progress rows it appends as one statement
  (PostgreSQL);
* ``ASYNC_COMMIT`` — that condition: ``synchronous_commit`` off for the statement's own
  transaction (``set_config(..., true)``, the function form of ``SET LOCAL``), so the write
  stays one statement.

The callers (``ExecutionManager.claim``, ``ExecutionProgressManager.append``,
``engine.progress``) keep deciding *what* is written; this module only spells it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from django.db import connections, models

#: ``SET LOCAL synchronous_commit TO OFF`` as a condition of the statement itself: the setting
#: lasts for the statement's own transaction (autocommit), and the commit reads it when it
#: happens — one statement, no transaction of its own around it
ASYNC_COMMIT = "set_config('synchronous_commit', 'off', true) = 'off'"


class ColumnSQL(Protocol):
    """A value computed from the column it replaces (``engine.context_patch.ContextPatch``)."""

    def sql_on(self, column: str, vendor: str) -> tuple[str, list[Any]]: ...


def conditional_update(
    model: type[models.Model],
    using: str,
    pk: Any,
    generation: int,
    values: dict[str, Any],
    *,
    async_commit: bool = False,
) -> tuple[str, list[Any]]:
    """The SQL and params of ``UPDATE <table> SET <values> WHERE id = pk AND
    claim_generation = generation`` (plus ``ASYNC_COMMIT`` when ``async_commit``). A value
    with ``sql_on`` (a ``ColumnSQL``) is computed from the column's current value."""
    connection = connections[using]
    meta = model._meta
    quote = connection.ops.quote_name
    table = quote(meta.db_table)
    sets: list[str] = []
    params: list[Any] = []
    for name, value in values.items():
        field = meta.get_field(name)
        column = quote(str(field.column))  # type: ignore[union-attr]
        if hasattr(value, "sql_on"):
            sql, extra = value.sql_on(f"{table}.{column}", connection.vendor)
            sets.append(f"{column} = {sql}")
            params.extend(extra)
            continue
        prepared = field.get_db_prep_save(value, connection)  # type: ignore[union-attr]
        if prepared is None:
            sets.append(f"{column} = NULL")
        else:
            sets.append(f"{column} = %s")
            params.append(prepared)
    where = (
        f"{table}.{quote(str(meta.pk.column))} = %s AND {table}.{quote('claim_generation')} = %s"
    )
    params += [meta.pk.get_db_prep_value(pk, connection), generation]
    if async_commit:
        where += f" AND {ASYNC_COMMIT}"
    return f"UPDATE {table} SET {', '.join(sets)} WHERE {where}", params


def claim_sql(
    model: type[models.Model],
    using: str,
    pk: Any,
    statuses: tuple[str, ...],
    now: Any,
    *,
    start: tuple[str, str, str] | None = None,
) -> tuple[str, list[Any]]:
    """The claim statement: increment ``claim_generation``, touch the heartbeat, return the
    row — if it is in ``statuses``. ``start`` (pending status, running status, first step):
    a row still in the pending status that never started is started in the same statement
    (status, ``started_at``, ``current_step``, ``updated_at``); any other row is only claimed.
    Every ``CASE`` reads the row as it was before the statement, on PostgreSQL and SQLite
    alike."""
    connection = connections[using]
    meta = model._meta
    quote = connection.ops.quote_name
    columns = ", ".join(quote(str(f.column)) for f in meta.concrete_fields)
    generation = quote("claim_generation")
    stamp = meta.get_field("heartbeat_at").get_db_prep_value(now, connection)  # type: ignore[union-attr]
    sets = [f"{generation} = {generation} + 1", f"{quote('heartbeat_at')} = %s"]
    params: list[Any] = [stamp]
    if start is not None:
        pending, running, first_step = start
        fresh = f"{quote('status')} = %s AND {quote('started_at')} IS NULL"
        for column, value in (
            ("status", running),
            ("started_at", stamp),
            ("current_step", first_step),
            ("updated_at", stamp),
        ):
            sets.append(f"{quote(column)} = CASE WHEN {fresh} THEN %s ELSE {quote(column)} END")
            params += [pending, value]
    placeholders = ", ".join(["%s"] * len(statuses))
    sql = (
        f"UPDATE {quote(meta.db_table)} SET {', '.join(sets)} "
        f"WHERE {quote(str(meta.pk.column))} = %s AND {quote('status')} IN ({placeholders}) "
        f"RETURNING {columns}"
    )
    params += [meta.pk.get_db_prep_value(pk, connection), *(str(s) for s in statuses)]
    return sql, params


def progress_append_sql(
    progress_model: type[models.Model],
    using: str,
    update_sql: str,
    update_params: list[Any],
    first_seq: int,
    changes: Sequence[tuple[str, Any, Any]],
) -> tuple[str, list[Any]]:
    """PostgreSQL: ``WITH claimed AS (<update> RETURNING id) INSERT INTO <progress> ... SELECT
    ... FROM claimed``, the rows ``first_seq, first_seq+1, ...`` of ``changes`` appended
    exactly when the conditional update matched (``ExecutionProgressManager.append``)."""
    quote = connections[using].ops.quote_name
    target = progress_model._meta.get_field("execution").target_field  # type: ignore[union-attr]
    pk = quote(str(target.column))
    table = quote(progress_model._meta.db_table)
    tuples = ", ".join(["(%s, %s, %s, %s)"] * len(changes))
    params: list[Any] = list(update_params)
    for n, (kind, path, payload) in enumerate(changes):
        params += [first_seq + n, kind, json.dumps(list(path)), json.dumps(payload)]
    sql = (
        f"WITH claimed AS ({update_sql} RETURNING {pk}) "
        f"INSERT INTO {table} (execution_id, seq, kind, path, payload) "
        f"SELECT claimed.{pk}, v.seq, v.kind, v.path::jsonb, v.payload::jsonb "
        f"FROM claimed CROSS JOIN (VALUES {tuples}) AS v (seq, kind, path, payload)"
    )
    return sql, params


class LeadingInserts:
    """``INSERT`` statements that ride in front of a write as data-modifying ``WITH`` clauses
    (PostgreSQL): a pass's buffered history carried by its end (``write_behind.TrackingWriter.
    flush_into``), so the two share one round trip and one synchronous commit, and whoever
    sees the end sees the history (the statement is atomic).

    ``written`` is set by whoever executes the statement, right after it returned: a write
    that then raises (``ClaimLost``: the update matched no row) has still written these rows;
    one whose statement failed has written none of them.
    """

    __slots__ = ("params", "rows", "statements", "written")

    def __init__(self, statements: list[tuple[str, list[Any]]], rows: int) -> None:
        self.statements = statements
        self.rows = rows
        self.written = False

    def lead(self, sql: str, params: list[Any]) -> tuple[str, list[Any]]:
        """``sql`` (a plain statement, or one that starts with its own ``WITH``) with these
        inserts in front; the inserts' params first, as their text comes first."""
        clauses = ", ".join(
            f"leading_{n} AS ({text})" for n, (text, _) in enumerate(self.statements)
        )
        leading_params = [p for _, values in self.statements for p in values]
        if sql.startswith("WITH "):
            return f"WITH {clauses}, {sql[5:]}", leading_params + params
        return f"WITH {clauses} {sql}", leading_params + params


def execute_led(cursor: Any, sql: str, params: list[Any], leading: LeadingInserts | None) -> None:
    """Execute ``sql`` on ``cursor``, with ``leading`` in front when given (and marked
    written once the statement returned)."""
    if leading is None:
        cursor.execute(sql, params)
        return
    cursor.execute(*leading.lead(sql, params))
    leading.written = True
