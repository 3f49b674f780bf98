"""Managers and querysets: every query the app makes on its models lives here.

One module on purpose, though over the usual size: it is the one place a reader looks for a
query (docs/design.md, "managers own every query"), one section per model. Split into a package
of a module per model, django-stubs' mypy plugin lost the types of the ``as_manager()``
managers on incremental runs (a warm ``.mypy_cache`` reported ``django-manager-missing``), so
``make lint`` would pass on a clean checkout and fail on the second run."""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, cast

from django.db import IntegrityError, OperationalError, connections, models, transaction
from django.utils import timezone

from reactor_app import isolation
from reactor_app.coordination import live_limits
from reactor_app.databases import RowManager
from reactor_app.row_statements import (
    LeadingInserts,
    claim_sql,
    execute_led,
    progress_append_sql,
)
from reactor_app.status import TERMINAL_STATUSES, CoordinationEventKind, ExecutionStatus

if TYPE_CHECKING:
    from reactor_app.models import Execution

_T = TypeVar("_T")

logger = logging.getLogger(__name__)


class ExecutionQuerySet(models.QuerySet):
    def for_reactor(self, reactor_path: str) -> ExecutionQuerySet:
        return self.filter(reactor=reactor_path)

    def roots(self) -> ExecutionQuerySet:
        return self.filter(parent__isnull=True)

    def parked(self) -> ExecutionQuerySet:
        return self.filter(status=ExecutionStatus.PARKED)

    def failed(self) -> ExecutionQuerySet:
        return self.filter(status=ExecutionStatus.FAILED)

    def waiting_on_interrupt(self, correlation_id: str) -> ExecutionQuerySet:
        return self.filter(status=ExecutionStatus.INTERRUPTED, correlation_id=correlation_id)

    def abandoned(self, stale_after: float, now: datetime | None = None) -> ExecutionQuerySet:
        """Running or pending executions whose worker has not been heard of for ``stale_after``s."""
        cutoff = (now or timezone.now()) - timedelta(seconds=stale_after)
        return self.filter(
            status__in=[ExecutionStatus.RUNNING, ExecutionStatus.PENDING, ExecutionStatus.PARKED],
            heartbeat_at__lt=cutoff,
            parent__isnull=True,
        )

    def with_status(self, status: str | None) -> ExecutionQuerySet:
        return self.filter(status=status) if status else self

    def of_reactor(self, reactor: str | None) -> ExecutionQuerySet:
        """By dotted path, or by class name alone (``PaymentReactor``)."""
        if not reactor:
            return self
        return self.filter(models.Q(reactor=reactor) | models.Q(reactor__endswith=f".{reactor}"))

    def created_between(
        self, after: datetime | None = None, before: datetime | None = None
    ) -> ExecutionQuerySet:
        qs = self
        if after is not None:
            qs = qs.filter(created_at__gte=after)
        if before is not None:
            qs = qs.filter(created_at__lte=before)
        return qs

    def statuses_of(self, ids: Any) -> dict[str, str]:
        """``{execution id: status}`` of those ids that name executions (others are ignored:
        a live hold may belong to a ``Step.call`` or to another database's execution)."""
        valid = set()
        for value in ids:
            try:
                valid.add(uuid.UUID(str(value)))
            except ValueError:
                continue
        if not valid:
            return {}
        rows = self.filter(pk__in=valid).values_list("pk", "status")
        return {str(pk): status for pk, status in rows}

    def with_idempotency_key(self, idempotency_key: str) -> Execution | None:
        """The execution ``run_async(idempotency_key=...)`` created under this key, if any."""
        return cast("Execution | None", self.filter(idempotency_key=idempotency_key).first())

    def finished_before(self, cutoff: datetime) -> ExecutionQuerySet:
        """Root executions that ended before ``cutoff`` (what retention may delete): finished,
        and with no part of their tree still unfinished."""
        unfinished_trees = self.exclude(status__in=TERMINAL_STATUSES).values("root_id")
        return self.filter(
            parent__isnull=True,
            status__in=TERMINAL_STATUSES,
            finished_at__lt=cutoff,
        ).exclude(pk__in=unfinished_trees)

    def search_key(self, key: str) -> ExecutionQuerySet:
        """Executions that contended on, or recorded coordination events for, ``key``."""
        return self.filter(
            models.Q(coordination_events__key=key) | models.Q(contention__key=key)
        ).distinct()


