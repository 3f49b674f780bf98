"""The closed vocabularies of reactor_app: execution and step-run statuses, event kinds."""

from __future__ import annotations

from django.db import models


class ExecutionStatus(models.TextChoices):
    PENDING = "pending", "pending"  # persisted, enqueued, not started
    RUNNING = "running", "running"
    PARKED = "parked", "parked"  # waiting on contention; never a failure
    INTERRUPTED = "interrupted", "interrupted"  # paused at an interrupt step
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    HALTED = "halted", "halted"
    CANCELLED = "cancelled", "cancelled"  # stopped by an operator, completed steps rolled back
    SUPERSEDED = "superseded", "superseded"  # a later start of its debounce burst runs instead


TERMINAL_STATUSES = frozenset(
    {
        ExecutionStatus.SUCCEEDED,
        ExecutionStatus.FAILED,
        ExecutionStatus.HALTED,
        ExecutionStatus.CANCELLED,
        ExecutionStatus.SUPERSEDED,
    }
)


class StepRunKind(models.TextChoices):
    RUN = "run", "run"
    COMPENSATE = "compensate", "compensate"
    UNDO = "undo", "undo"


class StepRunStatus(models.TextChoices):
    STARTED = "started", "started"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    SKIPPED = "skipped", "skipped"
    RETRIED = "retried", "retried"  # this attempt failed and another follows
    HALTED = "halted", "halted"
    PARKED = "parked", "parked"


class EngineEvent(models.TextChoices):
    """The closed set of engine events (each one is also a Django signal in ``signals``)."""

    EXECUTION_STARTED = "execution_started"
    EXECUTION_SUCCEEDED = "execution_succeeded"
    EXECUTION_FAILED = "execution_failed"
    EXECUTION_HALTED = "execution_halted"
    EXECUTION_PARKED = "execution_parked"
    EXECUTION_RESUMED = "execution_resumed"
    EXECUTION_INTERRUPTED = "execution_interrupted"
    EXECUTION_CANCELLED = "execution_cancelled"
    STEP_STARTED = "step_started"
    STEP_SUCCEEDED = "step_succeeded"
    STEP_FAILED = "step_failed"
    STEP_SKIPPED = "step_skipped"
    STEP_RETRIED = "step_retried"
    COMPENSATION_STARTED = "compensation_started"
    COMPENSATION_SUCCEEDED = "compensation_succeeded"
    COMPENSATION_FAILED = "compensation_failed"
    UNDO_STARTED = "undo_started"
    UNDO_SUCCEEDED = "undo_succeeded"
    UNDO_FAILED = "undo_failed"


class CoordinationEventKind(models.TextChoices):
    """The closed set of coordination events (rows of ``CoordinationEvent`` and signals)."""

    ACQUIRED = "acquired"
    RELEASED = "released"
    #: a release that could not reach the store: the hold stays taken until its lease lapses
    RELEASE_FAILED = "release_failed"
    ACQUISITION_FAILED = "acquisition_failed"
    PARKED = "parked"
    RESUMED = "resumed"
    EXTENDED = "extended"
    LEASE_LOST = "lease_lost"
    HANDOFF_REFUSED = "handoff_refused"
    FORCED_RELEASE = "forced_release"
    ORDERED_SKIPPED = "ordered_skipped"
    ORDERED_RESET = "ordered_reset"
    CANCELLED = "cancelled"  # an operator cancelled the execution (audit; detail: by, reason)
    #: an operator set or removed a live override of a named limit (audit; key: the limit's
    #: name; detail: by, action, old, new, reason, settings)
    LIMIT_CHANGED = "limit_changed"
