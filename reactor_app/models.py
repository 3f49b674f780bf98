"""ORM models: executions, step runs, contention state and coordination events.

The ORM is the source of truth for executions; Redis is the source of truth for holds (the
events here are a history of them, not a copy of live state).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models

from reactor_app.coordination.keys import LONGEST_USER_KEY
from reactor_app.engine.result import Result, wait_for
from reactor_app.managers import (
    ContentionStateManager,
    CoordinationEventManager,
    ExecutionManager,
    ExecutionProgressManager,
    LimitOverrideManager,
    StepRunManager,
)
from reactor_app.status import (
    TERMINAL_STATUSES,
    CoordinationEventKind,
    ExecutionStatus,
    StepRunKind,
    StepRunStatus,
)

#: version of the JSON layout stored in ``Execution.context``
CONTEXT_SCHEMA_VERSION = 1


def empty_context() -> dict[str, Any]:
    return {"version": CONTEXT_SCHEMA_VERSION}


class Execution(models.Model):
    """One run of a reactor (a root, or a composed / async child of one)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    reactor = models.CharField(max_length=255, help_text="dotted path of the reactor class")
    status = models.CharField(
        max_length=16, choices=ExecutionStatus.choices, default=ExecutionStatus.PENDING
    )
    inputs = models.JSONField(default=dict)
    context = models.JSONField(default=empty_context, help_text="persisted engine state")
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    rollback_failures = models.JSONField(default=list, blank=True)
    # no index of its own: ``reactor_exec_root_idx`` (Meta) is that index (a second copy
    # cost every insert and every status write an index entry for nothing)
    root = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="tree",
        db_index=False,
    )
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    current_step = models.CharField(max_length=255, blank=True, default="")
    correlation_id = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    idempotency_key = models.CharField(
        max_length=255,
        null=True,
        blank=True,
        help_text="run_async(idempotency_key=...): a second call with this key returns this row",
    )
    retry_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="retries",
        help_text="the failed execution this one retries (Execution.retry)",
    )
    claim_generation = models.PositiveBigIntegerField(
        default=0,
        editable=False,
        help_text="incremented by each worker delivery's claim; the delivery's later writes "
        "are conditional on it (a delivery that lost its claim writes nothing)",
    )

    superseded_by = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="supersedes",
        help_text="a superseded start of a debounce burst: the execution that ran instead",
    )

    objects = ExecutionManager()

    #: not a column: True on a row returned by a delivery's claim statement that also wrote
    #: the pass's start (``ExecutionManager.claim``)
    claimed_start = False

    class Meta:
        ordering = ("-created_at",)
        # a row's parent, root, retry or replacement is read where rows are written too
        # (``reactor_app.databases``), not where a router sends other reads
        base_manager_name = "objects"
        indexes = [
            models.Index(fields=["status", "-created_at"], name="reactor_exec_status_idx"),
            models.Index(fields=["reactor", "-created_at"], name="reactor_exec_reactor_idx"),
            models.Index(fields=["root"], name="reactor_exec_root_idx"),
            models.Index(fields=["correlation_id"], name="reactor_exec_corr_idx"),
            models.Index(fields=["status", "heartbeat_at"], name="reactor_exec_sweep_idx"),
            models.Index(fields=["finished_at"], name="reactor_exec_finished_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["idempotency_key"], name="reactor_exec_idempotency_key_uniq"
            )
        ]
        permissions = [("cancel_execution", "Can cancel executions")]

    def __str__(self) -> str:
        return f"{self.reactor.rsplit('.', 1)[-1]} {self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def reactor_name(self) -> str:
        return self.reactor.rsplit(".", 1)[-1]

    def to_result(self) -> Result:
        """The ``Result`` this execution's row describes."""
        return Result.from_execution(self)

    def retry(
        self, from_step: str | None = None, *, on_worker: bool | None = None, by: str = ""
    ) -> Execution:
        """Run this failed execution again from ``from_step`` (default: the step that failed),
        as a new execution linked by ``retry_of``, reusing the recorded results of the steps
        before it. See ``reactor_app.engine.retry`` for what is reused and where it runs."""
        # deferred: the engine imports the models; the model method hands over to it
        from reactor_app.engine.retry import retry

        return retry(self, from_step=from_step, on_worker=on_worker, by=by)

    def cancel(self, reason: str = "", *, by: str | None = None) -> Execution:
        """Cancel this execution: pending, parked and interrupted ones end ``cancelled`` now
        (completed steps rolled back, holds released, waiters woken); a running one stops at
        its next step boundary or ``context.checkpoint()`` (see ``engine.cancel``). Raises
        ``ExecutionNotCancellable`` when it has already ended. Returns the refreshed row."""
        # deferred: the engine imports the models; the model method hands over to it
        from reactor_app.engine.cancel import cancel_execution

        row = cancel_execution(self.pk, reason, by=by)
        self.refresh_from_db()
        return row

    def wait(self, timeout: float = 30.0, poll_interval: float = 0.05) -> Result:
        """Block until the execution is terminal (or interrupted) and return its ``Result``;
        ``TimeoutError`` after ``timeout`` seconds. The arguments' ranges: ``wait_for``."""
        return wait_for(self, timeout=timeout, poll_interval=poll_interval)