#: how many times a statement or transaction the database aborted as a deadlock's victim is
#: run (``supersede``, ``claim``: ``_again_on_deadlock``)
DEADLOCK_ATTEMPTS = 5


class ExecutionManager(RowManager.from_queryset(ExecutionQuerySet)):  # type: ignore[misc]
    def supersede(self, starts: Any, by: Any, now: datetime, *, burst: str) -> int:
        """Mark the ``starts`` of debounce ``burst`` that have not run superseded by ``by``,
        and point the starts they had superseded at ``by`` too, so every superseded row names
        the one that runs. A compare-and-set on ``pending`` and never started: a start a worker
        already took runs, even once it is pending again (resumed). Returns how many were
        marked.

        A start marked here also gets a new ``claim_generation``: a delivery that claimed it
        and decided to run it, but has not written its start yet, finds its claim gone at that
        write (``ClaimLost``) and runs nothing. Without it, the delivery's start overwrote the
        ``superseded`` status and the start ran as well as the one that replaced it.

        Every start of a burst settles on its own, concurrently, and a settle follows and moves
        pointers beyond the rows it was given, so two settles of one burst could lock rows in
        opposite orders: on PostgreSQL each deadlock cost a ``deadlock_timeout`` (1 s by
        default) while the settles held the burst's rows — and the claim statements of their
        deliveries waited behind them, until a delivery came so late that Redis had let the
        burst go. So the settles of one burst take turns: a transaction-level advisory lock
        on the burst's key (``burst_lock_key``) comes first (SQLite runs one writer at a time
        anyway). Each settle still follows the chain ``by`` was replaced along
        (``_replacement_of``): an earlier settle may have superseded ``by`` already, and the
        rows are named after the start at its end. A deadlock the database still reports
        (rows another burst's settle holds) is retried."""

        def once() -> int:
            with isolation.atomic(using=self.db):
                connection = connections[self.db]
                if connection.vendor == "postgresql":
                    with connection.cursor() as cursor:
                        cursor.execute(
                            "SELECT pg_advisory_xact_lock(%s, %s)", burst_lock_key(burst)
                        )
                return self._supersede(starts, by, now)

        return _again_on_deadlock(once)

    def _supersede(self, starts: Any, by: Any, now: datetime) -> int:
        # one lock order for every settle: by id
        list(self.select_for_update().filter(pk__in=[*starts, by]).order_by("pk").values_list("pk"))
        target = self._replacement_of(by)
        # a start that never ran: one that ran and is pending again (resumed) runs on
        won = self.filter(pk__in=starts, status=ExecutionStatus.PENDING, started_at=None).update(
            status=ExecutionStatus.SUPERSEDED,
            superseded_by=target,
            finished_at=now,
            heartbeat_at=now,
            claim_generation=models.F("claim_generation") + 1,
        )
        if won:
            replaced = self.filter(pk__in=starts, superseded_by=target).values("pk")
            self.filter(superseded_by__in=replaced).update(superseded_by=target)
        return int(won)

    def _replacement_of(self, by: Any) -> Any:
        """``by``, or the start that replaced it (and so on), its row locked (``supersede``)."""
        target, seen = by, set()
        while target not in seen:
            seen.add(target)
            row = (
                self.select_for_update()
                .filter(pk=target)
                .values_list("status", "superseded_by")
                .first()
            )
            if row is None or row[0] != ExecutionStatus.SUPERSEDED or row[1] is None:
                break
            target = row[1]
        return target

    def start(self, *, reactor: str, inputs: dict[str, Any], **fields: Any) -> Execution:
        """Create the row of a new execution (a root unless ``parent`` is given)."""
        execution: Execution = self.model(reactor=reactor, inputs=inputs, **fields)
        if execution.parent_id is None:
            execution.root_id = execution.id
        execution.save(force_insert=True)
        return execution

    def claim(self, pk: Any, statuses: tuple[str, ...], *, start: str | None = None) -> Any:
        """A worker delivery's claim on the row: one ``UPDATE ... RETURNING`` that increments
        ``claim_generation``, touches the heartbeat and returns the row — None if it is gone
        or not in ``statuses``. Every later write of the delivery is conditional on the
        generation it returned (``engine.progress``): if another delivery claims the row
        meanwhile (a claim lost with a restarted Redis), this one writes nothing more.

        ``start`` (the first step, named by a new execution's message): a row still pending
        that never started is marked running at that step by the same statement — the pass's
        start, one round trip fewer (``row_statements.claim_sql``). The returned row then has
        ``claimed_start`` True (a row started before, or only claimed, has it False).

        The statement is its own transaction on a worker (autocommit), so one the database
        aborted as a deadlock's victim wrote nothing and is sent again: concurrent debounce
        settles lock the rows of a burst (``supersede``), and a claim queued on one of them
        was caught in their cycle — the delivery failed and the start waited for the sweep."""
        model = self.model
        connection = connections[self.db]
        now = timezone.now()
        folds = start is not None and connection.vendor in ("postgresql", "sqlite")
        sql, params = claim_sql(
            model,
            self.db,
            pk,
            statuses,
            now,
            start=(ExecutionStatus.PENDING, ExecutionStatus.RUNNING, str(start)) if folds else None,
        )

        def once() -> Any:
            if not connection.features.can_return_columns_from_insert:
                # a database without RETURNING (SQLite before 3.35): the update, then the read
                with connection.cursor() as cursor:
                    cursor.execute(sql[: sql.index(" RETURNING ")], params)
                    claimed = cursor.rowcount
                return self.filter(pk=pk).first() if claimed else None
            # all rows fetched at once: SQLite ends an UPDATE ... RETURNING only then
            rows = list(self.raw(sql, params).using(self.db))
            return rows[0] if rows else None

        # inside a caller's transaction a failed statement aborts the whole of it: not again
        row = _one_statement(connection, once)
        if row is not None:
            # the start was this statement's when the row now carries its very timestamp
            row.claimed_start = bool(
                folds and row.status == ExecutionStatus.RUNNING and row.started_at == now
            )
        return row

    def write_conditional(
        self, update: tuple[str, list[Any]], leading: LeadingInserts | None = None
    ) -> int:
        """A delivery's conditional update of its execution row (SQL and params, from
        ``row_statements.conditional_update``); the number of rows updated (0: the row is gone
        or another delivery claimed it). ``leading``: inserts written in the same statement
        (PostgreSQL). Sent again when the database aborts it (``_one_statement``)."""
        connection = connections[self.db]

        def once() -> int:
            with connection.cursor() as cursor:
                execute_led(cursor, *update, leading)
                return int(cursor.rowcount)

        return _one_statement(connection, once)


