"""Celery dispatch: handing executions to workers, and running them there (docs/design.md).

Everything that crosses the process boundary goes through here:

* ``run_async`` / ``hand_off_new`` persist an execution and enqueue it **after commit**
  (``transaction.on_commit``): a task carries the execution id only, never inputs or state.
* ``deliver`` is the body of the ``reactor_app.run_execution`` task. It first takes the
  **execution claim** — a Redis lock on the execution id owned by this delivery, with a TTL
  renewed from a daemon thread while it runs — so two deliveries never run one execution at
  once. A delivery that finds the claim taken exits; if the execution is not finished it looks
  again when the claim would lapse (its holder may have been killed). With ``acks_late`` and
  ``reject_on_worker_lost`` a killed worker's task is redelivered, and the engine continues from
  the execution's last checkpoint (``state.next_index`` is persisted after every step). A
  delivery that finds the execution still ``running`` once it holds the claim is taking over
  from a dead delivery: it first drops the holds that one left (``engine.worker.
  drop_stale_holds``), so the redelivery does not re-enter them as an extra nesting level.
* Parking: a pass that ends ``parked`` is requeued with ``apply_async(countdown=...)`` at the
  delay ``engine.worker.note_park`` chose — never with Celery's ``retry``, which would spend
  ``max_retries`` on contention. ``wake`` re-enqueues parked waiters at once when a release
  frees their key (the gate calls it); the countdown requeue stays as the safety net and
  duplicate deliveries are harmless thanks to the claim. A countdown requeue carries a token
  naming its park, so one left over from an earlier park is dropped rather than counted as
  another contention attempt.
* ``resume`` / ``resume_by_correlation`` continue an interrupted execution (inline, or on a
  worker for a background reactor); a second resume of the same interrupt is refused.
* ``sweep`` re-enqueues worker executions whose heartbeat is older than
  ``REACTOR_SWEEP_AFTER`` and whose claim is free, and times out interrupts.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from reactor_app.conf import reactor_settings
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Hold, Holder, LockClaim, SemaphoreClaim
from reactor_app.coordination.redis import get_client, unavailable_on_connection_error
from reactor_app.coordination.redis import key as redis_key
from reactor_app.dsl.registry import lookup
from reactor_app.engine.context import KEPT_HOLDS, ExecutionState, to_json
from reactor_app.engine.executor import (
    REACTOR_SLOT,
    ExecutionRun,
    RunEnd,
    input_errors,
    run_inline,
)
from reactor_app.engine.gate import WAITING_PREFIX
from reactor_app.engine.result import Result
from reactor_app.engine.worker import ClaimLost, backoff_seconds, drop_stale_holds, park_margin
from reactor_app.exceptions import (
    CoordinationUnavailable,
    ExecutionNotResumable,
    IdempotencyKeyReused,
    InputNotSerializable,
    ReactorError,
    ReactorNotRegistered,
)
from reactor_app.models import Execution
from reactor_app.serialization import encode
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from reactor_app.tracking import record_coordination

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor

logger = logging.getLogger(__name__)

#: statuses a delivery may (continue to) run
RUNNABLE = (ExecutionStatus.PENDING, ExecutionStatus.RUNNING, ExecutionStatus.PARKED)
#: seconds a delivery waits for a claim held by another delivery before giving up; covers a
#: wake that arrives while the parking delivery is still letting go of its claim
CLAIM_WAIT = 2.0


def claim_ttl() -> float:
    """``REACTOR_EXECUTION_CLAIM_TTL``: seconds a silent delivery keeps its claim (default 30)."""
    return reactor_settings.EXECUTION_CLAIM_TTL


# --------------------------------------------------------------------------------------------
# the execution claim


class ExecutionClaim:
    """A Redis lock on one execution id, owned by one delivery, renewed while it runs."""

    def __init__(
        self, execution_id: Any, owner: str, *, ttl: float | None = None, client: Any = None
    ) -> None:
        self.client = client or get_client()
        self.name = redis_key("claim", str(execution_id))
        self.ttl = ttl if ttl is not None else claim_ttl()
        self.owner = owner
        self.lost = False
        self._lock = self.client.lock(self.name, timeout=self.ttl, thread_local=False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, wait: float = 0.0) -> bool:
        with unavailable_on_connection_error(key=self.name, primitive="claim"):
            return bool(
                self._lock.acquire(
                    blocking=wait > 0, blocking_timeout=wait or None, token=self.owner
                )
            )

    def start_renewal(self) -> None:
        self._thread = threading.Thread(
            target=self._renew, name=f"reactor-claim-{self.name}", daemon=True
        )
        self._thread.start()

    def _renew(self) -> None:
        from redis.exceptions import LockError

        while not self._stop.wait(self.ttl / 3):
            try:
                self._lock.reacquire()
            except LockError:
                self.lost = True
                logger.error("the claim %s was lost; another delivery may run it", self.name)
                return
            except Exception:  # Redis briefly unreachable: keep trying until the TTL decides
                logger.warning("could not renew the claim %s", self.name, exc_info=True)

    def check(self) -> None:
        """Raise ``ClaimLost`` if renewal found the claim gone (called at every checkpoint)."""
        if self.lost:
            raise ClaimLost(f"the claim {self.name} lapsed; stopping this delivery")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self._lock.release()
        except Exception:  # lapsed or Redis unreachable: the TTL frees it either way
            logger.debug("claim %s was not released by its owner", self.name, exc_info=True)

    def ttl_left(self) -> float:
        with unavailable_on_connection_error(key=self.name, primitive="claim"):
            ms = self.client.pttl(self.name)
        return max(float(ms), 0.0) / 1000 if ms and ms > 0 else 0.0

    @classmethod
    def is_held(cls, execution_id: Any, client: Any = None) -> bool:
        client = client or get_client()
        with unavailable_on_connection_error(primitive="claim"):
            return bool(client.exists(redis_key("claim", str(execution_id))))


def delivery_owner(task_id: str | None) -> str:
    """The claim owner of one delivery: where it runs, which task, and a fresh nonce."""
    return f"{socket.gethostname()}:{os.getpid()}:{task_id or '-'}:{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------------------------
# enqueueing


def enqueue(
    execution_id: Any, *, countdown: float | None = None, requeue_token: str | None = None
) -> None:
    """Send the execution's task (identities only: the execution id, and for a park's own
    requeue the token naming that park) to ``REACTOR_CELERY_QUEUE``, or to Celery's default
    queue when that is not set."""
    from reactor_app.tasks import run_execution

    options: dict[str, Any] = {}
    queue = reactor_settings.CELERY_QUEUE
    if queue:
        options["queue"] = queue
    if countdown is not None and countdown > 0:
        options["countdown"] = countdown
    kwargs = {"requeue_token": requeue_token} if requeue_token else {}
    run_execution.apply_async(args=[str(execution_id)], kwargs=kwargs, **options)


def enqueue_on_commit(execution_id: Any, *, countdown: float | None = None) -> None:
    """Enqueue once the current transaction commits, so a worker always finds the row.

    The row is the outbox: once it is committed the work will run, so a broker that cannot
    take the message is logged, not raised — raising would invite the caller to retry a call
    that already succeeded (and run twice). The sweeper (``sweep``) enqueues the row later.
    """
    transaction.on_commit(lambda: _enqueue_or_leave_to_sweeper(execution_id, countdown))


def _enqueue_or_leave_to_sweeper(execution_id: Any, countdown: float | None) -> None:
    try:
        enqueue(execution_id, countdown=countdown)
    except Exception:
        logger.warning(
            "could not send execution %s to the broker; it stays pending and the sweeper "
            "(reactor_app.sweep) will enqueue it",
            execution_id,
            exc_info=True,
        )


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
        except Exception:
            logger.exception("could not wake %s; its backoff requeue will", waiter)


def _worker_context(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    state = ExecutionState()
    state.extra["worker"] = True
    state.extra.update(extra or {})
    return state.to_json()


def run_async(
    reactor: type[Reactor], inputs: dict[str, Any], *, idempotency_key: str | None = None
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
    """
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
        existing = _same_call(reactor, stored_inputs, idempotency_key)
        if existing is not None:
            return existing
    now = timezone.now()
    try:
        with transaction.atomic():
            execution = Execution.objects.start(
                reactor=reactor.path(),
                inputs=stored_inputs,
                status=ExecutionStatus.PENDING,
                heartbeat_at=now,
                context=_worker_context(),
                idempotency_key=idempotency_key,
            )
            _take_position_at_enqueue(reactor, inputs, execution)
            enqueue_on_commit(execution.id)
    except IntegrityError:
        # A concurrent call with the same key won the insert (the unique constraint decides).
        existing = _same_call(reactor, stored_inputs, idempotency_key)
        if existing is None:
            raise
        return existing
    return execution


