"""Cancelling an execution (``Execution.cancel``, the admin action, the API endpoint).

A cancel is a request first: a Redis key per execution (``{prefix}:cancel:<id>``, the reason
and who asked) that every process running the execution polls — at each step boundary, at the
start of every pass and at ``context.checkpoint()`` — so it works whichever process (a Celery
worker, a web process running ``Reactor.run``) is inside the run. Reading the flag is a Redis
round trip, the largest cost of an uncoordinated step, so step boundaries and checkpoints read
it at most every ``REACTOR_CANCEL_POLL`` seconds (default 0.05) per run: a run stops at the
first boundary after that much time has passed since the request, at the latest. A cancel
requested by the very process running the execution is seen at its next boundary, and the start
of a pass and the decision whether a failure was a cancel always read the flag — except the
first pass of a run the same process has just created, whose flag counts as read clear at
creation (a cancel names the execution's id, which nobody can know before its row exists).
Then:

* **Not running** (pending, parked, interrupted): the canceller ends it itself, at once. It takes
  the execution claim a delivery would take (so no delivery starts it meanwhile), flips the row
  out of its resumable status under a row lock (so ``resume()`` of an interrupt cannot race it),
  rolls back its completed steps newest first under their locks — while the reactor-level holds
  it kept across its park are still held, as a failure would — then releases those kept holds
  and whatever its held-key registry lists, abandons its ordered positions (the line moves on)
  and wakes the waiters of everything it freed. It never runs another step.
* **Running**: the process running it sees the flag at its next step boundary (or a
  ``checkpoint()`` inside a step raises ``ExecutionCancelled``), rolls back its completed steps
  under their locks like a failure, releases its holds (outcome ``halt``: an ordered line is not
  stopped, a period bucket is not marked) and wakes the waiters.
* A pending or parked execution whose delivery holds the claim right now is running for this
  purpose: that delivery sees the flag.

Either way the execution ends ``cancelled`` (distinct from ``failed``), its error an
``ExecutionCancelled`` with the reason, its ``rollback_failures`` recorded, and an audit
``CoordinationEvent`` notes who cancelled it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from reactor_app.engine.outcomes import PassEnd, RunEnd
from reactor_app.engine.state import ExecutionState
from reactor_app.exceptions import (
    ConfigurationError,
    ExecutionCancelled,
    ExecutionNotCancellable,
    InputValidationError,
    ReactorError,
)
from reactor_app.status import CoordinationEventKind, ExecutionStatus

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun
    from reactor_app.models import Execution

logger = logging.getLogger(__name__)

#: statuses the canceller ends itself (nothing is inside the run)
IDLE = (ExecutionStatus.PENDING, ExecutionStatus.PARKED, ExecutionStatus.INTERRUPTED)
#: how long a cancel request outlives its execution's end (seconds): long enough for any pass
#: still in flight to see it, short enough to clean itself up
REQUEST_TTL = 7 * 86400
#: seconds the engine stops polling for cancel requests after a failed read (see cancel_request)
POLL_REST = 5.0
_rest_until = 0.0
#: the longest reason kept (the rest is cut): it is shown in the admin and stored on the row
MAX_REASON = 1000


def _key(execution_id: Any) -> str:
    from reactor_app.coordination.redis import key as redis_key

    return redis_key("cancel", str(execution_id))


#: the runs (their ids) whose flag was read and found clear, with the monotonic time of that
#: read — the most recent ``_CHECKED_KEPT`` only (an old entry just means one more read)
_checked: OrderedDict[tuple[str, ...], float] = OrderedDict()
_CHECKED_KEPT = 4096
#: executions cancelled by this very process: its own runs see them at the next boundary
_requested_here: set[str] = set()
_guard = threading.Lock()


def request_cancel(execution_id: Any, reason: str, by: str | None) -> None:
    """Raise the flag every process running ``execution_id`` polls."""
    from reactor_app.coordination.redis import get_client, unavailable_on_connection_error

    name = _key(execution_id)
    request = {"reason": reason, "by": by, "at": timezone.now().isoformat()}
    with unavailable_on_connection_error(key=name, primitive="cancel"):
        get_client().set(name, json.dumps(request), ex=REQUEST_TTL)
    with _guard:
        if len(_requested_here) >= _CHECKED_KEPT:
            _requested_here.clear()  # only a shortcut: the poll still finds older requests
        _requested_here.add(str(execution_id))


def cancel_request(*execution_ids: Any, fresh: bool = True) -> dict[str, Any] | None:
    """The cancel request of the first of ``execution_ids`` that has one, else None.

    Polled by the engine; an unreachable Redis reads as "not cancelled" (a run is never failed
    by the poll itself). After a failed read the poll rests for ``POLL_REST`` seconds, so an
    outage does not add a connection timeout to every step of runs that need no Redis.
    ``fresh=False`` (step boundaries, checkpoints) answers "not cancelled" without reading when
    the same run's flag was read clear less than ``REACTOR_CANCEL_POLL`` seconds ago."""
    global _rest_until
    from reactor_app.conf import reactor_settings
    from reactor_app.coordination.redis import get_client

    ids = tuple(dict.fromkeys(str(i) for i in execution_ids if i))
    now = time.monotonic()
    if not ids or now < _rest_until:
        return None
    if not fresh and not _requested_here.intersection(ids):
        with _guard:
            last = _checked.get(ids)
        if last is not None and now - last < reactor_settings.CANCEL_POLL:
            return None
    try:
        client = get_client()
        # one key at a time: the ids need not share a cluster slot
        for execution_id in ids:
            raw = client.get(_key(execution_id))
            if raw:
                data = json.loads(raw)
                return data if isinstance(data, dict) else {"reason": str(data)}
        with _guard:
            _checked[ids] = now
            _checked.move_to_end(ids)
            if len(_checked) > _CHECKED_KEPT:
                _checked.popitem(last=False)
    except ConfigurationError:
        # no coordination Redis configured: nothing can have been cancelled through it
        _rest_until = time.monotonic() + POLL_REST
    except Exception:
        _rest_until = time.monotonic() + POLL_REST
        logger.warning("could not read the cancel flag of %s", ids, exc_info=True)
    return None