class ExecutionProgressManager(RowManager):
    """The append-only progress rows of executions (``models.ExecutionProgress``)."""

    def changes_of(self, execution_id: Any, after: int, upto: int) -> Any:
        """``(kind, path, payload)`` of the rows ``after < seq <= upto``, in order."""
        return (
            self.filter(execution_id=execution_id, seq__gt=after, seq__lte=upto)
            .order_by("seq")
            .values_list("kind", "path", "payload")
        )

    def append(
        self,
        update: tuple[str, list[Any]],
        execution_id: Any,
        first_seq: int,
        changes: Sequence[tuple[str, Any, Any]],
        leading: LeadingInserts | None = None,
    ) -> int:
        """The conditional ``update`` of one execution row (SQL and params, from
        ``row_statements.conditional_update``) and, only if it updated the row, ``changes``
        appended as rows ``first_seq, first_seq+1, ...``. Returns the number of execution
        rows updated (0: nothing was written).

        PostgreSQL: one statement, ``WITH claimed AS (UPDATE ... RETURNING id) INSERT ...
        SELECT ... FROM claimed``: the insert happens exactly when the conditional update did,
        under the row lock the update took (a claim that moved on meanwhile is seen by the
        update's re-check, so a delivery that lost its claim inserts nothing). Elsewhere: the
        update, then the insert if it matched, in one transaction (SQLite has one writer at a
        time, so nothing claims the row between the two). ``leading``: inserts written in the
        same statement (PostgreSQL only)."""
        connection = connections[self.db]
        update_sql, update_params = update
        if connection.vendor == "postgresql":
            return self._append_in_one_statement(
                update_sql, update_params, execution_id, first_seq, changes, leading
            )
        if leading is not None:
            raise ValueError("leading inserts ride only in PostgreSQL's one-statement append")
        with transaction.atomic(using=self.db), connection.cursor() as cursor:
            cursor.execute(update_sql, update_params)
            updated = int(cursor.rowcount)
            if updated:
                self.bulk_create(
                    self.model(
                        execution_id=execution_id,
                        seq=first_seq + n,
                        kind=kind,
                        path=list(path),
                        payload=payload,
                    )
                    for n, (kind, path, payload) in enumerate(changes)
                )
        return updated

    def _append_in_one_statement(
        self,
        update_sql: str,
        update_params: list[Any],
        execution_id: Any,
        first_seq: int,
        changes: Sequence[tuple[str, Any, Any]],
        leading: LeadingInserts | None,
    ) -> int:
        sql, params = progress_append_sql(
            self.model, self.db, update_sql, update_params, first_seq, changes
        )
        connection = connections[self.db]

        def once() -> int:
            with connection.cursor() as cursor:
                execute_led(cursor, sql, params, leading)
                return 1 if cursor.rowcount else 0

        return _one_statement(connection, once)


