"""Writing an execution's state back to its row: what changed, never the whole context.

WHY: the state (``engine.state``) holds every result, the rollback log and a sequential map's
elements so far. Rewriting it at every checkpoint made a run's cost grow with the square of its
length (a 1,000-element map wrote 263 MB). ``ProgressStore`` remembers what of the state is on
the row and writes only the difference as a patch of the ``context`` column, computed in the
database:

* PostgreSQL: ``jsonb_set`` (an array extended with ``||``) / ``#-`` (remove);
* SQLite: ``json_set`` / ``json_insert`` with ``[#]`` (append) / ``json_remove``;
* any other backend: the whole context, as before.

So the statement a checkpoint sends carries what the step (or the batch of map elements) added
— its result, its rollback-log entry, the few engine notes that changed — whatever the number of
units before it. The row keeps the same JSON layout (``ExecutionState.from_json`` reads it, and
rows written before this module load as they are); a pass reads it once, when it starts.

The difference is found without walking the state: results and the rollback log are
append-only while a pass runs (a step's result is written once; a rollback empties the log),
so the store keeps their lengths and their last entry, and writes the entries past them. Any
other change of those (the log emptied, a map's progress replaced) writes that part whole. The
small rest of the state (ordered positions, contention counters, continuation notes, ...) is
compared key by key.

Every write is conditional on ``claim_generation`` (the value the delivery's claim statement
set, ``ExecutionManager.claim``): a delivery whose claim was taken over writes nothing and
stops with ``ClaimLost`` — a terminal status, once written, is not overwritten by a delivery
that lost its claim (docs/design.md, "The execution claim").

Durability: ``write(durable=False)`` (a progress checkpoint on a worker) does not wait for the
WAL flush on PostgreSQL (``synchronous_commit`` off for the statement's transaction, set by the
statement itself: ``set_config(..., true)``, the function form of ``SET LOCAL``, so the write
stays one statement): a database crash may lose the
last fraction of a second of progress — those units re-run, as after a worker crash — never
corrupt it. The start of a pass and its end (status writes) stay synchronous
(docs/operations.md, "Checkpoints").
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any, Literal

from django.db import DatabaseError, connections, models
from django.db.models import F
from django.db.models.expressions import Expression, RawSQL
from django.utils import timezone

from reactor_app.conf import reactor_settings
from reactor_app.engine.state import CompletedStep, ExecutionState, MapProgress
from reactor_app.engine.worker import ClaimLost
from reactor_app.models import Execution
from reactor_app.serialization import encode

OpKind = Literal["set", "extend", "remove"]
#: one change of the stored context: set a path, append a list of entries to the array at a
#: path, remove a path
Op = tuple[OpKind, tuple[str, ...], Any]

RESULTS, COMPLETED, MAP_PROGRESS = "results", "completed", "map_progress"
#: the parts written entry by entry; the rest of the state is "the skeleton"
_GROWING = (RESULTS, COMPLETED, MAP_PROGRESS)
PATCHING_VENDORS = ("postgresql", "sqlite")
#: entries appended per SQLite ``json_insert`` call (its argument count is capped)
SQLITE_PAIRS = 40
#: a patch nesting deeper than this, or more new results than ``MAX_NEW_RESULTS``, writes the
#: whole context instead: that happens once per in-process run (its first write is its end),
#: never per checkpoint of a worker (each carries one step or one batch of elements)
MAX_NESTING = 40
MAX_NEW_RESULTS = 20


class ContextPatch(Expression):
    """The ``context`` column with ``ops`` applied, as one SQL expression (see the module
    docstring for the functions per backend)."""

    def __init__(self, ops: list[Op]) -> None:
        super().__init__(output_field=models.JSONField())
        self.ops = ops
        self.source: Any = F("context")

    def get_source_expressions(self) -> list[Any]:
        return [self.source]

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        (self.source,) = exprs

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        column, column_params = compiler.compile(self.source)
        sql, params = column, list(column_params)
        postgres = connection.vendor == "postgresql"
        for kind, path, value in self.ops:
            if postgres:
                if kind == "set":
                    sql = f"jsonb_set({sql}, %s::text[], %s::jsonb, true)"
                    params += [list(path), json.dumps(value)]
                elif kind == "extend":
                    # the array as the row holds it (no other op of a patch touches it) and
                    # the new entries: the column is named once more, not the whole patch
                    sql = (
                        f"jsonb_set({sql}, %s::text[], "
                        f"COALESCE({column} #> %s::text[], '[]'::jsonb) || %s::jsonb, true)"
                    )
                    params += [list(path), *column_params, list(path), json.dumps(value)]
                else:
                    sql = f"({sql} #- %s::text[])"
                    params.append(list(path))
            elif kind == "set":
                sql = f"json_set({sql}, %s, json(%s))"
                params += [sqlite_path(path), json.dumps(value)]
            elif kind == "extend":
                at = sqlite_path(path) + "[#]"
                for start in range(0, len(value), SQLITE_PAIRS):
                    chunk = value[start : start + SQLITE_PAIRS]
                    sql = f"json_insert({sql}{', %s, json(%s)' * len(chunk)})"
                    for item in chunk:
                        params += [at, json.dumps(item)]
            else:
                sql = f"json_remove({sql}, %s)"
                params.append(sqlite_path(path))
        return sql, tuple(params)


def nesting(ops: list[Op]) -> int:
    """How deep the patch's SQL nests function calls (SQLite's parser stack is ~100 deep)."""
    return sum(-(-len(value) // SQLITE_PAIRS) if kind == "extend" else 1 for kind, _, value in ops)


def sqlite_path(path: tuple[str, ...]) -> str:
    return "$" + "".join(f'."{part}"' for part in path)


def _patchable(path: tuple[str, ...], vendor: str) -> bool:
    """Whether a patch can name ``path``. A SQLite JSON path has no escape for a double quote
    in a key, and SQLite (3.40) matches a key against its stored text, escapes and all, while
    a new key is stored as the path spells it: the stored JSON escapes non-ASCII characters
    (``json.dumps``, as Django's ``JSONField`` writes it), so a key that JSON escapes (``ü`` is
    stored ``\\u00fc``) can be neither found nor created under its own name — such a write
    sends the whole context instead (a step named with a non-ASCII character)."""
    if vendor == "sqlite":
        return all(json.dumps(part)[1:-1] == part and '"' not in part for part in path)
    return all('"' not in part and "\\" not in part for part in path)


@dataclass
class _MapMark:
    """What of one sequential map's progress is on the row."""

    elements: list[dict[str, Any]]
    elements_written: int
    values: list[Any]
    values_written: int
    index: int