def note_clear(execution_id: Any) -> None:
    """Count the flag of an execution this process has just created as read clear now.

    A cancel names an execution by its id, which nobody can know before the row exists: the
    start of that run need not read the flag, and its step boundaries poll from here on (at
    most ``REACTOR_CANCEL_POLL`` later, as after any read)."""
    ids = (str(execution_id),)
    with _guard:
        _checked[ids] = time.monotonic()
        _checked.move_to_end(ids)
        if len(_checked) > _CHECKED_KEPT:
            _checked.popitem(last=False)


def raise_if_cancelled(
    *execution_ids: Any, reactor: str | None = None, step: str | None = None
) -> None:
    """``context.checkpoint()``: stop the step body when its execution was cancelled (the
    flag read at most every ``REACTOR_CANCEL_POLL``, see the module docstring)."""
    request = cancel_request(*execution_ids, fresh=False)
    if request is not None:
        raise cancelled_error(request, execution_ids[-1], reactor=reactor, step=step)


def cancelled_error(
    request: dict[str, Any], execution_id: Any, *, reactor: str | None, step: str | None = None
) -> ExecutionCancelled:
    reason = request.get("reason") or ""
    by = request.get("by")
    return ExecutionCancelled(
        f"execution {execution_id} was cancelled"
        + (f" by {by}" if by else "")
        + (f": {reason}" if reason else ""),
        reactor=reactor,
        step=step,
        execution_id=str(execution_id),
        reason=reason,
        by=by,
    )


def clean_reason(reason: Any) -> str:
    """The reason as stored; ``InputValidationError`` when it is not text."""
    if reason is None:
        return ""
    if not isinstance(reason, str):
        raise InputValidationError(
            f"a cancel reason must be text, got {type(reason).__name__}",
            field_errors={"reason": "must be a string"},
        )
    return reason.strip()[:MAX_REASON]


# --------------------------------------------------------------------------------------------
# the engine side: ending a run that was asked to stop


def end_cancelled(run: ExecutionRun, request: dict[str, Any], *, gate_held: bool) -> RunEnd:
    """Roll ``run`` back and end it ``cancelled``.

    ``gate_held``: the reactor-level gate of this pass is entered (its holds are released by
    ``execute``'s ``finally`` with outcome ``halt``). Otherwise (a pass that stopped before its
    gate, or the canceller of an idle execution) the holds it kept across a park, its registry
    entries and its ordered positions are let go here, after the rollback."""
    from reactor_app.engine.children import children_to_settle, settle_children
    from reactor_app.engine.rollback import roll_back

    failures: list[dict[str, Any]] = []
    try:
        if run.state.completed or children_to_settle(run):
            failures = settle_children(run) + roll_back(run)
    except Exception as exc:  # a rollback bug must not leave the run neither here nor there
        logger.exception("rollback of cancelled %s failed", run.execution_id)
        failures.append({"step": None, "kind": "undo", "reason": "error", "error": str(exc)})
    if not gate_held:
        _let_go(run)
    error = cancelled_error(request, run.execution_id, reactor=run.reactor_path)
    return RunEnd(PassEnd.CANCELLED, error=error, rollback_failures=failures)