class StepRunQuerySet(models.QuerySet):
    def for_execution(self, execution_id: Any) -> StepRunQuerySet:
        return self.filter(execution_id=execution_id).order_by("started_at", "id")

    def of_kind(self, kind: str) -> StepRunQuerySet:
        return self.filter(kind=kind)


class ContentionStateQuerySet(models.QuerySet):
    def active(self) -> ContentionStateQuerySet:
        return self.filter(execution__status=ExecutionStatus.PARKED).select_related("execution")

    def for_key(self, key: str) -> ContentionStateQuerySet:
        return self.filter(key=key)

    def matching(
        self,
        *,
        key: str | None = None,
        primitive: str | None = None,
        step: str | None = None,
        reactor: str | None = None,
    ) -> ContentionStateQuerySet:
        """The operator filters of the contention listing (each one optional)."""
        qs = self
        if key:
            qs = qs.filter(key=key)
        if primitive:
            qs = qs.filter(primitive=primitive)
        if step is not None:
            qs = qs.filter(step=step)
        if reactor:
            qs = qs.filter(
                models.Q(execution__reactor=reactor)
                | models.Q(execution__reactor__endswith=f".{reactor}")
            )
        return qs

    def newest_first(self) -> ContentionStateQuerySet:
        return self.order_by("-updated_at", "-id")