class ProgressStore:
    """What of one execution's state is on its row, and the statement that writes the rest."""

    def __init__(self, execution: Execution, state: ExecutionState) -> None:
        self.execution = execution
        #: the claim generation this pass owns the row with (``ExecutionManager.claim``)
        self.generation = execution.claim_generation
        self._stored_keys: set[str] = set((execution.context or {}).keys())
        #: sequential map elements completed since the last write (``batch_due``)
        self._unwritten_elements = 0
        self._batch_started = 0.0
        self._mark(state)

    # -- what is on the row ----------------------------------------------------------------

    def _mark(self, state: ExecutionState, skeleton: dict[str, Any] | None = None) -> None:
        self._skeleton = skeleton if skeleton is not None else skeleton_of(state)
        self._results_written = len(state.results)
        self._last_result = next(reversed(state.results), None) if state.results else None
        self._completed_written = len(state.completed)
        self._last_record: CompletedStep | None = state.completed[-1] if state.completed else None
        self._maps = {
            name: _MapMark(
                entry["elements"],
                len(entry["elements"]),
                entry["values"],
                len(entry["values"]),
                entry["index"],
            )
            for name, entry in (state.children.map_progress or {}).items()
        }

    # -- the difference --------------------------------------------------------------------

    def changes(self, state: ExecutionState) -> tuple[list[Op], dict[str, Any]]:
        """The ops that bring the row to ``state``, and the new skeleton."""
        skeleton = skeleton_of(state)
        ops: list[Op] = []
        for key, value in skeleton.items():
            if key not in self._skeleton or self._skeleton[key] != value:
                ops.append(("set", (key,), value))
        ops.extend(("remove", (key,), None) for key in self._skeleton if key not in skeleton)
        ops.extend(self._result_ops(state.results))
        ops.extend(self._completed_ops(state.completed))
        ops.extend(self._map_ops(state.children.map_progress))
        return ops, skeleton

    def _result_ops(self, results: dict[str, Any]) -> list[Op]:
        written, count = self._results_written, len(results)
        fresh = count - written
        if RESULTS not in self._stored_keys or fresh < 0 or fresh > MAX_NEW_RESULTS:
            return [("set", (RESULTS,), _encode(results))]
        if fresh == 0:
            return []
        # the entries past the written ones, found from the end: O(new), not O(all)
        tail = list(islice(reversed(results), fresh + (1 if written else 0)))
        if written and tail[-1] != self._last_result:
            return [("set", (RESULTS,), _encode(results))]
        new_keys = tail[:fresh][::-1]
        return [("set", (RESULTS, key), _encode(results[key])) for key in new_keys]

    def _completed_ops(self, completed: list[CompletedStep]) -> list[Op]:
        written = self._completed_written
        if (
            COMPLETED not in self._stored_keys
            or len(completed) < written
            or (written and completed[written - 1] is not self._last_record)
        ):
            return [("set", (COMPLETED,), _encode([c.to_json() for c in completed]))]
        fresh = completed[written:]
        return [("extend", (COMPLETED,), [_encode(c.to_json()) for c in fresh])] if fresh else []

    def _map_ops(self, progress: dict[str, MapProgress] | None) -> list[Op]:
        if progress is None:
            return [("remove", (MAP_PROGRESS,), None)] if MAP_PROGRESS in self._stored_keys else []
        if MAP_PROGRESS not in self._stored_keys:
            return [("set", (MAP_PROGRESS,), _encode(progress))]
        ops: list[Op] = [
            ("remove", (MAP_PROGRESS, name), None) for name in self._maps if name not in progress
        ]
        for name, entry in progress.items():
            mark = self._maps.get(name)
            elements, values = entry["elements"], entry["values"]
            if (
                mark is None
                or elements is not mark.elements
                or values is not mark.values
                or len(elements) < mark.elements_written
                or len(values) < mark.values_written
            ):
                ops.append(("set", (MAP_PROGRESS, name), _encode(entry)))
                continue
            path = (MAP_PROGRESS, name)
            if len(elements) > mark.elements_written:
                fresh = elements[mark.elements_written :]
                ops.append(("extend", (*path, "elements"), [_encode(e) for e in fresh]))
            if len(values) > mark.values_written:
                fresh_values = values[mark.values_written :]
                ops.append(("extend", (*path, "values"), [_encode(v) for v in fresh_values]))
            if entry["index"] != mark.index:
                ops.append(("set", (*path, "index"), entry["index"]))
        return ops

    def confirm_claim(self) -> None:
        """Raise ``ClaimLost`` if another delivery claimed the row since this pass did (one
        ``SELECT``): asked before a failure is rolled back, since undoing work is a write too
        — one the delivery now running the execution may build on."""
        if not Execution.objects.filter(
            pk=self.execution.pk, claim_generation=self.generation
        ).exists():
            raise ClaimLost(
                f"execution {self.execution.pk} was claimed by another delivery: this "
                "delivery stops without rolling back"
            )

    # -- batches of map elements --------------------------------------------------------

    def batch_due(self) -> bool:
        """Count one completed map element; True when the unwritten ones make a batch:
        ``REACTOR_MAP_CHECKPOINT_EVERY`` of them, or the oldest ``_SECONDS`` old."""
        now = time.monotonic()
        if self._unwritten_elements == 0:
            self._batch_started = now
        self._unwritten_elements += 1
        return (
            self._unwritten_elements >= reactor_settings.MAP_CHECKPOINT_EVERY
            or now - self._batch_started >= reactor_settings.MAP_CHECKPOINT_SECONDS
        )

    # -- writing ---------------------------------------------------------------------------

    def write(self, state: ExecutionState, fields: dict[str, Any], *, durable: bool) -> None:
        """One conditional UPDATE of the row: ``fields``, the heartbeat, and the context
        patched to ``state``. Raises ``ClaimLost`` when the row's claim generation moved on
        (another delivery claimed it), ``DatabaseError`` when the row is gone: nothing was
        written."""
        ops, skeleton = self.changes(state)
        execution = self.execution
        using = execution._state.db or "default"
        vendor = connections[using].vendor
        whole = (
            vendor not in PATCHING_VENDORS
            or (vendor == "sqlite" and sqlite3.sqlite_version_info < (3, 31))  # no ``[#]``
            or nesting(ops) > MAX_NESTING
            or not all(_patchable(p, vendor) for _, p, _ in ops)
        )
        now = timezone.now()
        values: dict[str, Any] = {"heartbeat_at": now, "updated_at": now, **fields}
        context: dict[str, Any] | None = None
        if whole:
            context = state.to_json()
            values["context"] = context
        elif ops:
            values["context"] = ContextPatch(ops)
        rows = Execution.objects.using(using).filter(
            pk=execution.pk, claim_generation=self.generation
        )
        if _async_commit(using, durable=durable):
            rows = rows.filter(_ASYNC_COMMIT)
        updated = rows.update(**values)
        if not updated:
            if not Execution.objects.using(using).filter(pk=execution.pk).exists():
                # deleted while it ran (as ``Model.save`` reported it before)
                raise DatabaseError(
                    f"the write of execution {execution.pk} did not affect any rows: the row "
                    "is gone"
                )
            raise ClaimLost(
                f"execution {execution.pk} was claimed by another delivery (claim generation "
                f"{self.generation} is no longer the row's): this delivery writes nothing more"
            )
        for name, value in fields.items():
            setattr(execution, name, value)
        execution.heartbeat_at = execution.updated_at = now
        if context is not None:
            execution.context = context
            self._stored_keys = set(context)
        else:
            stored = execution.context if isinstance(execution.context, dict) else {}
            for op in ops:
                _apply(stored, op)
            execution.context = stored
            self._stored_keys = set(stored)
        self._mark(state, skeleton)
        self._unwritten_elements = 0