def _let_go(run: ExecutionRun) -> None:
    """Release what an execution that is not inside a pass still holds; wake the waiters."""
    from reactor_app.coordination.admission import Coordinator
    from reactor_app.coordination.claims import (
        Admitted,
        Claim,
        Hold,
        Holder,
        LockClaim,
        OrderedLockClaim,
        OrderedPosition,
        SemaphoreClaim,
    )
    from reactor_app.coordination.registry import HoldRegistry
    from reactor_app.engine.enqueueing import wake
    from reactor_app.engine.sweeper import kept_hold
    from reactor_app.models import ContentionState

    coordinator = Coordinator()
    holder = Holder(owner=run.owner, execution_id=run.execution_id, reactor=run.reactor_path)
    woken: list[str] = []
    kept_entries, run.state.continuation.kept_holds = run.state.continuation.kept_holds, None
    kept = [h for e in kept_entries or [] if (h := kept_hold(e))]
    if kept:
        try:
            woken += coordinator.release(Admitted(holds=kept, holder=holder), "halt").woken
        except ReactorError:
            logger.warning("could not release the kept holds of %s", run.execution_id)
    # whatever a worker delivery announced and never withdrew (it died, or parked keeping it)
    registry = HoldRegistry(run.owner)
    try:
        for primitive, key, _step in registry.entries():
            outcome = coordinator.force_release(primitive, key, owner=run.owner)
            woken += outcome.woken
        registry.withdraw([(p, k) for p, k, _ in registry.entries()])
    except (ReactorError, ValueError):
        logger.warning("could not release the registry holds of %s", run.execution_id)
    # the line moves on past this execution's positions (not a failure: a strict line goes on)
    positions = [
        Hold(
            claim=OrderedLockClaim(
                key=str(p["key"]),
                position=OrderedPosition(nonce=int(p["nonce"]), epoch=int(p["epoch"])),
            ),
            fresh=True,
        )
        for p in run.state.ordered.values()
        if isinstance(p, dict) and p.get("key")
    ]
    if positions:
        try:
            woken += coordinator.release(Admitted(holds=positions, holder=holder), "halt").woken
        except ReactorError:
            logger.warning("could not abandon the ordered positions of %s", run.execution_id)
        run.state.ordered.clear()
    # leave the lines it waited in: a release would otherwise hand the key to a waiter that
    # will never come (the grant only lapses after a moment)
    for row in ContentionState.objects.filter(execution_id=run.execution_id):
        waited: Claim | None = None
        if row.primitive == "lock":
            waited = LockClaim(row.key)
        elif row.primitive == "semaphore":
            waited = SemaphoreClaim(row.key, limit=1)
        if waited is not None:
            try:
                coordinator.unregister_waiter(waited, run.owner)
            except ReactorError:
                logger.warning("could not leave the waiters of %s %r", row.primitive, row.key)
    ContentionState.objects.filter(execution_id=run.execution_id).delete()
    if woken:
        wake(woken)


# --------------------------------------------------------------------------------------------
# the canceller's side


def cancel_execution(execution_id: Any, reason: Any = "", *, by: str | None = None) -> Execution:
    """Cancel the execution (see the module docstring); returns its row as it is now.

    Raises ``Execution.DoesNotExist``, ``ExecutionNotCancellable`` (already ended),
    ``InputValidationError`` (a reason that is not text) or ``CoordinationUnavailable``."""
    from reactor_app.engine.claim import ExecutionClaim
    from reactor_app.models import Execution
    from reactor_app.tracking import record_coordination

    text = clean_reason(reason)
    execution = Execution.objects.get(pk=execution_id)
    _refuse_ended(execution)
    # The flag first: any pass that starts or reaches a boundary from now on stops.
    request_cancel(execution.id, text, by)
    request = {"reason": text, "by": by}
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
    )
    claim = ExecutionClaim(execution.id, f"cancel:{uuid.uuid4().hex[:8]}")
    if not claim.acquire(wait=0.0):
        # A delivery is inside it: it sees the flag at its next boundary — unless it is just
        # parking it, and then the next look would wait for the park's backoff. A delivery
        # sent for when that claim ends bounds the wait (a duplicate finds nothing to do).
        from reactor_app.engine.enqueueing import enqueue_quietly

        try:
            countdown = claim.ttl_left() + 0.5
        except ReactorError:
            countdown = claim.ttl
        enqueue_quietly(execution.id, countdown=countdown)
        return execution
    # renewed while the rollback runs, however long: no delivery may take the run over meanwhile
    claim.start_renewal()
    try:
        with transaction.atomic():
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
    from reactor_app.dsl.registry import lookup
    from reactor_app.engine.executor import ExecutionRun

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