def _same_call(
    reactor: type[Reactor], stored_inputs: dict[str, Any], idempotency_key: str | None
) -> Execution | None:
    """The execution an earlier call with ``idempotency_key`` made, if it was the same call."""
    if idempotency_key is None:
        return None
    existing = Execution.objects.with_idempotency_key(idempotency_key)
    if existing is None:
        return None
    if existing.reactor != reactor.path() or existing.inputs != stored_inputs:
        raise IdempotencyKeyReused(
            f"the idempotency key {idempotency_key!r} was used for execution {existing.id} "
            f"({existing.reactor} with other inputs or another reactor); use a new key for a "
            "different call",
            reactor=reactor.path(),
            step=None,
            field_errors={"idempotency_key": "already used for a different call"},
            execution_id=str(existing.id),
        )
    return existing


def _take_position_at_enqueue(
    reactor: type[Reactor], inputs: dict[str, Any], execution: Execution
) -> None:
    """A reactor-level ordered lock orders runs by enqueue (docs/design.md §1.4), so the position is
    taken now: with several workers, the order in which deliveries start is not the order in
    which runs were enqueued. The executor finds it under the reactor's slot and reuses it."""
    declaration = reactor.ordered_lock_config
    if declaration is None:
        return
    execution_id = str(execution.id)
    try:
        key = declaration.compute_key(inputs, reactor=reactor.path(), step=None)
        position = Coordinator().assign_position(
            key,
            Holder(owner=execution_id, execution_id=execution_id, reactor=reactor.path()),
            declaration.ttl,
        )
    except ReactorError:
        return  # the worker's gate meets the same problem and fails the run with it
    context = dict(execution.context or {})
    context.setdefault("ordered", {})[REACTOR_SLOT] = {
        "key": key,
        "nonce": position.nonce,
        "epoch": position.epoch,
    }
    execution.context = context
    execution.save(update_fields=["context"])


