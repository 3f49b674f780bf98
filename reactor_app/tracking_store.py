"""How buffered tracking rows reach the database; ``write_behind`` decides when.

One transaction per flush (none when the flush is a single statement): coordination events and
new step runs as multi-row INSERTs (on PostgreSQL through ``COPY`` from ``COPY_FROM`` rows),
the closing writes of step runs already inserted as one bulk UPDATE, and the progress of
in-process runs. When that transaction fails, each row is written on
its own, so one bad row (its execution deleted meanwhile...) does not cost the others.
"""

from __future__ import annotations

import logging
import operator
from contextlib import nullcontext
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.db import connections

from reactor_app import isolation
from reactor_app.models import CoordinationEvent, Execution, StepRun
from reactor_app.row_statements import ASYNC_COMMIT, LeadingInserts
from reactor_app.serialization import StorableEncoder, to_json
from reactor_app.status import ExecutionStatus

logger = logging.getLogger(__name__)

#: the fields of a step run its closing write changes (the UPDATE of an already-written row)
STEP_CLOSING_FIELDS = ("status", "finished_at", "error", "detail")


class PendingStepRun:
    """One step run on its way to the database; mutate it only through ``TrackingWriter``."""

    __slots__ = ("buffered", "fields", "pk", "queued")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.pk: int | None = None  # set once a flush inserted the row
        self.queued = False  # waiting in the buffer for the next flush
        self.buffered = False  # ever handed to the buffer: its writes stay there, in order


#: a buffered coordination event: its column values in this order (a ``Row``), ``detail`` not
#: yet made JSON — a tuple, not a dict: the caller builds one per event
EVENT_COLUMNS = (
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
)
#: a row's values in its table's column order (``_COLUMNS``)
Row = tuple[Any, ...]


def write_rows(
    raw_events: list[Row],
    snapshot: list[tuple[PendingStepRun, int | None, dict[str, Any]]],
    progress: dict[Any, dict[str, Any]],
) -> int:
    """Write one flush's rows; the number written. ``raw_events``: coordination events, each
    its values in ``EVENT_COLUMNS`` order; ``snapshot``: each step run with the pk an earlier
    flush gave it (None: not inserted yet) and a copy of its fields; ``progress``: execution
    pk -> fields. A step run inserted here gets its ``pk``, so that its closing write becomes
    an UPDATE."""
    new_steps = [(pending, fields) for pending, pk, fields in snapshot if pk is None]
    updates = [
        StepRun(pk=pk, **{name: _jsonable(fields)[name] for name in STEP_CLOSING_FIELDS})
        for _, pk, fields in snapshot
        if pk is not None
    ]
    behind = _commits_behind()
    try:
        transaction_of_its_own = _flush_transaction(raw_events, new_steps, updates, progress)
        with transaction_of_its_own or nullcontext():
            if behind and transaction_of_its_own:
                with connections["default"].cursor() as cursor:
                    cursor.execute("SET LOCAL synchronous_commit TO OFF")
            # one statement outside any transaction: the setting rides in the statement
            alone = behind and not transaction_of_its_own
            if raw_events:
                _insert(CoordinationEvent, raw_events, returning=False, commit_behind=alone)
            if new_steps:
                step_rows = [_step_values(fields) for _, fields in new_steps]
                pks = _insert(StepRun, step_rows, returning=True, commit_behind=alone)
            if updates:
                StepRun.objects.bulk_update(updates, STEP_CLOSING_FIELDS)
            for pk, fields in progress.items():
                _running(pk).update(**fields)
    except Exception as error:
        # One bad row (its execution deleted meanwhile...) must not cost the others.
        cut = isinstance(error, SoftTimeLimitExceeded)
        if not cut:
            logger.warning("bulk write of tracking rows failed; writing them one by one")
        _drop_lost_connection()
        events = [
            CoordinationEvent(**_jsonable(dict(zip(EVENT_COLUMNS, row, strict=True))))
            for row in raw_events
        ]
        inserts = [(pending, StepRun(**_jsonable(fields))) for pending, fields in new_steps]
        written = _write_one_by_one(events, inserts, updates, progress)
        if cut:
            # Celery's soft time limit, not a bad row: the rows (other threads' too) are
            # written, and the limit goes on up — the delivery stops here, as a killed one
            # would (docs/operations.md, "Celery time limits")
            raise
        return written
    if new_steps:
        for (pending, _), pk in zip(new_steps, pks, strict=True):
            pending.pk = pk
    return len(raw_events) + len(new_steps) + len(updates) + len(progress)


