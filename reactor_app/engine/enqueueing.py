"""Sending executions to workers: the outbox, the broker message, and waking parked waiters.

* ``run_async`` / ``hand_off_new`` persist an execution and enqueue it **after commit**
  (``transaction.on_commit``): a task carries the execution id only, never inputs or state.
  The committed row is the outbox; a message the broker refuses is left to the sweeper.
* ``enqueue`` sends the ``reactor_app.run_execution`` task; a park's own countdown requeue
  carries a token naming that park (see ``engine.delivery``).
* ``wake`` re-enqueues parked waiters at once when a release frees their key (the gate calls
  it); deliveries waiting in-process were already woken by the release's PUBLISH.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from celery import current_app
from celery.exceptions import SoftTimeLimitExceeded
from django.db import IntegrityError, transaction
from django.utils import timezone

from reactor_app import isolation
from reactor_app.conf import reactor_settings
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    WAITING_PREFIX,
    Admitted,
    Hold,
    Holder,
)
from reactor_app.datetimes import given
from reactor_app.engine import countdowns
from reactor_app.engine import debounce as debounced
from reactor_app.engine.idempotency import check_idempotency_key, same_call
from reactor_app.engine.inputs import input_errors, stored_inputs
from reactor_app.engine.outcomes import PassEnd
from reactor_app.engine.priority import checked_priority, in_process_context, message_priority
from reactor_app.engine.result import Result, note_sent, note_unsent
from reactor_app.engine.state import REACTOR_SLOT, ExecutionState
from reactor_app.exceptions import (
    InputNotSerializable,
    ReactorError,
)
from reactor_app.models import Execution
from reactor_app.serialization import encode
from reactor_app.status import ExecutionStatus

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor

logger = logging.getLogger(__name__)


#: the task a delivery runs (``reactor_app.tasks.run_execution``), found by name in the current
#: Celery app's registry: the tasks hand back to the engine, so the engine does not import them
#: (``ReactorAppConfig.ready`` imports the tasks module, which registers them)
RUN_EXECUTION = "reactor_app.run_execution"
#: the message header naming a new execution's first step: its delivery's claim statement then
#: writes the pass's start too (``engine.delivery.deliver``). A header, not an argument, so a
#: message sent by this version to a worker of an earlier one still runs there.
START_HEADER = "reactor_start"
#: the coordination outages the execution's deliveries met in a row before they could claim it
#: (``engine.delivery``): each such requeue backs off further. A header, as ``START_HEADER``.
OUTAGES_HEADER = "reactor_outages"


def enqueue(
    execution_id: Any,
    *,
    countdown: float | None = None,
    requeue_token: str | None = None,
    priority: int | None = None,
    start: str | None = None,
    outages: int | None = None,
) -> None:
    """Send the execution's task (identities only: the execution id, and for a park's own
    requeue the token naming that park) to ``REACTOR_CELERY_QUEUE``, or to Celery's default
    queue when that is not set. ``priority`` is the message's (Celery's 0 to 9 scale), for brokers
    that order by it. ``start``: a new execution's first step (``START_HEADER``). ``outages``:
    the outages met in a row before a claim (``OUTAGES_HEADER``). A ``countdown`` longer than
    ``REACTOR_LONGEST_COUNTDOWN`` is sent in hops (``engine.countdowns``)."""
    options: dict[str, Any] = {}
    queue = reactor_settings.CELERY_QUEUE
    if queue:
        options["queue"] = queue
    # a countdown longer than a broker holds goes in hops (engine.countdowns)
    countdown, headers = countdowns.capped(countdown, priority)
    if countdown is not None and countdown > 0:
        options["countdown"] = countdown
    if priority is not None:
        options["priority"] = priority
    kwargs = {"requeue_token": requeue_token} if requeue_token else {}
    if start:
        headers[START_HEADER] = start
    if outages:
        headers[OUTAGES_HEADER] = outages
    if headers:
        options["headers"] = headers
    current_app.tasks[RUN_EXECUTION].apply_async(args=[str(execution_id)], kwargs=kwargs, **options)
    note_sent(execution_id)


def enqueue_on_commit(execution_id: Any, **options: Any) -> None:
    """Enqueue once the current transaction commits, so a worker always finds the row
    (``options``: ``enqueue``'s ``countdown``, ``priority``, ``start``).

    The row is the outbox: once it is committed the work will run, so a broker that cannot
    take the message is logged, not raised — raising would invite the caller to retry a call
    that already succeeded (and run twice). The sweeper (``sweep``) enqueues the row later.
    """
    transaction.on_commit(lambda: _enqueue_or_leave_to_sweeper(execution_id, **options))


def _enqueue_or_leave_to_sweeper(execution_id: Any, **options: Any) -> None:
    try:
        enqueue(execution_id, **options)
    except SoftTimeLimitExceeded:
        raise  # the task's time limit, not a broker's refusal (docs/operations.md)
    except Exception as exc:
        note_unsent(execution_id, exc)  # what a wait() on it is told
        logger.warning(
            "could not send execution %s to the broker; it stays pending and the sweeper "
            "(reactor_app.sweep) will enqueue it",
            execution_id,
            exc_info=True,
        )


def enqueue_quietly(execution_id: Any, **options: Any) -> bool:
    """``enqueue``, logging instead of raising when the broker refuses: the sweeper is the
    safety net for a message that could not be sent."""
    try:
        enqueue(execution_id, **options)
    except SoftTimeLimitExceeded:
        raise  # the task's time limit, not a broker's refusal (docs/operations.md)
    except Exception as exc:
        note_unsent(execution_id, exc)
        logger.exception("could not enqueue %s; the sweeper will", execution_id)
        return False
    return True


def wake(waiter_ids: Iterable[str]) -> None:
    """Re-enqueue parked waiters at once (a release freed their key). Failures only log: the
    countdown requeue of each waiter is the safety net."""
    for waiter in waiter_ids:
        if str(waiter).startswith(WAITING_PREFIX):
            continue  # a delivery waiting in-process: the release's PUBLISH already woke it
        try:
            uuid.UUID(str(waiter))
        except ValueError:
            logger.warning("ignoring woken waiter %r: not an execution id", waiter)
            continue
        try:
            enqueue(waiter)
        except SoftTimeLimitExceeded:
            raise  # the task's time limit, not a broker's refusal (docs/operations.md)
        except Exception:
            logger.exception("could not wake %s; its backoff requeue will", waiter)


def _worker_context(priority: int | None = None, burst: str | None = None) -> dict[str, Any]:
    state = ExecutionState()
    state.origin.worker = True
    state.origin.priority = priority or None
    state.origin.debounce = burst
    return state.to_json()


def run_async(
    reactor: type[Reactor],
    inputs: dict[str, Any],
    *,
    idempotency_key: str | None = None,
    run_after: datetime | None = None,
    priority: int | None = None,
    debounce: tuple[str, float] | None = None,
) -> Execution:
    """``Reactor.run_async``: persist a pending execution, enqueue it after commit, return it.

    The semantics are an outbox: the returned row is committed (or will be, with the caller's
    transaction) and *will* run. Broker trouble never raises here — the task is sent after
    commit, and a send that fails is left to the sweeper, which enqueues pending rows whose
    heartbeat is older than ``REACTOR_SWEEP_AFTER``.

    Raises at the call, before anything is stored: ``InputValidationError`` for missing or
    unexpected inputs, ``InputNotSerializable`` (also a ``TypeError``) for an input the codec
    cannot hand to a worker as the same value (``reactor_app.serialization``), and
    ``IdempotencyKeyReused`` when ``idempotency_key`` names an earlier call of another reactor
    or with other inputs. The same key with the same call returns the existing execution.

    ``run_after`` defers the run (the ``django.tasks`` backend's ``run_after``): the message
    carries the countdown, and the row's heartbeat is the due time, so the sweeper cannot
    re-send it early. ``priority`` (-100 to 100, higher first; None: 0) orders the execution
    among the waiters of every key it meets contended (``coordination.waiting``, stored in its
    state so that each delivery waits with it) and is sent as the message's priority
    (``celery_priority``) for brokers that order by it. ``debounce`` (or the reactor's
    ``with_debounce``) makes the start one of a burst (``engine.debounce``).
    """
    priority = checked_priority(reactor, priority)
    if run_after is not None:
        # the project's kind of datetime (aware with USE_TZ, naive without), or refused
        run_after = given(run_after, name="run_after", reactor=reactor.path())
    check_idempotency_key(reactor, idempotency_key)
    error = input_errors(reactor, inputs)
    if error is not None:
        raise error
    stored_inputs = {}
    for name, value in inputs.items():
        try:
            stored_inputs[name] = encode(value, where=f"input {name!r}")
        except TypeError as exc:
            raise InputNotSerializable(
                f"cannot run {reactor.__qualname__} on a worker: {exc}",
                reactor=reactor.path(),
                step=None,
                field_errors={name: str(exc)},
            ) from exc
    if idempotency_key is not None:
        existing = same_call(reactor, stored_inputs, idempotency_key)
        if existing is not None:
            return existing
    burst = debounced.burst_of(reactor, inputs, debounce)
    execution_id = uuid.uuid4()
    placed = debounced.place(burst, str(execution_id)) if burst is not None else None
    now = timezone.now()
    due = max(now, run_after) if run_after is not None else now
    if placed is not None:
        due = max(due, now + timedelta(seconds=placed.due_in))
    # No burst to settle, outside a transaction: the INSERT alone (autocommit), not BEGIN, INSERT,
    # COMMIT. Inside one, a savepoint keeps a lost idempotency race from breaking it.
    alone = burst is None and not transaction.get_connection().in_atomic_block
    try:
        with contextlib.nullcontext() if alone else isolation.atomic():
            execution = Execution.objects.start(
                id=execution_id,
                reactor=reactor.path(),
                inputs=stored_inputs,
                status=ExecutionStatus.PENDING,
                heartbeat_at=due,
                context=_worker_context(priority, burst.key if burst else None),
                idempotency_key=idempotency_key,
            )
            enqueue_new_on_commit(
                reactor,
                inputs,
                execution,
                countdown=(due - now).total_seconds() or None,
                priority=message_priority(priority),
                # a burst's start is decided at delivery (engine.debounce): no start at claim
                start=reactor.plan.order[0] if burst is None and reactor.plan.order else None,
            )
            if burst is not None and placed is not None:
                debounced.settle_on_commit(burst, placed.earlier, str(execution_id))
    except IntegrityError:
        # A concurrent call with the same key won the insert (the unique constraint decides).
        existing = same_call(reactor, stored_inputs, idempotency_key)
        if existing is None:
            raise
        return existing
    return execution


def enqueue_new_on_commit(
    reactor: type[Reactor],
    inputs: dict[str, Any],
    execution: Execution,
    *,
    countdown: float | None = None,
    priority: int | None = None,
    start: str | None = None,
) -> None:
    """A new execution's task, sent once the current transaction commits — for a reactor with
    an ordered lock, after taking its position in the line (``_take_position_then_enqueue``).
    After the commit, not inside the transaction: a rollback must not leave a position that
    nobody will ever run (the line would wait a whole poison-pill timeout for it), nor a slow
    Redis hold the transaction open. The line's key is computed now, from the inputs as they
    are at the call."""
    line = _ordered_line(reactor, inputs)
    if line is None:
        enqueue_on_commit(execution.id, countdown=countdown, priority=priority, start=start)
        return
    transaction.on_commit(
        functools.partial(
            _take_position_then_enqueue, reactor, line, execution, countdown, priority
        )
    )


def _ordered_line(reactor: type[Reactor], inputs: dict[str, Any]) -> str | None:
    """The key of the reactor-level ordered lock a run of ``inputs`` queues on (computed now,
    from the inputs as they are at the call), or None: no such lock, or a key that cannot be
    computed — the worker's gate meets the same problem and fails the run with it."""
    declaration = reactor.ordered_lock_config
    if declaration is None:
        return None
    try:
        key: str = declaration.compute_key(inputs, reactor=reactor.path(), step=None)
    except ReactorError:
        return None
    return key


def _take_position_then_enqueue(
    reactor: type[Reactor],
    line: str,
    execution: Execution,
    countdown: float | None = None,
    priority: int | None = None,
) -> None:
    """Once the new execution's row is committed: its ordered-lock position, then its task.

    A reactor-level ordered lock orders runs by enqueue (docs/design.md §1.4): with several
    workers, the order in which deliveries start is not the order in which runs were enqueued,
    so the position is taken here and the executor finds it under the reactor's slot. Never
    raises (an on-commit hook that raised would make a committed call look failed): what goes
    wrong is logged, and the run still goes to a worker, whose first pass takes a position.
    """
    # Compare-and-set on the heartbeat first (as the sweeper does): from here the sweeper
    # leaves the row alone, so it cannot be sent to a worker before its position is saved —
    # and if the sweeper got to a stale row first (a caller's transaction older than
    # REACTOR_SWEEP_AFTER), that run is already on its way and takes its position itself.
    try:
        fresh = max(timezone.now(), execution.heartbeat_at or timezone.now())
        won = Execution.objects.filter(pk=execution.pk, heartbeat_at=execution.heartbeat_at)
        if not won.update(heartbeat_at=fresh):
            return
        execution.heartbeat_at = fresh
    except Exception:
        logger.exception("could not take execution %s to enqueue it", execution.id)
        return  # the sweeper enqueues it
    _take_position_at_enqueue(reactor, line, execution)
    _enqueue_or_leave_to_sweeper(execution.id, countdown=countdown, priority=priority)


def _take_position_at_enqueue(reactor: type[Reactor], line: str, execution: Execution) -> None:
    declaration = reactor.ordered_lock_config
    assert declaration is not None
    execution_id = str(execution.id)
    holder = Holder(owner=execution_id, execution_id=execution_id, reactor=reactor.path())
    coordinator = Coordinator()
    try:
        position = coordinator.assign_position(line, holder, declaration.ttl)
    except Exception:
        logger.warning(
            "could not take the ordered-lock position of %s at enqueue; its worker will",
            execution_id,
            exc_info=True,
        )
        return
    context = dict(execution.context or {})
    context.setdefault("ordered", {})[REACTOR_SLOT] = {
        "key": line,
        "nonce": position.nonce,
        "epoch": position.epoch,
    }
    try:
        # Only while no delivery has claimed the row: a delivery that came first (a cancel's,
        # a sweeper's) read the context without this position and would never give it back.
        saved = Execution.objects.filter(
            pk=execution.pk,
            status=ExecutionStatus.PENDING,
            claim_generation=execution.claim_generation,
        ).update(context=context)
    except Exception:
        logger.exception("could not save the ordered-lock position of %s", execution_id)
        saved = 0
    if not saved:
        # nobody will run that position: let the line move past it at once, and re-enqueue
        # the parked run it lets through (as a gate abandoning its position does)
        claim = declaration.claim(line, position)
        with contextlib.suppress(Exception):
            given_back = Admitted(holds=[Hold(claim, fresh=True)], holder=holder)
            wake(coordinator.release(given_back, "halt").woken)
        return
    execution.context = context


def hand_off_new(
    reactor: type[Reactor], inputs: dict[str, Any], *, priority: int | None = None
) -> Result:
    """``run()`` of a ``background = True`` reactor: the whole run goes to a worker (with
    ``run(priority=...)``'s priority).

    Invalid inputs give a ``failed`` result (``run()`` returns failures rather than raising);
    inputs a worker could not read back raise, as for ``run_async``.
    """
    error = input_errors(reactor, inputs)
    if error is not None:
        return _failed_call(reactor, inputs, error)
    execution = run_async(reactor, inputs, priority=priority)
    return Result(status=PassEnd.HANDED_OFF.value, execution_id=str(execution.id))


def _failed_call(reactor: type[Reactor], inputs: dict[str, Any], error: ReactorError) -> Result:
    now = timezone.now()
    stored, shown = stored_inputs(inputs)
    execution = Execution.objects.start(
        reactor=reactor.path(),
        inputs=stored,
        status=ExecutionStatus.FAILED,
        error=error.as_dict(),
        finished_at=now,
        heartbeat_at=now,
        **({"context": in_process_context(None, shown)} if shown else {}),
    )
    return execution.to_result()