def hand_off_new(reactor: type[Reactor], inputs: dict[str, Any]) -> Result:
    """``run()`` of a ``background = True`` reactor: the whole run goes to a worker.

    Invalid inputs give a ``failed`` result (``run()`` returns failures rather than raising);
    inputs a worker could not read back raise, as for ``run_async``.
    """
    error = input_errors(reactor, inputs)
    if error is not None:
        return _failed_call(reactor, inputs, error)
    execution = run_async(reactor, inputs)
    return Result(status="handed_off", execution_id=str(execution.id))


def _failed_call(reactor: type[Reactor], inputs: dict[str, Any], error: ReactorError) -> Result:
    now = timezone.now()
    execution = Execution.objects.start(
        reactor=reactor.path(),
        inputs=to_json(inputs),
        status=ExecutionStatus.FAILED,
        error=error.as_dict(),
        finished_at=now,
        heartbeat_at=now,
    )
    return execution.to_result()


# --------------------------------------------------------------------------------------------
# delivering


def deliver(
    execution_id: str, *, task_id: str | None = None, requeue_token: str | None = None
) -> dict[str, Any]:
    """Body of the ``run_execution`` task: claim the execution, run one pass, follow up.

    ``requeue_token`` marks the countdown requeue of one park; it is dropped when the execution
    has parked again since (that newer park has its own requeue), so leftover requeues never
    pile up into extra contention attempts.
    """
    summary: dict[str, Any] = {"execution_id": execution_id}
    execution = Execution.objects.filter(pk=execution_id).first()
    if execution is None:
        return {**summary, "outcome": "missing"}
    if execution.status not in RUNNABLE:
        return {**summary, "outcome": "nothing_to_do", "status": execution.status}
    if _stale_requeue(execution, requeue_token):
        return {**summary, "outcome": "stale_requeue", "status": execution.status}
    try:
        # building the claim may reach Redis already (a cluster client maps its slots)
        claim = ExecutionClaim(execution_id, delivery_owner(task_id))
        claimed = claim.acquire(wait=CLAIM_WAIT)
    except CoordinationUnavailable:
        return {**summary, **_retry_after_outage(execution)}
    if not claimed:
        execution.refresh_from_db()
        if execution.status in RUNNABLE:
            # Running elsewhere — or its delivery was killed and the claim has yet to lapse,
            # even one that had only just taken a parked execution: look again then. A parked
            # one keeps its park's token, so if a live delivery parks it again meanwhile this
            # look is recognised as stale and dropped.
            token = (execution.context or {}).get("requeue_token")
            try:
                countdown = claim.ttl_left() + 0.5
            except CoordinationUnavailable:
                countdown = claim.ttl
            enqueue_quietly(
                execution_id,
                countdown=countdown,
                requeue_token=token if execution.status == ExecutionStatus.PARKED else None,
            )
        return {**summary, "outcome": "claimed_elsewhere", "status": execution.status}
    run: ExecutionRun | None = None
    try:
        claim.start_renewal()
        execution.refresh_from_db()
        if execution.status not in RUNNABLE or _stale_requeue(execution, requeue_token):
            return {**summary, "outcome": "nothing_to_do", "status": execution.status}
        try:
            lookup(execution.reactor)
        except ReactorNotRegistered as missing:
            return {**summary, **_fail_unrunnable(execution, missing)}
        run = _run_pass(execution, claim)
    except ClaimLost:
        # Another delivery may run it now, or nobody (the claim vanished with a restarted
        # Redis): look again once a claim would have lapsed; a duplicate is harmless.
        logger.warning("delivery of %s stopped: its claim lapsed", execution_id)
        enqueue_quietly(execution_id, countdown=claim.ttl)
        return {**summary, "outcome": "claim_lost"}
    finally:
        claim.release()
    return {**summary, **_follow_up(run)}


