"""Cancelling an execution (``Execution.cancel``, the admin action, the API endpoint).

A cancel is a request first: a Redis key per execution (``{prefix}:cancel:<id>``, the reason
and who asked) that every process running the execution polls — at each step boundary, at the
start of every pass and at ``context.checkpoint()`` — so it works whichever process (a Celery
worker, a web process running ``Reactor.run``) is inside the run. Reading the flag is a Redis
round trip, the largest cost of an uncoordinated step, so step boundaries and checkpoints read
it at most every ``REACTOR_CANCEL_POLL`` seconds (default 0.05) per run: a run stops at the
first boundary after that much time has passed since the request, at the latest. A cancel
requested by the very process running the execution is seen at its next boundary; the decision
whether a failure was a cancel always reads the flag, and so does the start of a pass — from the
read the delivery's claim made in its own round trip when that read is younger than
``REACTOR_CANCEL_POLL`` and this process has requested no cancel of the run since. Then:

* **Not running on a worker** (pending, parked, interrupted, with ``state.origin.worker``): the
  canceller records the request and returns at once — the rollback is a worker's job, never the
  web request's. It sends a delivery (an interrupted execution becomes ``pending`` first, under
  a row lock, so ``resume()`` is refused from now on); that pass reads the flag at its start
  and never runs another step: it rolls back the completed steps newest first under their
  locks — waiting, on the worker, for a parallel map's running elements, whose own deliveries
  stop at their next boundary — while the reactor-level holds it kept across its park are
  still held, then releases those kept holds and whatever its held-key registry lists,
  abandons its ordered positions and wakes the waiters of everything it freed. A child
  (a parallel map's element, an ``async_step``) whose tree was cancelled before it started
  never starts its body (``engine.steps.execute_async_step``). The sweeper re-sends a lost
  delivery.
* **Not running, in-process** (an interrupted execution of a reactor that runs in the caller):
  no worker may exist to hand it to, so the canceller ends it itself: it takes the execution
  claim a delivery would take, flips the row out of its resumable status under a row lock (so
  ``resume()`` cannot race it), rolls back and lets go as above.
* **Running**: the process running it sees the flag at its next step boundary (or a
  ``checkpoint()`` inside a step raises ``ExecutionCancelled``), rolls back its completed steps
  under their locks like a failure, releases its holds (outcome ``halt``: an ordered line is not
  stopped, a period bucket is not marked) and wakes the waiters.
* A pending or parked execution whose delivery holds the claim right now is running for this
  purpose: that delivery sees the flag.

The request flag and its polling live in ``engine.cancel_flag``; ending a run that was asked to
stop (rollback, letting go of kept holds) in ``engine.cancelled``; this module is the
canceller's side, ``cancel_execution``.

Either way the execution ends ``cancelled`` (distinct from ``failed``), its error an
``ExecutionCancelled`` with the reason, its ``rollback_failures`` recorded, and an audit
``CoordinationEvent`` notes who cancelled it.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.utils import timezone

from reactor_app import isolation
from reactor_app.dsl.registry import lookup
from reactor_app.engine.cancel_flag import cancelled_error, clean_reason, request_cancel
from reactor_app.engine.cancelled import end_cancelled
from reactor_app.engine.claim import ExecutionClaim
from reactor_app.engine.enqueueing import enqueue_on_commit, enqueue_quietly
from reactor_app.engine.executor import ExecutionRun
from reactor_app.engine.inputs import who_asked
from reactor_app.engine.outcomes import RunEnd
from reactor_app.engine.priority import stored_message_priority
from reactor_app.engine.state import ExecutionState
from reactor_app.exceptions import ExecutionNotCancellable, ReactorError
from reactor_app.models import Execution
from reactor_app.status import TERMINAL_STATUSES, CoordinationEventKind, ExecutionStatus
from reactor_app.tracking import record_coordination

logger = logging.getLogger(__name__)

#: statuses the canceller ends itself (nothing is inside the run)
IDLE = (ExecutionStatus.PENDING, ExecutionStatus.PARKED, ExecutionStatus.INTERRUPTED)


def cancel_execution(execution_id: Any, reason: Any = "", *, by: str | None = None) -> Execution:
    """Cancel the execution (see the module docstring); returns its row as it is now.

    Raises ``Execution.DoesNotExist``, ``ExecutionNotCancellable`` (already ended),
    ``InputValidationError`` (a reason that is not text) or ``CoordinationUnavailable``."""
    text = clean_reason(reason)
    by = who_asked(by, "cancel")
    execution = Execution.objects.get(pk=execution_id)
    _refuse_ended(execution)
    # The flag first: any pass that starts or reaches a boundary from now on stops.
    earlier = request_cancel(execution.id, text, by)
    _flag_children(execution, text, by)
    # a second cancel keeps the first one's reason (it wins the error) and is an event of its own
    request = earlier or {"reason": text, "by": by}
    repeat: dict[str, str | None] = (
        {"first_reason": earlier.get("reason") or "", "first_by": earlier.get("by")}
        if earlier is not None
        else {}
    )
    record_coordination(
        CoordinationEventKind.CANCELLED,
        primitive="execution",
        key=str(execution.id),
        owner=str(execution.root_id or execution.id),
        reactor=execution.reactor,
        execution_id=str(execution.id),
        by=by,
        reason=text,
        status=execution.status,
        durable=True,  # an operator's action: audited before it returns, never written behind
        **repeat,  # type: ignore[arg-type]  # free-form detail keys, not token/at
    )
    if execution.status in IDLE and ExecutionState.peek(execution.context).origin.worker:
        return _hand_to_worker(execution)
    claim = ExecutionClaim(execution.id, f"cancel:{uuid.uuid4().hex[:8]}")
    if not claim.acquire(wait=0.0):
        # A delivery is inside it: it sees the flag at its next boundary — unless it is just
        # parking it, and then the next look would wait for the park's backoff. A delivery
        # sent for when that claim ends bounds the wait (a duplicate finds nothing to do).
        try:
            countdown = claim.ttl_left() + 0.5
        except ReactorError:
            countdown = claim.ttl
        enqueue_quietly(
            execution.id,
            countdown=countdown,
            priority=stored_message_priority(execution.context),
        )
        return execution
    # renewed while the rollback runs, however long: no delivery may take the run over meanwhile
    claim.start_renewal()
    try:
        with isolation.atomic():
            row = Execution.objects.select_for_update().get(pk=execution.id)
            _refuse_ended(row)
            if row.status not in IDLE:
                return row  # running in some process (a sync run): it polls the flag
            # Out of its resumable status, so a resume() or a sweep cannot start it now.
            row.status = ExecutionStatus.RUNNING
            row.heartbeat_at = timezone.now()
            row.save(update_fields=["status", "heartbeat_at", "updated_at"])
        return _end_idle(row, request)
    finally:
        claim.release()


def _flag_children(execution: Execution, reason: str, by: str | None) -> None:
    """Raise the flag of every live child delivery of the tree too (a parallel map's elements,
    ``async_step`` children): each runs as an execution of its own, whose passes and
    checkpoints read their own flag. One that has not started never starts its body; one that
    runs stops at its next checkpoint (or after its body, which is then undone)."""
    children = (
        Execution.objects.filter(root_id=execution.id)
        .exclude(pk=execution.id)
        .exclude(status__in=TERMINAL_STATUSES)
        .values_list("pk", flat=True)
    )
    for child_id in children:
        request_cancel(child_id, reason, by)


def _hand_to_worker(execution: Execution) -> Execution:
    """An idle execution that runs on workers: its rollback is a worker's job, never the
    canceller's (a web request must not wait for undos, nor for a parallel map's running
    elements). A delivery is sent once the caller commits; its pass reads the flag at its
    start and ends the run ``cancelled`` (``engine.cancelled.end_cancelled``), and the
    sweeper re-sends one if the message is lost. An interrupted execution (which no delivery
    runs) becomes ``pending`` first, under a row lock, so its ``resume()`` is refused from now
    on."""
    if execution.status == ExecutionStatus.INTERRUPTED:
        with isolation.atomic():
            row = Execution.objects.select_for_update().get(pk=execution.pk)
            _refuse_ended(row)
            if row.status == ExecutionStatus.INTERRUPTED:
                row.status = ExecutionStatus.PENDING
                row.heartbeat_at = timezone.now()
                row.save(update_fields=["status", "heartbeat_at", "updated_at"])
            execution = row
    # once the caller's transaction commits: a delivery sent earlier could find the row before
    # the run's own on-commit work (its ordered-lock position) is saved
    enqueue_on_commit(execution.id, priority=stored_message_priority(execution.context))
    return execution


def _refuse_ended(execution: Execution) -> None:
    if execution.parent_id and not ExecutionState.peek(execution.context).origin.dispatch:
        # A composed child (or a map element run as a reactor) is a part of its root's run,
        # which would just run it again: the tree is what can be cancelled.
        root = execution.root_id or execution.parent_id
        raise ExecutionNotCancellable(
            f"execution {execution.id} is composed into execution {root} and runs as part of "
            f"it; cancel {root} instead",
            execution_id=str(execution.id),
            status=execution.status,
            root=str(root),
        )
    if execution.is_terminal:
        raise ExecutionNotCancellable(
            f"execution {execution.id} has already ended ({execution.status}); "
            "only a pending, parked, interrupted or running execution can be cancelled",
            execution_id=str(execution.id),
            status=execution.status,
        )


def _end_idle(execution: Execution, request: dict[str, Any]) -> Execution:
    try:
        reactor = lookup(execution.reactor)
    except ReactorError as missing:
        # nothing to roll back with: still never run again, and say why nothing was undone
        logger.error("cancelling %s without rollback: %s", execution.id, missing)
        execution.status = ExecutionStatus.CANCELLED
        execution.error = cancelled_error(
            request, execution.id, reactor=execution.reactor
        ).as_dict()
        execution.rollback_failures = [{"reason": "reactor not importable", "error": str(missing)}]
        execution.finished_at = timezone.now()
        execution.save()
        return execution
    run = ExecutionRun(reactor, execution, dict(execution.inputs))
    end: RunEnd = end_cancelled(run, request, gate_held=False)
    run.finish(end)
    return run.execution
