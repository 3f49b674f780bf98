"""Running an execution on a worker: the body of the ``reactor_app.run_execution`` task.

``deliver`` takes the execution claim (``engine.claim``), runs one pass of the engine and
follows up once the claim is let go:

1. A countdown requeue (it carries a ``requeue_token``) first reads the row: it is dropped if
   the execution is finished, or left over from an earlier park (its token names another
   park). Other deliveries — a new execution, a wake, a sweep — skip that read: the claim
   statement reads the row, and one round trip less comes before the body.
2. Take the claim. A delivery that finds it taken exits; if the execution is not finished it
   looks again when the claim would lapse (its holder may have been killed). Holding it, the
   claim statement (``ExecutionManager.claim``: one ``UPDATE ... RETURNING``) reads the row
   back and increments its claim generation; every later write of this delivery is
   conditional on that generation, so if the Redis claim is lost (a restarted Redis) and a
   duplicate delivery claims the row, this one writes nothing more (``ClaimLost``) and a
   terminal status it or the duplicate wrote stays final.
3. Run one pass. With ``acks_late`` and ``reject_on_worker_lost`` a killed worker's task is
   redelivered, and the engine continues from the execution's last checkpoint. A delivery
   that finds the execution still ``running`` once it holds the claim is taking over from a
   dead delivery: it first drops the holds that one left (``engine.worker.drop_stale_holds``),
   so the redelivery does not re-enter them as an extra nesting level.
4. Follow up: a pass that ends ``parked`` is requeued with ``apply_async(countdown=...)`` at
   the delay ``engine.worker.note_park`` chose — never with Celery's ``retry``, which would
   spend ``max_retries`` on contention. The release that frees the key re-enqueues the waiter
   at once (``engine.enqueueing.wake``); the countdown requeue stays as the safety net and
   duplicate deliveries are harmless thanks to the claim. A finished child wakes a parent
   parked on it.
"""

from __future__ import annotations

import logging
from typing import Any

from django.utils import timezone

from reactor_app.conf import reactor_settings
from reactor_app.coordination.renewal_scope import renewals_scope
from reactor_app.dsl.registry import lookup
from reactor_app.engine import countdowns, debounce
from reactor_app.engine.cancel_flag import flag_keys, note_read
from reactor_app.engine.claim import CLAIM_WAIT, ExecutionClaim, delivery_owner
from reactor_app.engine.enqueueing import enqueue_quietly
from reactor_app.engine.executor import ExecutionRun
from reactor_app.engine.in_flight import mark_in_flight
from reactor_app.engine.lost_deliveries import arm_verdict, note_lost
from reactor_app.engine.outcomes import RunEnd
from reactor_app.engine.policy import ON_WORKER
from reactor_app.engine.priority import message_priority, stored_message_priority
from reactor_app.engine.state import ExecutionState, ParkedOn
from reactor_app.engine.time_slice import DeliveryTimeUp, SoftTimeLimitExceeded, TimeSlice
from reactor_app.engine.worker import ClaimLost, backoff_seconds, drop_stale_holds
from reactor_app.exceptions import CoordinationUnavailable, ReactorNotRegistered
from reactor_app.models import Execution
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from reactor_app.tracking import record_coordination

logger = logging.getLogger(__name__)

#: statuses a delivery may (continue to) run
RUNNABLE = (ExecutionStatus.PENDING, ExecutionStatus.RUNNING, ExecutionStatus.PARKED)