def _drop_lost_connection() -> None:
    """Close the connection when the failed write lost it (the database restarted, or ended
    the session), so that the rows written one by one connect again: on the lost connection
    every one of them failed too, and the whole flush was dropped. Not inside a transaction,
    whose connection is the caller's to keep (no buffered row is written there anyway)."""
    connection = connections["default"]
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()


def _commits_behind() -> bool:
    """Whether this flush commits without waiting for the WAL flush: on PostgreSQL, outside a
    caller's transaction (there the setting would change the caller's whole commit).

    WHY: these rows are written behind the work already — a hard crash of the process loses
    its buffer — and a database crash may now lose their last fraction of a second too, never
    corrupt them. A worker delivery's history is followed at once by its end, a synchronous
    commit that flushes the WAL up to and past it; an in-process run's by its final write,
    likewise (docs/operations.md, "Checkpoints")."""
    connection = connections["default"]
    return connection.vendor == "postgresql" and not connection.in_atomic_block


def _flush_transaction(
    raw_events: list[Row], new_steps: list[Any], updates: list[Any], progress: dict[Any, Any]
) -> Any:
    """The transaction around one flush — None when the flush is one statement outside any
    transaction (one table's rows, few enough for one INSERT: a worker delivery's step runs,
    a ``Step.call``'s events): a statement is atomic on its own, and the ``BEGIN`` and
    ``COMMIT`` were two of the few round trips a delivery makes (docs/benchmarks.md, "Growth
    and worker throughput")."""
    rows = len(raw_events) + len(new_steps)
    one_statement = (
        bool(raw_events) != bool(new_steps)
        and not updates
        and not progress
        and rows < min(COPY_FROM, INSERT_BATCH)
    )
    if one_statement and not connections["default"].in_atomic_block:
        return None
    return isolation.atomic()


