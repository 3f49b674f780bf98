"""``Result``: what a run returns, and how it is rebuilt from an ``Execution`` row."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from reactor_app import exceptions
from reactor_app.conf import reactor_settings
from reactor_app.serialization import decode
from reactor_app.status import ExecutionStatus

if TYPE_CHECKING:
    from reactor_app.models import Execution


@dataclass
class Result:
    """The outcome of a run. ``status``: succeeded | failed | halted | interrupted | handed_off
    (and ``parked`` / ``pending`` / ``running`` when read from a row that is not finished)."""

    status: str
    value: Any = None
    error: BaseException | None = None
    execution_id: str | None = None
    rollback_failures: list[dict[str, Any]] = field(default_factory=list)
    halt_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.status in (ExecutionStatus.SUCCEEDED, ExecutionStatus.HALTED)

    def unwrap(self) -> Any:
        """The value, or raise the error."""
        if self.error is not None:
            raise self.error
        if self.status == ExecutionStatus.FAILED:
            raise exceptions.StepFailed("the execution failed")
        return self.value

    @classmethod
    def from_execution(cls, execution: Execution) -> Result:
        return cls(
            status=execution.status,
            value=decode(execution.result),
            error=error_from_dict(execution.error),
            execution_id=str(execution.id),
            rollback_failures=list(execution.rollback_failures or []),
            # ``engine.state.Ending``, read raw: this module loads before the models can, and
            # the state's module imports them
            halt_reason=(execution.context or {}).get("halt_reason"),
        )


def error_from_dict(data: dict[str, Any] | None) -> BaseException | None:
    """Rebuild a stored error as the matching ``ReactorError`` subclass."""
    if not data:
        return None
    fields = dict(data)
    type_name = fields.pop("type", "StepFailed")
    message = fields.pop("message", None)
    error_class = getattr(exceptions, type_name, None)
    if not (isinstance(error_class, type) and issubclass(error_class, exceptions.ReactorError)):
        error_class = exceptions.StepFailed
        fields.setdefault("cause", {"type": type_name, "message": message})
    return error_class(message, **fields)


def task_queue() -> str:
    """The queue reactor_app's tasks are sent to: ``REACTOR_CELERY_QUEUE``, else Celery's
    default queue of the current app."""
    if reactor_settings.CELERY_QUEUE:
        return reactor_settings.CELERY_QUEUE
    # deferred: this module loads with the package (while Django reads INSTALLED_APPS); Celery,
    # with kombu and billiard, is imported only when a wait times out
    from celery import current_app

    return str(current_app.conf.task_default_queue or "celery")


def _deferred_hint(execution: Execution) -> str | None:
    """Why a pending execution that is not due yet has not run: a pending row's heartbeat is
    the time it is due (``run_after``, a debounce's quiet period), and no worker runs it — nor
    the sweeper sends it — before then. Without this a wait on it blamed a missing worker."""
    due = execution.heartbeat_at
    if due is None or due <= timezone.now():
        return None
    zone = " UTC" if timezone.is_aware(due) else ""  # (a project with USE_TZ = False: local)
    return (
        f": it is not due before {due:%Y-%m-%d %H:%M:%S}{zone} (a run_after or a debounce "
        "deferred it); wait past that time"
    )


def _no_consumer_hint() -> str:
    # "pending" means no worker has picked the task up: almost always no worker consumes the
    # queue it went to (a worker started with another -Q, or none started).
    queue = task_queue()
    return (
        f": no worker has taken it from the Celery queue {queue!r}; start one that consumes "
        f"it (celery -A <project> worker{'' if queue == 'celery' else f' -Q {queue}'}) and "
        "check that its broker is CELERY_BROKER_URL"
    )


#: executions whose task this process could not send to the broker (``engine.enqueueing``):
#: id -> what the broker said, the most recent ``_UNSENT_KEPT`` only. Read by ``wait_for``: a
#: run that stays pending because its send failed is explained by that, not by a missing worker.
_unsent: OrderedDict[str, str] = OrderedDict()
_UNSENT_KEPT = 1024
_unsent_guard = threading.Lock()


def note_unsent(execution_id: object, error: BaseException) -> None:
    """Remember that sending ``execution_id``'s task failed here (its row stays pending)."""
    with _unsent_guard:
        _unsent[str(execution_id)] = f"{type(error).__name__}: {error}"
        _unsent.move_to_end(str(execution_id))
        while len(_unsent) > _UNSENT_KEPT:
            _unsent.popitem(last=False)


def note_sent(execution_id: object) -> None:
    """A send of ``execution_id``'s task succeeded: an earlier failure no longer explains it."""
    if _unsent:  # nearly always empty: no lock taken on the way of every send
        with _unsent_guard:
            _unsent.pop(str(execution_id), None)


def _unsent_hint(execution_id: object) -> str | None:
    error = _unsent.get(str(execution_id))
    if error is None:
        return None
    return (
        f": sending it to the broker failed ({error}), so no worker has it yet. The row is "
        "committed and will run: the sweeper (reactor_app.sweep, run by the workers every "
        f"REACTOR_SWEEP_INTERVAL = {reactor_settings.SWEEP_INTERVAL:g}s, or by Celery beat) "
        "sends it again once it has been pending for REACTOR_SWEEP_AFTER = "
        f"{reactor_settings.SWEEP_AFTER:g}s. Check CELERY_BROKER_URL and that the broker is up"
    )


def wait_for(execution: Execution, timeout: float, poll_interval: float) -> Result:
    """Reload ``execution`` until it is terminal or interrupted, then return its ``Result``.

    ``timeout``: seconds, 0 or more (``float("inf")``: no end); ``poll_interval``: seconds
    between reads, more than 0 and finite. Anything else is an ``InputValidationError``
    before the first read: a NaN timeout used to wait without end (no time is past NaN), a
    negative or NaN interval came out of ``time.sleep`` as its own error after a read, and
    an interval of 0 read the row in a busy loop. No sleep runs past the deadline: a
    ``poll_interval`` longer than what is left of ``timeout`` is cut to it."""
    _check_wait(timeout, poll_interval)
    deadline = time.monotonic() + timeout
    settled = {
        ExecutionStatus.SUCCEEDED,
        ExecutionStatus.FAILED,
        ExecutionStatus.HALTED,
        ExecutionStatus.CANCELLED,
        ExecutionStatus.SUPERSEDED,
        ExecutionStatus.INTERRUPTED,
    }
    while True:
        execution.refresh_from_db()
        if execution.status == ExecutionStatus.SUPERSEDED and execution.superseded_by_id:
            # a debounced start replaced by a later one: its caller waits for the run instead
            execution = type(execution)._default_manager.get(pk=execution.superseded_by_id)
            continue
        if execution.status in settled:
            return execution.to_result()
        if time.monotonic() >= deadline:
            message = f"execution {execution.id} is still {execution.status} after {timeout}s"
            if execution.status == ExecutionStatus.PENDING:
                message += (
                    _deferred_hint(execution) or _unsent_hint(execution.id) or _no_consumer_hint()
                )
            raise TimeoutError(message)
        time.sleep(min(poll_interval, max(deadline - time.monotonic(), 0.0)))


def _check_wait(timeout: Any, poll_interval: Any) -> None:
    """``InputValidationError`` naming each of ``wait``'s arguments that is out of range."""
    problems: dict[str, str] = {}
    if not _number(timeout) or not timeout >= 0:  # NaN is not >= 0
        problems["timeout"] = f"must be a number of seconds >= 0 (inf: no end), got {timeout!r}"
    if not _number(poll_interval) or not 0 < poll_interval < math.inf:
        problems["poll_interval"] = f"must be a finite number of seconds > 0, got {poll_interval!r}"
    if problems:
        described = "; ".join(f"{name} {problem}" for name, problem in problems.items())
        raise exceptions.InputValidationError(f"wait(): {described}", field_errors=problems)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