def deliver(
    execution_id: str,
    *,
    task_id: str | None = None,
    requeue_token: str | None = None,
    start: str | None = None,
    due: float | None = None,
    priority: int | None = None,
    clock: TimeSlice | None = None,
    outages: int = 0,
) -> dict[str, Any]:
    """Body of the ``run_execution`` task: claim the execution, run one pass, follow up.

    ``requeue_token`` marks the countdown requeue of one park; it is dropped when the execution
    has parked again since (that newer park has its own requeue), so leftover requeues never
    pile up into extra contention attempts. ``start`` (a new execution's message names its
    first step, ``engine.enqueueing.run_async``): the claim statement also writes the pass's
    start when the row is still pending and never started — one statement fewer. ``due`` and
    ``priority``: a message sent early, because its countdown was longer than a broker holds
    (``engine.countdowns``), is sent on for what is left and does nothing else. ``clock``:
    the delivery's share of its task's time limit (``engine.time_slice``). ``outages``: the
    coordination outages the deliveries before this one met in a row before they could claim
    the execution (``_retry_after_outage``).
    """
    summary: dict[str, Any] = {"execution_id": execution_id}
    left = countdowns.left_until(due)
    if left > 0:
        # neither the row nor the claim: a hop costs the broker one message
        enqueue_quietly(
            execution_id,
            countdown=left,
            requeue_token=requeue_token,
            priority=priority,
            start=start,
            outages=outages,
        )
        return {**summary, "outcome": "deferred", "due_in": left}
    execution: Execution | None = None
    if requeue_token is not None:
        # A park's countdown requeue is most often stale by the time it is due (the release
        # that freed the key woke the execution long before): one read drops it without the
        # claim's round trips. Other deliveries — a new execution, a wake — are nearly always
        # live work, and the claim statement reads the row anyway: no read first, one round
        # trip less before their body (docs/benchmarks.md, "Wake latency").
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
        # the cancel flag in the claim's round trip: the pass's start reads it from there
        claimed = claim.acquire(wait=CLAIM_WAIT, read_with=tuple(flag_keys(execution_id)))
        if claim.read is not None:
            note_read(execution_id, claim.read[0])
    except CoordinationUnavailable as outage:
        execution = execution or Execution.objects.filter(pk=execution_id).first()
        if execution is None or execution.status not in RUNNABLE:
            return {**summary, **_unrunnable(execution)}
        return {
            **summary,
            **_retry_after_outage(
                execution, outage, outages, start=start, requeue_token=requeue_token
            ),
        }
    if not claimed:
        execution = Execution.objects.filter(pk=execution_id).first()
        if execution is None:
            return {**summary, "outcome": "missing"}
        if execution.status in RUNNABLE:
            # Running elsewhere — or its delivery was killed and the claim has yet to lapse,
            # even one that had only just taken a parked execution: look again then. A parked
            # one keeps its park's token, so if a live delivery parks it again meanwhile this
            # look is recognised as stale and dropped.
            token = ExecutionState.peek(execution.context).continuation.requeue_token
            try:
                countdown = claim.ttl_left() + 0.5
            except CoordinationUnavailable:
                countdown = claim.ttl
            enqueue_quietly(
                execution_id,
                countdown=countdown,
                requeue_token=token if execution.status == ExecutionStatus.PARKED else None,
                priority=_priority_of(execution),
            )
        return {**summary, "outcome": "claimed_elsewhere", "status": execution.status}
    run: ExecutionRun | None = None
    try:
        claim.start_renewal()
        # The claim statement: the row as it is now, with a new claim generation that every
        # later write of this delivery is conditional on (a terminal status is final)
        claimed_row = Execution.objects.claim(
            execution_id, RUNNABLE, start=start if requeue_token is None else None
        )
        if claimed_row is None:
            # gone, or ended (meanwhile): report what it ended as
            return {**summary, **_unrunnable(Execution.objects.filter(pk=execution_id).first())}
        execution = claimed_row
        if _stale_requeue(execution, requeue_token):
            return {**summary, "outcome": "nothing_to_do", "status": execution.status}
        replaced = _debounced(execution)
        if replaced is not None:
            return {**summary, **replaced}
        try:
            lookup(execution.reactor)
        except ReactorNotRegistered as missing:
            return {**summary, **_fail_unrunnable(execution, missing)}
        with renewals_scope():  # a soft limit that cut a gate's exit leaves no renewal on
            run = _run_pass(execution, claim, clock)
    except CoordinationUnavailable as outage:
        # only from dropping a dead delivery's holds (an outage in a pass parks it instead):
        # nothing ran, the row is still "running", so the next delivery takes over again
        taking_over = execution if execution is not None else execution_id
        return {
            **summary,
            **_retry_after_outage(taking_over, outage, outages, ExecutionStatus.RUNNING),
        }
    except (DeliveryTimeUp, SoftTimeLimitExceeded):
        # the task's soft time limit ran out outside a body (engine.time_slice): the claim is
        # given back below, and the next delivery takes over from the last checkpoint
        logger.warning("delivery of %s stopped by its soft time limit", execution_id)
        enqueue_quietly(execution_id, priority=_priority_of(execution))
        return {**summary, "outcome": "time_up"}
    except ClaimLost:
        if _superseded(execution_id):
            # a debounced start replaced after this delivery decided to run it, before its
            # start was written (``ExecutionManager.supersede`` took the claim): nothing ran
            return {**summary, "outcome": "superseded", "status": ExecutionStatus.SUPERSEDED}
        # Another delivery may run it now, or nobody (the claim vanished with a restarted
        # Redis): look again once a claim would have lapsed; a duplicate is harmless.
        logger.warning("delivery of %s stopped: its claim lapsed", execution_id)
        enqueue_quietly(execution_id, countdown=claim.ttl, priority=_priority_of(execution))
        return {**summary, "outcome": "claim_lost"}
    finally:
        claim.release()
    return {**summary, **_follow_up(run)}