def _write_one_by_one(
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
            with isolation.atomic():
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


#: the columns written per table, and what a row that lacks one gets
_COLUMNS: dict[type[Any], tuple[str, ...]] = {
    CoordinationEvent: EVENT_COLUMNS,
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
#: a step run's values when it has every column (one C call: ``_step_values``)
_STEP_VALUES = operator.itemgetter(*_COLUMNS[StepRun])

#: rows per INSERT statement (10 columns each: well under every backend's parameter limit)
INSERT_BATCH = 90
#: PostgreSQL: rows from which a flush goes through ``COPY`` (``_copy``); fewer go as one
#: multi-row INSERT — one round trip instead of three or four (the pks, the COPY's start and
#: its end), which is what a small flush costs most (a worker delivery's step runs)
COPY_FROM = 32


def _step_values(fields: dict[str, Any]) -> tuple[Any, ...]:
    """A step run's fields as its row's values in ``_COLUMNS`` order (a step run still running
    has no ``finished_at`` yet: ``_MISSING``)."""
    try:
        return _STEP_VALUES(fields)  # type: ignore[no-any-return]
    except KeyError:
        return tuple(fields.get(name, _MISSING.get(name)) for name in _COLUMNS[StepRun])


def _insert(
    model: type[Any], rows: list[Row], *, returning: bool, commit_behind: bool = False
) -> list[Any]:
    """Multi-row INSERTs of ``rows`` (each its values in ``_COLUMNS`` order, JSON fields not
    yet JSON) on the default connection; the new pks when ``returning``. On PostgreSQL the
    rows go through ``COPY`` instead (``_copy``), with pks taken from the table's sequence
    first when they are needed. ``commit_behind`` (PostgreSQL, one statement outside any
    transaction): ``INSERT ... SELECT ... FROM (VALUES ...) WHERE`` the condition that turns
    ``synchronous_commit`` off for the statement's own transaction
    (``row_statements.ASYNC_COMMIT``), each value cast to its column's type, as a literal in
    an ``INSERT ... VALUES`` would be.

    Not ``bulk_create``: its per-field preparation made writing a step run cost the writer
    (and, at the end of a run, the caller) more than running the step. Values are adapted here
    per column kind — JSON once, datetimes and the execution key by the backend — which is all
    these two tables hold.
    """
    connection = connections["default"]
    quote = connection.ops.quote_name
    meta = model._meta
    pks: list[Any] = []
    with connection.cursor() as cursor:
        raw: Any = getattr(cursor, "cursor", None)
        if connection.vendor == "postgresql" and hasattr(raw, "copy") and len(rows) >= COPY_FROM:
            fields = _fields(model)
            names = ", ".join(quote(field.column) for field in fields)
            table = quote(meta.db_table)
            json_at = [
                i for i, field in enumerate(fields) if field.get_internal_type() == "JSONField"
            ]
            if not returning:
                _copy(raw, f"COPY {table} ({names}) FROM STDIN", rows, json_at)
                return pks
            # the pks first, from the table's own sequence, then the rows with them
            raw.execute(
                "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
                [table, meta.pk.column, len(rows)],
            )
            pks = [row[0] for row in raw.fetchall()]
            numbered = [(pk, *row) for row, pk in zip(rows, pks, strict=True)]
            _copy(
                raw,
                f"COPY {table} ({quote(meta.pk.column)}, {names}) FROM STDIN",
                numbered,
                [i + 1 for i in json_at],
            )
            return pks
        for start in range(0, len(rows), INSERT_BATCH):
            sql, params = _insert_sql(
                model, rows[start : start + INSERT_BATCH], commit_behind=commit_behind
            )
            if returning:
                sql += f" RETURNING {quote(meta.pk.column)}"
            cursor.execute(sql, params)
            if returning:
                pks.extend(row[0] for row in cursor.fetchall())
    return pks


def leading_inserts(
    raw_events: list[Row],
    snapshot: list[tuple[PendingStepRun, int | None, dict[str, Any]]],
    progress: dict[Any, dict[str, Any]],
) -> LeadingInserts | None:
    """One flush's rows as ``INSERT`` statements to carry in front of an execution's final
    write (``write_behind.TrackingWriter.flush_into``) — or None when they cannot ride there:
    not PostgreSQL, or inside a transaction, or progress or closing writes to make (UPDATEs),
    a step run still open (its closing write would need the pk an INSERT here does not hand
    back), or more rows than one plain INSERT carries (those go through ``COPY``)."""
    connection = connections["default"]
    if connection.vendor != "postgresql" or connection.in_atomic_block or progress:
        return None
    rows = len(raw_events) + len(snapshot)
    if rows >= min(COPY_FROM, INSERT_BATCH):
        return None
    steps: list[Row] = []
    for _, pk, fields in snapshot:
        if pk is not None or fields.get("finished_at") is None:
            return None
        steps.append(_step_values(fields))
    statements = [
        _insert_sql(model, batch)
        for model, batch in ((CoordinationEvent, raw_events), (StepRun, steps))
        if batch
    ]
    return LeadingInserts(statements, rows)


def _fields(model: type[Any]) -> list[Any]:
    meta = model._meta
    return [meta.get_field(name.removesuffix("_id")) for name in _COLUMNS[model]]


def _insert_sql(
    model: type[Any], batch: list[Row], *, commit_behind: bool = False
) -> tuple[str, list[Any]]:
    """One multi-row ``INSERT`` of ``batch`` on the default connection, each value adapted to
    its column (``_insert``)."""
    connection = connections["default"]
    ops = connection.ops
    quote = ops.quote_name
    fields = _fields(model)
    adapters: list[Any] = []
    for field in fields:
        kind = field.get_internal_type()
        if kind == "JSONField":
            adapters.append(
                lambda v, ops=ops: None if v is None else ops.adapt_json_value(v, StorableEncoder)
            )
        elif kind == "DateTimeField":
            adapters.append(ops.adapt_datetimefield_value)
        elif field.is_relation:
            target = field.target_field
            adapters.append(
                lambda v, t=target, c=connection: None if v is None else t.get_db_prep_value(v, c)
            )
        else:
            adapters.append(None)
    names = ", ".join(quote(field.column) for field in fields)
    params: list[Any] = []
    for row in batch:
        for value, adapt in zip(row, adapters, strict=True):
            params.append(adapt(value) if adapt is not None else value)
    table = quote(model._meta.db_table)
    if commit_behind:
        typed_row = (
            "(" + ", ".join(f"%s::{_value_type(field, connection)}" for field in fields) + ")"
        )
        sql = (
            f"INSERT INTO {table} ({names}) SELECT * FROM (VALUES "
            + ", ".join([typed_row] * len(batch))
            + f") AS v WHERE {ASYNC_COMMIT}"
        )
        return sql, params
    one_row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    return f"INSERT INTO {table} ({names}) VALUES " + ", ".join([one_row] * len(batch)), params


def _copy(cursor: Any, sql: str, rows: list[Row], json_at: list[int]) -> None:
    """``rows`` (values in column order) through PostgreSQL's ``COPY … FROM STDIN``
    (psycopg 3); the values at ``json_at`` travel as their JSON text, which the server parses
    as it would a literal.

    COPY costs the writer thread and the server a fraction of a multi-row INSERT: no statement
    text with a placeholder per value for psycopg to build and parse, no planning per batch.
    That time is taken from the callers' threads (the GIL) and cores, so it shows up in every
    ``Step.call`` (docs/benchmarks.md, "Hot path").
    """
    with cursor.copy(sql) as copy:
        for row in rows:
            values = list(row)
            for i in json_at:
                if values[i] is not None:
                    values[i] = _json_text(values[i])
            copy.write_row(values)


def _json_text(value: Any) -> str:
    """``value`` as JSON text. The same few small details recur in nearly every event row
    (``{"reentrant": false}``, ``{"outcome": "success"}``): their text is kept, keyed by their
    items, when every key is text and every value short text, a bool or None (so ``True`` and
    ``1``, equal as dict keys, never share an entry)."""
    if type(value) is not dict or len(value) > _SMALL_DETAIL:
        return _JSON.encode(value)
    key = tuple(value.items())
    for name, item in key:
        # checked before the lookup: 1 == 1.0 == True as keys, but not as JSON; long text
        # (an error message) would only churn the kept entries
        if (
            type(name) is not str
            or type(item) not in _KEYABLE
            or (type(item) is str and len(item) > _SMALL_TEXT)
        ):
            return _JSON.encode(value)
    text = _small_json.get(key)
    if text is None:
        text = _JSON.encode(value)
        if len(_small_json) >= _SMALL_JSON_KEPT:
            _small_json.clear()
        _small_json[key] = text
    return text


#: details of at most this many items are worth keeping the text of (``_json_text``)
_SMALL_DETAIL = 3
_SMALL_JSON_KEPT = 512
_SMALL_TEXT = 64
_KEYABLE = frozenset({str, bool, type(None)})
_small_json: dict[tuple[Any, ...], str] = {}


#: one encoder for every JSON value a flush writes (``json.dumps(cls=...)`` builds one per call)
_JSON = StorableEncoder()


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


def _value_type(field: Any, connection: Any) -> str:
    """The type a ``VALUES`` row states for ``field``'s column: its own, but plain ``text`` for
    a ``varchar(n)`` — an explicit cast to ``varchar(n)`` would cut an over-long value short
    silently, where the INSERT's own assignment refuses it as a plain ``VALUES`` insert does."""
    db_type = str(field.cast_db_type(connection))
    return "text" if db_type.startswith("varchar") else db_type