class ExecutionProgress(models.Model):
    """One change of an execution's growing state, appended by a checkpoint (``engine.progress``).

    WHY rows: results, the rollback log and a sequential map's elements grow with the run.
    Patching them inside ``Execution.context`` sends only what changed, but PostgreSQL still
    writes a new version of the whole (TOASTed) value for every patch, so a checkpoint's cost
    grew with the run. Appending a row per checkpoint keeps it flat; the context keeps the small
    fixed rest and the number of rows (``engine.state.ROWS``). A delivery reads the rows once,
    when it starts, and applies them in ``seq`` order. ``kind``/``path``/``payload`` are one op:
    set ``payload`` at ``path``, extend the list at ``path`` with ``payload``, or remove ``path``.
    """

    execution = models.ForeignKey(
        Execution, on_delete=models.CASCADE, related_name="progress", db_index=False
    )
    seq = models.PositiveBigIntegerField(help_text="1, 2, ... per execution: the order to apply")
    kind = models.CharField(max_length=8, help_text="set, extend or remove")
    path = models.JSONField(default=list, help_text="where in the state, key by key")
    payload = models.JSONField(null=True, blank=True)

    objects = ExecutionProgressManager()

    class Meta:
        ordering = ("execution", "seq")
        verbose_name_plural = "execution progress"
        constraints = [
            # also the index a delivery reads its rows by; a second writer of one seq (a
            # delivery that lost its claim) fails instead of interleaving
            models.UniqueConstraint(fields=["execution", "seq"], name="reactor_progress_seq_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.execution_id} #{self.seq} {self.kind} {'.'.join(map(str, self.path))}"


class StepRun(models.Model):
    """One attempt at running, compensating or undoing a step."""

    # indexed by ``reactor_steprun_exec_idx`` (execution, started_at), which serves every
    # look-up by execution: no index of its own (one index write less per step run)
    execution = models.ForeignKey(
        Execution, on_delete=models.CASCADE, related_name="step_runs", db_index=False
    )
    step = models.CharField(max_length=255)
    kind = models.CharField(max_length=16, choices=StepRunKind.choices, default=StepRunKind.RUN)
    attempt = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=16, choices=StepRunStatus.choices)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    objects = StepRunManager()

    class Meta:
        ordering = ("started_at", "id")
        indexes = [
            models.Index(fields=["execution", "started_at"], name="reactor_steprun_exec_idx"),
            models.Index(fields=["step", "status"], name="reactor_steprun_step_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.step} {self.kind}#{self.attempt} {self.status}"


class ContentionState(models.Model):
    """Why a parked execution is waiting: one row per (execution, step)."""

    # indexed by the unique (execution, step) constraint, which serves every look-up by
    # execution: no index of its own
    execution = models.ForeignKey(
        Execution, on_delete=models.CASCADE, related_name="contention", db_index=False
    )
    step = models.CharField(max_length=255, blank=True, default="", help_text="'' = reactor level")
    primitive = models.CharField(max_length=32)
    key = models.CharField(max_length=LONGEST_USER_KEY)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    blocker = models.JSONField(null=True, blank=True, help_text="holder, step, since, ttl left")
    updated_at = models.DateTimeField(auto_now=True)

    objects = ContentionStateManager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["execution", "step"], name="reactor_contention_unique")
        ]
        indexes = [models.Index(fields=["key"], name="reactor_contention_key_idx")]

    def __str__(self) -> str:
        return f"{self.execution_id} parked on {self.primitive} {self.key}"


class CoordinationEvent(models.Model):
    """A history row for a hold: acquired, released, refused, parked, forced release, ..."""

    # indexed by ``reactor_event_exec_idx`` (execution, at), which serves every look-up by
    # execution: no index of its own (one index write less per event)
    execution = models.ForeignKey(
        Execution,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="coordination_events",
        db_index=False,
    )
    step = models.CharField(max_length=255, blank=True, default="", help_text="'' = reactor level")
    reactor = models.CharField(max_length=255, blank=True, default="")
    primitive = models.CharField(max_length=32)
    key = models.CharField(max_length=LONGEST_USER_KEY)
    kind = models.CharField(max_length=32, choices=CoordinationEventKind.choices)
    owner = models.CharField(max_length=64, blank=True, default="")
    token = models.BigIntegerField(null=True, blank=True)
    at = models.DateTimeField()
    detail = models.JSONField(default=dict, blank=True)

    objects = CoordinationEventManager()

    class Meta:
        ordering = ("-at", "-id")
        indexes = [
            models.Index(fields=["key", "at"], name="reactor_event_key_idx"),
            models.Index(fields=["execution", "at"], name="reactor_event_exec_idx"),
            models.Index(fields=["kind", "at"], name="reactor_event_kind_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.primitive} {self.key}"


class LimitOverride(models.Model):
    """An operator's live override of a named limit (``REACTOR_LIMITS`` for semaphores,
    ``REACTOR_RATE_LIMITS`` for rate limits): the record of what is in force; every process
    obeys the copy published to Redis (``coordination.live_limits``). Each change is audited
    as a ``limit_changed`` ``CoordinationEvent`` (who, when, old → new, reason)."""

    primitive = models.CharField(
        max_length=32, choices=[("semaphore", "semaphore"), ("rate_limit", "rate limit")]
    )
    name = models.CharField(max_length=255, help_text="the limit's name in settings")
    value = models.JSONField(
        help_text='{"limit": n} for a semaphore; {"limit", "period"} or {"limits"} for a rate limit'
    )
    reason = models.TextField(blank=True, default="")
    set_by = models.CharField(max_length=150, blank=True, default="")
    set_at = models.DateTimeField()

    objects = LimitOverrideManager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["primitive", "name"], name="reactor_limit_unique")
        ]
        permissions = [("override_limit", "Can override semaphore and rate limits live")]

    def __str__(self) -> str:
        return f"{self.primitive} {self.name} = {self.value}"


# -- admin anchors ----------------------------------------------------------------------------
# Proxies (no tables) that give the admin an entry of its own for a question operators ask:
# "which executions are parked, and on what?" and "who holds what right now?".


class ParkedExecution(ContentionState):
    """A parked execution and why it waits (the admin lists only executions still parked)."""

    class Meta:
        proxy = True
        verbose_name = "parked execution"
        verbose_name_plural = "parked executions"


class Coordination(CoordinationEvent):
    """Anchor of the admin's Coordination page (live Redis state) and of operator permissions.

    ``force_release`` guards every operator action that changes live coordination state:
    force-releasing a hold and skipping or resetting an ordered lock.
    """

    class Meta:
        proxy = True
        verbose_name = "coordination"
        verbose_name_plural = "coordination"
        default_permissions = ("view",)
        permissions = [
            ("force_release", "Can force-release holds and skip or reset ordered locks"),
        ]