def _unrunnable(execution: Execution | None) -> dict[str, Any]:
    """What a delivery reports for an execution it has nothing to run of."""
    if execution is None:
        return {"outcome": "missing"}
    return {"outcome": "nothing_to_do", "status": execution.status}


def _retry_after_outage(
    execution: Execution | str,
    outage: CoordinationUnavailable,
    outages: int = 0,
    status: str | None = None,
    *,
    start: str | None = None,
    requeue_token: str | None = None,
) -> dict[str, Any]:
    """The coordination Redis is unavailable (``outage``: down, full, refusing its ACL user)
    before this delivery could claim ``execution`` (or drop the holds of the dead delivery it
    takes over from): nothing ran; send it again after a backoff that grows with the outages
    met in a row (``outages`` before this one, carried by the message: there is no state to
    keep them in before a claim) — a long outage costs each waiting execution a message per
    backoff cap, not one per base delay. The message keeps what the one it replaces carried:
    the execution's priority, a new execution's ``start`` and a park's ``requeue_token``
    (without it, a countdown requeue that met an outage would not be recognised as stale once
    the execution parked again). If the broker is unreachable too, the sweeper re-enqueues it
    once the heartbeat is stale (docs/operations.md, "Recovery")."""
    row = execution if isinstance(execution, Execution) else None
    execution_id = row.pk if row is not None else execution
    met = max(outages, 0) + 1
    delay = backoff_seconds(met)
    logger.warning(
        "coordination store unavailable; %s requeued in %.1fs (outage %d): %s",
        execution_id,
        delay,
        met,
        outage.message,
    )
    enqueue_quietly(
        execution_id,
        countdown=delay,
        outages=met,
        priority=_priority_of(row),
        start=start,
        requeue_token=requeue_token,
    )
    if status is None and row is not None:
        status = row.status
    return {"outcome": "coordination_unavailable", "status": status}


def _priority_of(execution: Execution | None) -> int | None:
    """The message priority of a requeue of ``execution`` (None when the row was not read: it
    is then sent as a default-priority message is)."""
    return stored_message_priority(execution.context) if execution is not None else None


def _fail_unrunnable(execution: Execution, missing: ReactorNotRegistered) -> dict[str, Any]:
    """End an execution whose reactor this worker cannot import: terminal, with the reason on
    the row (the sweeper only re-enqueues runnable rows, so it is not retried forever)."""
    logger.error("execution %s failed: %s", execution.id, missing.message)
    now = timezone.now()
    execution.status = ExecutionStatus.FAILED
    execution.error = missing.as_dict()
    execution.finished_at = now
    execution.heartbeat_at = now
    # conditional on this delivery's claim, like every status write of a delivery
    written = Execution.objects.filter(
        pk=execution.pk, claim_generation=execution.claim_generation
    ).update(
        status=execution.status,
        error=execution.error,
        finished_at=now,
        heartbeat_at=now,
        updated_at=now,
    )
    if not written:
        return {"outcome": "claim_lost", "status": execution.status}
    if (
        execution.parent_id
        and Execution.objects.filter(pk=execution.parent_id, status=ExecutionStatus.PARKED).exists()
    ):
        enqueue_quietly(execution.parent_id)  # a parent waiting on this child sees it ended
    return {"outcome": "failed", "status": execution.status, "error": missing.message}