def skeleton_of(state: ExecutionState) -> dict[str, Any]:
    """The stored form of ``state`` without its growing parts: small, compared key by key."""
    bare = replace(
        state,
        results={},
        completed=[],
        children=replace(state.children, map_progress=None),
    )
    data = bare.to_json()
    for key in _GROWING:
        data.pop(key, None)
    return data


def _encode(value: Any) -> Any:
    return encode(value, strict=False, where="execution state")


def _apply(data: dict[str, Any], op: Op) -> None:
    """Apply one op to the in-memory copy of the stored context (kept equal to the row)."""
    kind, path, value = op
    parent: Any = data
    for part in path[:-1]:
        parent = parent.setdefault(part, {}) if isinstance(parent, dict) else parent
    last = path[-1]
    if kind == "set":
        parent[last] = value
    elif kind == "extend":
        parent.setdefault(last, []).extend(value)
    else:
        parent.pop(last, None)


#: ``SET LOCAL synchronous_commit TO OFF`` as a condition of the UPDATE itself: the setting
#: lasts for the statement's own transaction (autocommit), and a commit reads it when it
#: happens — one statement, no transaction of its own around it
_ASYNC_COMMIT = RawSQL(
    "set_config('synchronous_commit', 'off', true) = 'off'", (), output_field=models.BooleanField()
)


def _async_commit(using: str, *, durable: bool) -> bool:
    """A progress write on PostgreSQL commits without waiting for the WAL flush — outside a
    caller's transaction only: there the setting would change the caller's whole commit."""
    connection = connections[using]
    return not durable and connection.vendor == "postgresql" and not connection.in_atomic_block