class CoordinationEventQuerySet(models.QuerySet):
    def for_key(self, key: str) -> CoordinationEventQuerySet:
        return self.filter(key=key)

    def between(self, start: datetime | None, end: datetime | None) -> CoordinationEventQuerySet:
        qs = self
        if start is not None:
            qs = qs.filter(at__gte=start)
        if end is not None:
            qs = qs.filter(at__lte=end)
        return qs

    def timeline(self, key: str, start: datetime, end: datetime) -> CoordinationEventQuerySet:
        return self.for_key(key).between(start, end).order_by("at", "id")

    def span(self, key: str, since: datetime) -> tuple[datetime, datetime] | None:
        """The first and last event time of ``key`` since ``since`` (None: no events)."""
        bounds = (
            self.for_key(key)
            .filter(at__gte=since)
            .aggregate(first=models.Min("at"), last=models.Max("at"))
        )
        if bounds["first"] is None:
            return None
        return bounds["first"], bounds["last"]

    def opened_before(self, key: str, start: datetime) -> CoordinationEventQuerySet:
        """Acquisitions and parks of ``key`` made before ``start`` whose bars may reach into a
        timeline beginning at ``start`` (a hold taken 2 h ago and still running)."""
        return self.for_key(key).filter(at__lt=start).order_by("-at", "-id")

    def matching(
        self,
        *,
        key: str | None = None,
        execution: Any = None,
        kind: str | None = None,
        primitive: str | None = None,
        step: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> CoordinationEventQuerySet:
        """The operator filters of the event listing (each one optional)."""
        qs = self.between(since, until)
        if key:
            qs = qs.filter(key=key)
        if execution:
            qs = qs.filter(execution_id=execution)
        if kind:
            qs = qs.filter(kind=kind)
        if primitive:
            qs = qs.filter(primitive=primitive)
        if step is not None:
            qs = qs.filter(step=step)
        return qs

    def of_executions(self, execution_ids: Any) -> CoordinationEventQuerySet:
        return self.filter(execution_id__in=execution_ids)

    def unattached_before(self, cutoff: datetime) -> CoordinationEventQuerySet:
        """Events of no execution (``Step.call``, operator actions) older than ``cutoff``."""
        return self.filter(execution__isnull=True, at__lt=cutoff)

    def recent_keys(self, since: datetime, limit: int = 50) -> list[tuple[str, str]]:
        """``(primitive, key)`` pairs seen since ``since``, most recently active first."""
        rows = (
            self.filter(at__gte=since)
            # a limit change names a limit, not a coordination key
            .exclude(kind=CoordinationEventKind.LIMIT_CHANGED)
            .values("primitive", "key")
            .annotate(last=models.Max("at"))
            .order_by("-last")[:limit]
        )
        return [(row["primitive"], row["key"]) for row in rows]


class LimitOverrideQuerySet(models.QuerySet):
    def current(self) -> dict[tuple[str, str], Any]:
        """``(primitive, name) -> row`` of every override in force."""
        rows: list[Any] = list(self.order_by("primitive", "name"))
        return {(row.primitive, row.name): row for row in rows}

    def published(self) -> dict[str, Any]:
        """The overrides as ``coordination.live_limits`` publishes them."""
        return {
            live_limits.field_name(primitive, name): live_limits.Override(
                primitive=primitive,
                name=name,
                value=row.value,
                by=row.set_by,
                at=row.set_at.timestamp(),
                reason=row.reason,
            )
            for (primitive, name), row in self.current().items()
        }

    def publish(self) -> None:
        """Publish every override to Redis (``coordination.live_limits``), replacing what
        was there — read after the publish took its ticket, so a concurrent change's publish
        never lands a set older than this one over it (``live_limits.publish``)."""
        live_limits.publish(self.published)

    def republish_if_lost(self) -> bool:
        """Publish again when Redis disagrees with the database (a publish that failed, a
        restarted Redis without persistence): the workers' sweep calls it. True if it did."""
        expected = self.published()
        seen = live_limits.read_published()
        if {k: v.value for k, v in seen.items()} == {k: v.value for k, v in expected.items()}:
            return False
        live_limits.publish(self.published)  # read again, after its ticket
        return True

    def locked(self, primitive: str, name: str) -> Any:
        """The override row of one limit, locked for the change being made (None: none)."""
        return self.select_for_update().filter(primitive=primitive, name=name).first()

    def put(self, primitive: str, name: str, **fields: Any) -> Any:
        """Write the override of one limit, created or updated, inside the caller's
        transaction; returns the value it replaced (None: there was no override). The row
        stays locked until the caller commits, so concurrent changes of one limit are
        serialized and each one learns the value it really replaced (its audit's ``old``).

        The first override of a name has no row to lock: two concurrent firsts both find none
        and both insert, and the unique constraint refuses the later insert (PostgreSQL makes
        it wait for the earlier transaction, then raises). That insert is undone alone (its
        savepoint) and the change is made to the row the other one committed, now locked:
        the last write wins and both are changes, never a server error."""
        row = self.locked(primitive, name)
        if row is None:
            try:
                with transaction.atomic(using=self.db):
                    self.create(primitive=primitive, name=name, **fields)
                return None
            except IntegrityError:
                row = self.locked(primitive, name)
                if row is None:  # pragma: no cover - inserted, then removed before our read
                    raise
        old = row.value
        for field, value in fields.items():
            setattr(row, field, value)
        row.save()
        return old


def _one_statement(connection: Any, once: Callable[[], _T]) -> _T:
    """``once()``, one statement of a delivery, sent again while the database aborts it as a
    deadlock's victim, a serialization failure or a lock wait past the project's
    ``lock_timeout`` — outside a transaction only, where the aborted statement wrote nothing.
    A serialization failure is what a conditional update that waited for a row another
    delivery's claim changed meets when the server runs single statements at REPEATABLE READ
    or above (a database's or role's
    ``default_transaction_isolation``): sent again, the statement sees the claim's generation
    and updates nothing, and the delivery stops as a lost claim (reactor_app/isolation.py)."""
    return once() if connection.in_atomic_block else _again_on_deadlock(once)


def _again_on_deadlock(once: Callable[[], _T]) -> _T:
    """``once()``, run again (after a short pause, up to ``DEADLOCK_ATTEMPTS``) while the
    database aborts it as a deadlock's victim; ``once`` must be a whole transaction, so that
    an aborted run wrote nothing."""
    attempt = 1
    while True:
        try:
            return once()
        except OperationalError as exc:
            if attempt == DEADLOCK_ATTEMPTS or not _is_deadlock(exc):
                raise
            logger.warning(
                "aborted as a deadlock's victim, a serialization failure or a lock timeout "
                "(attempt %d): running it again",
                attempt,
            )
        time.sleep(0.005 * attempt)
        attempt += 1


#: the first half of the advisory lock key of a debounce burst's settles (``burst_lock_key``):
#: "rd" (reactor_app, debounce), so that they share no key with an application's own locks
#: that use the two-number form with another first number
BURST_LOCK_SPACE = 0x7264


def burst_lock_key(burst: str) -> tuple[int, int]:
    """The two-number advisory lock key that serializes the settles of ``burst`` (``supersede``):
    a fixed space and a 32-bit hash of the burst's key. Two bursts whose keys collide only
    take turns needlessly."""
    digest = hashlib.blake2b(burst.encode(), digest_size=4).digest()
    return BURST_LOCK_SPACE, int.from_bytes(digest, "big", signed=True)


#: PostgreSQL's SQLSTATEs of a transaction it aborted before it wrote anything that stays, and
#: that may go through when run again: a deadlock's victim, a serialization failure, and a wait
#: for a row lock that outlasted the project's ``lock_timeout`` (a database's, role's or
#: connection's setting; the app never waits with ``NOWAIT``)
_RUN_AGAIN = ("40P01", "40001", "55P03")


def _is_deadlock(error: OperationalError) -> bool:
    """A deadlock, a serialization failure or a lock timeout the database resolved by aborting
    this transaction (``_RUN_AGAIN``): safe to run the transaction again."""
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) in _RUN_AGAIN or "deadlock" in str(error)


# -- the managers of the querysets above: each reads where its model is written
# (``reactor_app.databases``), as ``Execution.objects`` does


class StepRunManager(RowManager.from_queryset(StepRunQuerySet)):  # type: ignore[misc]
    """``StepRun.objects``."""


class ContentionStateManager(RowManager.from_queryset(ContentionStateQuerySet)):  # type: ignore[misc]
    """``ContentionState.objects`` (and its proxy ``ParkedExecution``)."""


class CoordinationEventManager(RowManager.from_queryset(CoordinationEventQuerySet)):  # type: ignore[misc]
    """``CoordinationEvent.objects`` (and its proxy ``Coordination``)."""


class LimitOverrideManager(RowManager.from_queryset(LimitOverrideQuerySet)):  # type: ignore[misc]
    """``LimitOverride.objects``."""