def _debounced(execution: Execution) -> dict[str, Any] | None:
    """A pending start of a debounce burst that a later start replaced does not run
    (``engine.debounce.at_delivery``): what the delivery reports instead, or None to run it."""
    burst = (execution.context or {}).get("debounce")
    # only a start that never ran: a resumed or cancelled run is pending again, and keeps
    # its burst key, but is past its burst
    if execution.status != ExecutionStatus.PENDING or not burst or execution.started_at:
        return None
    try:
        decision = debounce.at_delivery(execution, str(burst))
    except CoordinationUnavailable as outage:
        return _retry_after_outage(execution, outage)
    if decision == "wait":
        enqueue_quietly(execution.pk, countdown=debounce.WAIT_FOR_LATEST)
        return {"outcome": "debounce_wait", "status": execution.status}
    if decision == "superseded":
        return {"outcome": "superseded", "status": ExecutionStatus.SUPERSEDED}
    if decision == "ended":
        return _unrunnable(Execution.objects.filter(pk=execution.pk).first())
    return None


def _superseded(execution_id: str) -> bool:
    """The row ended ``superseded`` (a debounce settle marked it after this delivery claimed
    it): a lost claim that needs no second look."""
    status = Execution.objects.filter(pk=execution_id).values_list("status", flat=True).first()
    return status == ExecutionStatus.SUPERSEDED


def _stale_requeue(execution: Execution, requeue_token: str | None) -> bool:
    if requeue_token is None or execution.status != ExecutionStatus.PARKED:
        return False
    return ExecutionState.peek(execution.context).continuation.requeue_token != requeue_token


def _run_pass(execution: Execution, claim: ExecutionClaim, clock: TimeSlice | None) -> ExecutionRun:
    was_parked = execution.status == ExecutionStatus.PARKED
    # Still "running" although this delivery now holds the claim: the delivery that set it
    # died mid-run (or lost its claim). "pending" and "parked" passes ended cleanly.
    # (unless the claim statement itself just started it)
    taken_over = execution.status == ExecutionStatus.RUNNING and not execution.claimed_start
    run = ExecutionRun(
        lookup(execution.reactor), execution, dict(execution.inputs), policy=ON_WORKER
    )
    run.started_by_claim = execution.claimed_start
    run.time_slice = clock
    run.on_persist = claim.check
    if taken_over:
        drop_stale_holds(run)
        # what the lost delivery may have been running, to compensate if the run ends before
        # it runs again; a delivery that took over from none wrote a map's elements in batches
        mark_in_flight(run, batched=run.state.continuation.lost_deliveries is None)
        # counted (and the marks written) once the holds are dropped: an outage there sends
        # it again uncounted
        note_lost(run)
    arm_verdict(run, taken_over=taken_over)
    if was_parked:
        _record_resumed(run)
    marker = run.state.origin.dispatch
    end = run.execute_async_step() if marker and marker["kind"] == "async_step" else run.execute()
    run.finish(end)
    run.last_end = end
    return run


def _record_resumed(run: ExecutionRun) -> None:
    parked_on, run.state.continuation.parked_on = run.state.continuation.parked_on, None
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


def _parked_for(parked_on: ParkedOn) -> dict[str, Any]:
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
            execution.id,
            countdown=delay,
            requeue_token=run.state.continuation.requeue_token,
            # its priority again, so a broker that orders by it serves the requeue so too
            priority=message_priority(run.priority),
        )
        return {"outcome": "parked", "status": execution.status, "requeue_in": round(delay, 3)}
    marker = run.state.origin.dispatch
    if execution.is_terminal and marker and execution.parent_id:
        parent_waits = Execution.objects.filter(
            pk=execution.parent_id, status=ExecutionStatus.PARKED
        ).exists()
        if parent_waits:
            enqueue_quietly(execution.parent_id)
    return {"outcome": end.status if end else execution.status, "status": execution.status}
