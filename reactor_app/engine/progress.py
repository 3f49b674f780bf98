"""Writing an execution's state back: what changed, never the whole of it.

WHY: the state (``engine.state``) holds every result, the rollback log and a sequential map's
elements so far. Rewriting it at every checkpoint made a run's cost grow with the square of its
length (a 1,000-element map wrote 263 MB). Patching only the difference into the ``context``
column fixed what a checkpoint *sends*, but not what PostgreSQL *writes*: it stores a new
version of the whole (TOASTed) ``context`` value for every patch, so a 1,000-step reactor on a
worker still wrote ~176 kB of WAL per step. So the state is split in two:

* **the growing parts** — results, the rollback log, sequential maps' progress — are written
  as append-only ``ExecutionProgress`` rows: each checkpoint appends the ops that bring them to
  the state (set a result, extend the log with the new entries, extend a map's elements, ...),
  so it writes what the step (or the batch of map elements) added, whatever came before it;
* **the skeleton** — the small fixed rest (ordered positions, counters, notes, the next step)
  — stays in ``context``, patched in the database where it can be:

  - PostgreSQL: ``jsonb_set`` / ``#-`` (remove);
  - SQLite: ``json_set`` / ``json_remove``;
  - any other backend: the whole skeleton (it is small);

  the patch expression is ``engine.context_patch``.

  The context also holds ``ROWS``, the number of progress rows (``engine.state``).

``load_state`` assembles the state once per delivery: the context, then the rows past its
``FOLDED`` mark up to ``ROWS`` applied in order (``stored_context``). Rows of older versions —
the growing parts inside the context, no ``ROWS`` — read as they are, with no query; the first
write of a store on such a row moves those parts into rows (a whole "set" of each) and drops
them from the context. A whole context written from an assembled state (``state.to_json()``,
as the interrupt resume does) carries the parts and ``FOLDED = ROWS``, so it reads back right
too, and its parts move to rows on the next write the same way.

The difference is found without walking the state: results and the rollback log are
append-only while a pass runs (a step's result is written once; a rollback empties the log),
so the store keeps their lengths and their last entry, and appends the entries past them. Any
other change of those (the log emptied, a map's progress replaced) appends a row that sets that
part whole. The skeleton is compared key by key.

Every write is conditional on ``claim_generation`` (the value the delivery's claim statement
set, ``ExecutionManager.claim``), the rows' insert included (``ExecutionProgressManager.append``:
one statement on PostgreSQL): a delivery whose claim was taken over writes nothing and stops
with ``ClaimLost`` — a terminal status, once written, is not overwritten by a delivery that lost
its claim (docs/design.md, "The execution claim").

Heartbeat: a progress checkpoint leaves the indexed ``heartbeat_at`` alone until it is due
(``ProgressStore._heartbeat_due``), so that PostgreSQL can update the row in place (HOT);
status writes always refresh it.

Durability: ``write(durable=False)`` (a progress checkpoint on a worker) does not wait for the
WAL flush on PostgreSQL (``synchronous_commit`` off for the statement's transaction, set by the
statement itself: ``set_config(..., true)``, the function form of ``SET LOCAL``, so the write
stays one statement): a database crash may lose the
last fraction of a second of progress — those units re-run, as after a worker crash — never
corrupt it. The claim (with a new execution's start, ``ExecutionManager.claim``) and a pass's
end (status writes) stay synchronous (docs/operations.md, "Checkpoints"). The statements are
spelled by ``row_statements`` (SQL built per write, not the ORM's update compiler).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any

from django.db import DatabaseError, connections
from django.utils import timezone

from reactor_app.conf import reactor_settings
from reactor_app.engine.context_patch import (
    MAX_NESTING,
    PATCHING_VENDORS,
    ContextPatch,
    Op,
    patchable,
)
from reactor_app.engine.state import FOLDED, ROWS, CompletedStep, ExecutionState, MapProgress
from reactor_app.engine.worker import ClaimLost
from reactor_app.models import Execution, ExecutionProgress
from reactor_app.row_statements import LeadingInserts, conditional_update
from reactor_app.serialization import encode

RESULTS, COMPLETED, MAP_PROGRESS = "results", "completed", "map_progress"
#: the parts kept in progress rows; the rest of the state is "the skeleton", in the context
_GROWING = (RESULTS, COMPLETED, MAP_PROGRESS)
#: what the context holds besides the skeleton: the progress-row marks (``engine.state``)
_MARKS = (ROWS, FOLDED)
#: more new results than this in one write append one row setting them all (an in-process
#: run's first write is its end), not a row per result
MAX_NEW_RESULTS = 20


def stored_context(execution: Execution) -> dict[str, Any]:
    """The execution's context with its progress rows applied: the whole state in its stored
    (JSON) form — one query when the row has progress rows, none otherwise. The admin shows
    it; ``load_state`` decodes it."""
    context = dict(execution.context or {})
    rows, folded = int(context.get(ROWS, 0) or 0), int(context.get(FOLDED, 0) or 0)
    if rows <= folded:
        return context
    for key in _GROWING:
        if key in context:  # the row's own copy is not to be changed in place
            context[key] = copy.deepcopy(context[key])
    using = execution._state.db or "default"
    for kind, path, payload in ExecutionProgress.objects.db_manager(using).changes_of(
        execution.pk, folded, rows
    ):
        _apply(context, (kind, tuple(path), payload))
    context[FOLDED] = rows
    return context


def load_state(execution: Execution) -> ExecutionState:
    """The state a pass resumes from: the context and the progress rows, assembled once."""
    return ExecutionState.from_json(stored_context(execution))


@dataclass
class _MapMark:
    """What of one sequential map's progress is on the row."""

    elements: list[dict[str, Any]]
    elements_written: int
    values: list[Any]
    values_written: int
    index: int