def _retry_after_outage(execution: Execution) -> dict[str, Any]:
    """The coordination Redis is unreachable before this delivery could claim the execution:
    nothing ran; send it again after a backoff. If the broker is unreachable too, the sweeper
    re-enqueues it once the heartbeat is stale (docs/operations.md, "Recovery")."""
    delay = backoff_seconds(1)
    logger.warning("coordination store unreachable; %s requeued in %.1fs", execution.id, delay)
    enqueue_quietly(execution.id, countdown=delay)
    return {"outcome": "coordination_unavailable", "status": execution.status}


def enqueue_quietly(execution_id: Any, **options: Any) -> bool:
    """``enqueue``, logging instead of raising when the broker refuses: the sweeper is the
    safety net for a message that could not be sent."""
    try:
        enqueue(execution_id, **options)
    except Exception:
        logger.exception("could not enqueue %s; the sweeper will", execution_id)
        return False
    return True


def _fail_unrunnable(execution: Execution, missing: ReactorNotRegistered) -> dict[str, Any]:
    """End an execution whose reactor this worker cannot import: terminal, with the reason on
    the row (the sweeper only re-enqueues runnable rows, so it is not retried forever)."""
    logger.error("execution %s failed: %s", execution.id, missing.message)
    now = timezone.now()
    execution.status = ExecutionStatus.FAILED
    execution.error = missing.as_dict()
    execution.finished_at = now
    execution.heartbeat_at = now
    execution.save(update_fields=["status", "error", "finished_at", "heartbeat_at", "updated_at"])
    if (
        execution.parent_id
        and Execution.objects.filter(pk=execution.parent_id, status=ExecutionStatus.PARKED).exists()
    ):
        enqueue_quietly(execution.parent_id)  # a parent waiting on this child sees it ended
    return {"outcome": "failed", "status": execution.status, "error": missing.message}


def _stale_requeue(execution: Execution, requeue_token: str | None) -> bool:
    if requeue_token is None or execution.status != ExecutionStatus.PARKED:
        return False
    return (execution.context or {}).get("requeue_token") != requeue_token


def _run_pass(execution: Execution, claim: ExecutionClaim) -> ExecutionRun:
    from reactor_app.dsl.registry import lookup

    was_parked = execution.status == ExecutionStatus.PARKED
    # Still "running" although this delivery now holds the claim: the delivery that set it
    # died mid-run (or lost its claim). "pending" and "parked" passes ended cleanly.
    taken_over = execution.status == ExecutionStatus.RUNNING
    run = ExecutionRun(lookup(execution.reactor), execution, dict(execution.inputs), mode="worker")
    run.on_persist = claim.check
    if taken_over:
        drop_stale_holds(run)
    if was_parked:
        _record_resumed(run)
    marker = run.state.extra.get("dispatch") or {}
    end = run.execute_async_step() if marker.get("kind") == "async_step" else run.execute()
    run.finish(end)
    run.last_end = end
    return run


def _record_resumed(run: ExecutionRun) -> None:
    parked_on = run.state.extra.pop("parked_on", None)
    if not parked_on or not parked_on.get("key"):
        return
    record_coordination(
        CoordinationEventKind.RESUMED,
        primitive=parked_on["primitive"],
        key=parked_on["key"],
        owner=run.owner,
        step=parked_on.get("step") or None,
        reactor=run.reactor_path,
        execution_id=parked_on.get("execution") or run.execution_id,
        **_parked_for(parked_on),
    )


def _parked_for(parked_on: dict[str, Any]) -> dict[str, Any]:
    """``{"parked_for": seconds}`` since the park, when it recorded its time (older parks
    persisted before this field did not)."""
    at = parked_on.get("at")
    if not isinstance(at, (int, float)):
        return {}
    return {"parked_for": round(max(0.0, timezone.now().timestamp() - at), 3)}


def _follow_up(run: ExecutionRun | None) -> dict[str, Any]:
    """After the claim is let go: requeue a parked execution, wake a waiting parent."""
    if run is None:
        return {}
    execution = run.execution
    end: RunEnd | None = run.last_end
    if execution.status == ExecutionStatus.PARKED:
        delay = run.requeue_in
        if delay is None:  # waiting on an async child, which wakes us when it ends
            delay = reactor_settings.CONTENTION_BACKOFF[1]
        enqueue_quietly(
            execution.id, countdown=delay, requeue_token=run.state.extra.get("requeue_token")
        )
        return {"outcome": "parked", "status": execution.status, "requeue_in": round(delay, 3)}
    marker = run.state.extra.get("dispatch") or {}
    if execution.is_terminal and marker and execution.parent_id:
        parent_waits = Execution.objects.filter(
            pk=execution.parent_id, status=ExecutionStatus.PARKED
        ).exists()
        if parent_waits:
            enqueue_quietly(execution.parent_id)
    return {"outcome": end.status if end else execution.status, "status": execution.status}


# --------------------------------------------------------------------------------------------
# resuming interrupts


def resume(reactor: type[Reactor], execution_id: Any, *, step: str | None, payload: Any) -> Result:
    """Continue an interrupted execution with ``payload`` as the interrupt step's result.

    Inline, unless the reactor is ``background`` (then on a worker: ``handed_off``). The status
    change is made under a row lock, so of two concurrent resumes exactly one wins; the other
    (and any later one) gets ``ExecutionNotResumable``.
    """
    from reactor_app.dsl.registry import lookup

    background = reactor.background is True
    claim: ExecutionClaim | None = None
    if not background:
        claim = ExecutionClaim(execution_id, delivery_owner("resume"))
        if not claim.acquire(wait=CLAIM_WAIT):
            raise ExecutionNotResumable(
                f"execution {execution_id} is being run by another process",
                execution_id=str(execution_id),
                step=step,
                status=None,
            )
    try:
        execution = _take_interrupt(reactor, execution_id, step, payload, background)
        if background:
            return Result(status="handed_off", execution_id=str(execution.id))
        assert claim is not None
        claim.start_renewal()
        run = ExecutionRun(lookup(execution.reactor), execution, dict(execution.inputs))
        run.on_persist = claim.check
        return run_inline(run)
    finally:
        if claim is not None:
            claim.release()