class ProgressStore:
    """What of one execution's state is stored (its context and progress rows), and the
    statement that writes the rest."""

    def __init__(self, execution: Execution, state: ExecutionState) -> None:
        self.execution = execution
        #: the claim generation this pass owns the row with (``ExecutionManager.claim``)
        self.generation = execution.claim_generation
        stored = execution.context if isinstance(execution.context, dict) else {}
        #: progress rows the execution has (the next one appended is ``_rows + 1``)
        self._rows = int(stored.get(ROWS, 0) or 0)
        #: growing parts the context itself still holds (an older row, or a whole context
        #: written from an assembled state): the next write drops them from the context, and
        #: appends a row setting each one — but for empty results and log (a new row's ``{}``
        #: and ``[]``), which read the same absent, so they cost no row (an empty map progress
        #: does not: ``{}`` and absent are two states)
        self._in_context = {key for key in _GROWING if key in stored}
        self._to_move = {key for key in self._in_context if stored[key] or key == MAP_PROGRESS}
        #: sequential map elements completed since the last write (``batch_due``)
        self._unwritten_elements = 0
        self._batch_started = 0.0
        self._mark(state)

    # -- what is stored --------------------------------------------------------------------

    def _mark(self, state: ExecutionState, skeleton: dict[str, Any] | None = None) -> None:
        self._skeleton = skeleton if skeleton is not None else skeleton_of(state)
        self._results_written = len(state.results)
        self._last_result = next(reversed(state.results), None) if state.results else None
        self._completed_written = len(state.completed)
        self._last_record: CompletedStep | None = state.completed[-1] if state.completed else None
        self._has_maps = state.children.map_progress is not None
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

    def changes(self, state: ExecutionState) -> tuple[list[Op], list[Op], dict[str, Any]]:
        """The ops that bring the context to ``state``'s skeleton, those that bring the
        growing parts to ``state`` (appended as rows), and the new skeleton."""
        skeleton = skeleton_of(state)
        ops: list[Op] = []
        for key, value in skeleton.items():
            if key not in self._skeleton or self._skeleton[key] != value:
                ops.append(("set", (key,), value))
        ops.extend(("remove", (key,), None) for key in self._skeleton if key not in skeleton)
        ops.extend(("remove", (key,), None) for key in sorted(self._in_context))
        rows = [
            *self._result_ops(state.results),
            *self._completed_ops(state.completed),
            *self._map_ops(state.children.map_progress),
        ]
        return ops, rows, skeleton

    def _result_ops(self, results: dict[str, Any]) -> list[Op]:
        written, count = self._results_written, len(results)
        fresh = count - written
        if RESULTS in self._to_move or fresh < 0 or fresh > MAX_NEW_RESULTS:
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
            COMPLETED in self._to_move
            or len(completed) < written
            or (written and completed[written - 1] is not self._last_record)
        ):
            return [("set", (COMPLETED,), _encode([c.to_json() for c in completed]))]
        fresh = completed[written:]
        return [("extend", (COMPLETED,), [_encode(c.to_json()) for c in fresh])] if fresh else []

    def _map_ops(self, progress: dict[str, MapProgress] | None) -> list[Op]:
        if progress is None:
            # (a copy in the context is dropped with the context's own remove)
            return [("remove", (MAP_PROGRESS,), None)] if self._has_maps else []
        if MAP_PROGRESS in self._to_move or not self._has_maps:
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

    def _heartbeat_due(self, now: Any) -> bool:
        """Whether a progress checkpoint refreshes the heartbeat too: once it is a quarter of
        ``REACTOR_SWEEP_AFTER`` old. WHY not at every checkpoint: ``heartbeat_at`` is indexed
        (the sweeper's query), so a write that changes it updates every index of the table —
        PostgreSQL cannot make it a HOT update — while a checkpoint that leaves it alone
        changes no indexed column. The sweeper never needs it fresher: a live delivery keeps
        its Redis claim, which the sweeper checks before it re-enqueues anything."""
        last = self.execution.heartbeat_at
        if last is None:
            return True
        return (now - last).total_seconds() >= reactor_settings.SWEEP_AFTER / 4

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

    def write(
        self,
        state: ExecutionState,
        fields: dict[str, Any],
        *,
        durable: bool,
        leading: LeadingInserts | None = None,
    ) -> None:
        """One conditional write of the row: ``fields``, the heartbeat, the context patched to
        ``state``'s skeleton and the growing parts' changes appended as progress rows (one
        statement on PostgreSQL). Raises ``ClaimLost`` when the row's claim generation moved
        on (another delivery claimed it), ``DatabaseError`` when the row is gone: nothing of
        the row was written. ``leading``: inserts carried in front of the same statement (a
        pass's history, PostgreSQL; they are written even when the row's update matched
        nothing)."""
        ops, appended, skeleton = self.changes(state)
        rows_after = self._rows + len(appended)
        if appended:
            ops.append(("set", (ROWS,), rows_after))
        execution = self.execution
        using = execution._state.db or "default"
        vendor = connections[using].vendor
        whole = (
            vendor not in PATCHING_VENDORS
            or len(ops) > MAX_NESTING
            or not all(patchable(p, vendor) for _, p, _ in ops)
        )
        now = timezone.now()
        beat = durable or "status" in fields or self._heartbeat_due(now)
        values: dict[str, Any] = {"updated_at": now, **fields}
        if beat:
            values["heartbeat_at"] = now
        context: dict[str, Any] | None = None
        if whole:
            stored = execution.context if isinstance(execution.context, dict) else {}
            context = {**skeleton, **{k: stored[k] for k in _MARKS if k in stored}}
            if appended:
                context[ROWS] = rows_after
            values["context"] = context
        elif ops:
            values["context"] = ContextPatch(ops)
        update = conditional_update(
            Execution,
            using,
            execution.pk,
            self.generation,
            values,
            async_commit=_async_commit(using, durable=durable),
        )
        if appended:
            updated = ExecutionProgress.objects.db_manager(using).append(
                update, execution.pk, self._rows + 1, appended, leading
            )
        else:
            updated = Execution.objects.db_manager(using).write_conditional(update, leading)
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
        execution.updated_at = now
        if beat:
            execution.heartbeat_at = now
        if context is not None:
            execution.context = context
        else:
            stored = execution.context if isinstance(execution.context, dict) else {}
            for op in ops:
                _apply(stored, op)
            execution.context = stored
        self._rows = rows_after
        self._in_context, self._to_move = set(), set()
        state.folded = rows_after  # the state now holds every row: a whole write stays right
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
    for key in (*_GROWING, *_MARKS):
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


def _async_commit(using: str, *, durable: bool) -> bool:
    """A progress write on PostgreSQL commits without waiting for the WAL flush — outside a
    caller's transaction only: there the setting would change the caller's whole commit."""
    connection = connections[using]
    return not durable and connection.vendor == "postgresql" and not connection.in_atomic_block