def _take_interrupt(
    reactor: type[Reactor], execution_id: Any, step: str | None, payload: Any, background: bool
) -> Execution:
    from reactor_app.dsl.reactor import Reactor as BaseReactor

    with transaction.atomic():
        execution = Execution.objects.select_for_update().filter(pk=execution_id).first()
        if execution is None:
            raise ExecutionNotResumable(
                f"there is no execution {execution_id}",
                execution_id=str(execution_id),
                step=step,
                status=None,
            )
        if reactor is not BaseReactor and execution.reactor != reactor.path():
            raise ExecutionNotResumable(
                f"execution {execution_id} is a run of {execution.reactor}, not {reactor.path()}",
                execution_id=str(execution_id),
                step=step,
                status=execution.status,
            )
        waiting_at = execution.current_step
        state = ExecutionState.from_json(execution.context)
        entry = state.extra.get("interrupts", {}).get(waiting_at)
        refusal = None
        if execution.status != ExecutionStatus.INTERRUPTED or entry is None:
            refusal = f"it is {execution.status}, not waiting at an interrupt"
        elif step is not None and step != waiting_at:
            refusal = f"it waits at interrupt {waiting_at!r}, not {step!r}"
        elif "payload" in entry:
            refusal = f"interrupt {waiting_at!r} was already resumed"
        elif _deadline_passed(entry, timezone.now()):
            refusal = f"interrupt {waiting_at!r} timed out"
        if refusal is not None:
            raise ExecutionNotResumable(
                f"execution {execution_id} cannot be resumed: {refusal}",
                execution_id=str(execution_id),
                step=step or waiting_at,
                status=execution.status,
            )
        now = timezone.now()
        entry["payload"] = to_json(payload)
        entry["resumed_at"] = now.isoformat()
        if background:
            state.extra["worker"] = True
        execution.context = state.to_json()
        execution.status = ExecutionStatus.PENDING if background else ExecutionStatus.RUNNING
        execution.heartbeat_at = now
        execution.save(update_fields=["context", "status", "heartbeat_at", "updated_at"])
        if background:
            enqueue_on_commit(execution.id)
    return execution


def resume_by_correlation(
    reactor: type[Reactor], correlation_id: str, *, step: str | None, payload: Any
) -> Result:
    """Resume the (oldest) execution of ``reactor`` paused under ``correlation_id``."""
    from reactor_app.dsl.reactor import Reactor as BaseReactor

    waiting = Execution.objects.waiting_on_interrupt(str(correlation_id))
    if reactor is not BaseReactor:
        waiting = waiting.filter(reactor=reactor.path())
    if step is not None:
        waiting = waiting.filter(current_step=step)
    execution = waiting.order_by("created_at").first()
    if execution is None:
        raise ExecutionNotResumable(
            f"no execution of {reactor.path()} waits at an interrupt with correlation id "
            f"{correlation_id!r}",
            execution_id=None,
            step=step,
            status=None,
            correlation_id=str(correlation_id),
        )
    return resume(reactor, execution.id, step=step, payload=payload)


def _deadline_passed(entry: dict[str, Any], now: datetime) -> bool:
    deadline = parse_datetime(entry.get("deadline") or "")
    return deadline is not None and deadline <= now


# --------------------------------------------------------------------------------------------
# sweeping


def sweep(now: datetime | None = None) -> list[str]:
    """Re-enqueue worker executions whose delivery vanished; time out overdue interrupts.

    An execution is abandoned when its heartbeat is older than ``REACTOR_SWEEP_AFTER`` and its
    claim is free (a live delivery renews the claim however long its step runs). A parked
    execution is abandoned only once its own requeue is overdue by the same margin. Returns
    the ids enqueued.
    """
    now = now or timezone.now()
    stale = now - timedelta(seconds=reactor_settings.SWEEP_AFTER)
    enqueued: list[str] = []
    candidates = Execution.objects.filter(
        status__in=RUNNABLE, heartbeat_at__lt=stale, context__worker=True
    ).only("id", "status", "heartbeat_at", "context")
    for execution in candidates.iterator():
        if execution.status == ExecutionStatus.PARKED:
            requeue_at = parse_datetime((execution.context or {}).get("requeue_at") or "")
            if requeue_at is not None and requeue_at > stale:
                continue
        if ExecutionClaim.is_held(execution.id):
            continue
        # compare-and-set on the heartbeat: of two sweepers only one enqueues
        won = Execution.objects.filter(pk=execution.pk, heartbeat_at=execution.heartbeat_at).update(
            heartbeat_at=now
        )
        if won:
            enqueue(execution.id)
            enqueued.append(str(execution.id))
    renew_kept_holds(now)
    interrupted = Execution.objects.filter(status=ExecutionStatus.INTERRUPTED).only(
        "id", "context", "current_step"
    )
    for execution in interrupted.iterator():
        entry = (execution.context or {}).get("interrupts", {}).get(execution.current_step)
        overdue = bool(entry) and "payload" not in entry and _deadline_passed(entry, now)
        if overdue and _time_out_interrupt(execution.id, now):
            enqueued.append(str(execution.id))
    return enqueued


def renew_kept_holds(now: datetime | None = None) -> int:
    """Lengthen the reactor-level holds parked executions keep, for as long as they stay
    parked: until each is due back (its ``requeue_at``, or now when overdue) plus
    ``park_margin()``. A hold found lost is left to the execution, whose resume then fails
    with ``LeaseLost``. Returns how many holds were renewed."""
    now = now or timezone.now()
    parked = Execution.objects.filter(
        status=ExecutionStatus.PARKED, context__has_key=KEPT_HOLDS
    ).only("id", "root", "context")
    coordinator = Coordinator()
    renewed = 0
    for execution in parked.iterator():
        context = execution.context or {}
        holds = [h for e in context.get(KEPT_HOLDS) or [] if (h := _kept_hold(e)) is not None]
        if not holds:
            continue
        requeue_at = parse_datetime(context.get("requeue_at") or "")
        due = max((requeue_at - now).total_seconds(), 0.0) if requeue_at else 0.0
        owner = str(execution.root_id or execution.id)
        try:
            extended = coordinator.extend(holds, owner, lease_ms=int((due + park_margin()) * 1000))
        except ReactorError:
            logger.warning("could not renew the kept holds of %s", execution.id)
            continue
        renewed += len(extended.extended)
    return renewed


def _kept_hold(entry: dict[str, Any]) -> Hold | None:
    """A hold described by ``Gate.suspend`` (primitive, key, token, limit)."""
    primitive, key = entry.get("primitive"), entry.get("key")
    if not key:
        return None
    if primitive == "lock":
        return Hold(claim=LockClaim(str(key)), fresh=True, token=entry.get("token"))
    if primitive == "semaphore":
        return Hold(claim=SemaphoreClaim(str(key), limit=int(entry.get("limit") or 1)), fresh=True)
    return None


def _time_out_interrupt(execution_id: Any, now: datetime) -> bool:
    """Mark the interrupt timed out and hand the execution to a worker, which fails the
    interrupt step and rolls back."""
    with transaction.atomic():
        execution = Execution.objects.select_for_update().filter(pk=execution_id).first()
        if execution is None or execution.status != ExecutionStatus.INTERRUPTED:
            return False
        state = ExecutionState.from_json(execution.context)
        entry = state.extra.get("interrupts", {}).get(execution.current_step)
        if not entry or "payload" in entry or not _deadline_passed(entry, now):
            return False
        entry["timed_out"] = True
        state.extra["worker"] = True
        execution.context = state.to_json()
        execution.status = ExecutionStatus.PENDING
        execution.heartbeat_at = now
        execution.save(update_fields=["context", "status", "heartbeat_at", "updated_at"])
        enqueue_on_commit(execution.id)
    return True
