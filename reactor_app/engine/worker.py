"""What the engine does differently when it runs on a Celery worker.

* **Parking** (docs/design.md §2.3): contention in a worker does not wait and does not fail. The
  contended unit has run nothing and holds nothing of its own (admission is all-or-nothing;
  its ordered-lock position, if any, is kept). ``note_park`` counts the park in
  ``ContentionState`` — separately from failure retries — records a ``parked`` event, and picks
  the requeue delay: the primitive's own hint for a rate limit or an ordered lock, else the
  contention backoff with jitter. Past ``REACTOR_CONTENTION_CEILING`` parks of one unit the
  park becomes a ``ContentionCeilingExceeded`` failure (ordered-lock waits are never capped:
  the line moves on its own, and a dead head is passed over).
* **The hand-off guard** (docs/design.md §2.4) refuses to hand work to a worker that could never
  take a key its own dispatcher holds: ``engine.hand_off_guard``.
* ``ClaimLost``: the delivery's claim on its execution lapsed, so another delivery may now be
  running it; the engine stops at the next checkpoint.
* **Taking over after a crash**: holds belong to the root execution id, not to a delivery, so a
  redelivery would re-enter the holds its killed predecessor left (one more nesting level) and,
  releasing once, leave the key held until the TTL lapses. ``drop_stale_holds`` force-releases
  what the execution's held-key registry lists (``coordination.registry``) first.
* **Coming back later without contention**: a failure retry's backoff and a coordination outage
  requeue the execution (``outage_delay``) instead of sleeping in the delivery or failing it.
* **Holds kept across a park** last until the execution is due back plus a margin
  (``kept_hold_cover``); the sweeper lengthens them while it stays parked.
"""

from __future__ import annotations

import logging
import random
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError
from django.utils import timezone

from reactor_app import isolation
from reactor_app.conf import reactor_settings
from reactor_app.coordination import primitives
from reactor_app.coordination.admission import Coordinator
from reactor_app.engine.enqueueing import wake
from reactor_app.exceptions import ContentionCeilingExceeded, CoordinationUnavailable, ReactorError
from reactor_app.models import ContentionState
from reactor_app.status import CoordinationEventKind
from reactor_app.tracking import record_coordination

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun
    from reactor_app.engine.gate import ParkRequested

logger = logging.getLogger(__name__)


class ClaimLost(Exception):
    """The delivery's claim on its execution lapsed; another delivery may be running it."""


# --------------------------------------------------------------------------------------------
# parking


def backoff_seconds(attempts: int, rng: random.Random | None = None) -> float:
    """The park delay after ``attempts`` parks: exponential from the base, capped, with jitter.

    "Equal jitter": half the step is fixed, half random, so parked executions spread out
    without any of them coming back almost at once.
    """
    base, cap = reactor_settings.CONTENTION_BACKOFF
    step = min(cap, base * 2 ** max(attempts - 1, 0))
    return step / 2 + (rng or random).uniform(0, step / 2)


def outage_delay(run: ExecutionRun, outage: CoordinationUnavailable) -> float:
    """The requeue delay of a worker unit that met ``outage``: the contention backoff, growing
    with the outages this execution met (never counted as contention). The log line carries
    the error's message, which says what the server does — unreachable, out of memory,
    refusing its ACL user — and what to change: each is fixed in a different place."""
    continuation = run.root.state.continuation
    outages = continuation.outages = int(continuation.outages or 0) + 1
    logger.warning(
        "coordination store unavailable for %s; requeued (outage %d): %s",
        run.reactor_path,
        outages,
        outage.message,
    )
    return backoff_seconds(outages)


def kept_hold_cover(requeue_in: float | None) -> float:
    """Seconds a hold kept across a park must last: until the execution is due back, plus a
    margin for the delivery to be picked up; the sweeper lengthens it again for as long as the
    execution stays parked (``engine.sweeper``). A park waiting on an async child has no
    requeue delay of its own: the child's end wakes it, the cap of the backoff is its bound."""
    due = requeue_in if requeue_in is not None else reactor_settings.CONTENTION_BACKOFF[1]
    return max(due, 0.0) + park_margin()


def park_margin() -> float:
    """Slack on top of a parked execution's due time before its kept holds could lapse: two
    sweeps, so one missed sweep never loses them (at least 10 s). The sweeps are the workers'
    own (``SWEEP_INTERVAL``) or, with those off, the ones scheduled outside them
    (``EXTERNAL_SWEEP_INTERVAL``): a margin counted from a 0 interval would let the holds
    lapse between two beat or cron sweeps."""
    every = reactor_settings.SWEEP_INTERVAL or reactor_settings.EXTERNAL_SWEEP_INTERVAL
    return max(2 * every, 10.0)


def requeue_delay(park: ParkRequested, attempts: int) -> float:
    refused = park.refused
    # a primitive whose refusal carries a useful "come back at" hint (``Primitive.HINTED``);
    # the others' hint is only the holder's lease, an upper bound: they use the backoff
    if refused.claim.primitive in primitives.HINTED and refused.retry_after is not None:
        # a little jitter so that executions refused by the same window do not come back
        # in the same millisecond
        return max(float(refused.retry_after), 0.0) + random.uniform(0.0, 0.05)
    return backoff_seconds(attempts)


def note_park(
    run: ExecutionRun, label: str, park: ParkRequested
) -> ContentionCeilingExceeded | None:
    """Count one park of unit ``label`` ("" = reactor level) of ``run``.

    Returns the failure to report instead when the ceiling is passed; otherwise records the
    park (``ContentionState``, ``parked`` event) and sets ``run.root.requeue_in``.
    """
    claim = park.refused.claim
    earlier = ContentionState.objects.filter(execution=run.execution, step=label).first()
    attempts = (earlier.attempts if earlier is not None else 0) + 1
    blocker = _blocker_snapshot(park)
    ceiling = reactor_settings.CONTENTION_CEILING
    where = f"step {label!r}" if label else "reactor-level coordination"
    if claim.primitive in primitives.UNCAPPED_WAITS:
        # ordered waits are uncapped unless REACTOR_ORDERED_WAIT_CEILING says otherwise
        ceiling = reactor_settings.ORDERED_WAIT_CEILING or attempts

    def record(next_attempt_at: Any) -> None:
        # One statement with every field: the row is never seen (admin, API, a test) holding
        # the park without its count, as a create followed by an update showed it (attempts 0
        # in between). Not ``update_or_create``: its read-then-write transaction fails at once
        # with "database is locked" on SQLite when another process writes (a deferred
        # transaction cannot upgrade its lock), and this runs in every parking worker.
        fields = {
            "primitive": claim.primitive,
            "key": claim.key,
            "attempts": attempts,
            "blocker": blocker,
            "next_attempt_at": next_attempt_at,
        }
        rows = ContentionState.objects.filter(execution=run.execution, step=label)
        if earlier is not None and rows.update(**fields, updated_at=timezone.now()):
            return
        try:
            with isolation.atomic():
                ContentionState.objects.create(execution=run.execution, step=label, **fields)
        except IntegrityError:
            # created meanwhile (only a delivery that lost its claim could): count onto it
            rows.update(**fields, updated_at=timezone.now())

    if attempts > ceiling:
        record(None)
        return ContentionCeilingExceeded(
            f"{where} of {run.reactor_path} was refused {attempts} times on {claim.primitive} "
            f"{claim.key!r} ({_ceiling_setting(claim.primitive)} = {ceiling}); the work never "
            "ran",
            reactor=run.reactor_path,
            step=label or None,
            key=claim.key,
            primitive=claim.primitive,
            attempts=attempts,
        )
    delay = requeue_delay(park, attempts)
    record(timezone.now() + timedelta(seconds=delay))
    run.state.contention[label] = attempts
    run.root.requeue_in = delay
    # what the next delivery reports as "resumed"
    run.root.state.continuation.parked_on = {
        "execution": run.execution_id,
        "step": label,
        "primitive": claim.primitive,
        "key": claim.key,
        # wall clock: the resuming delivery may run in another process (wake latency metric)
        "at": timezone.now().timestamp(),
    }
    record_coordination(
        CoordinationEventKind.PARKED,
        primitive=claim.primitive,
        key=claim.key,
        owner=run.owner,
        step=label or None,
        reactor=run.reactor_path,
        execution_id=run.execution_id,
        attempts=attempts,
        requeue_in=round(delay, 3),
        blocker=blocker,
    )
    return None


def _ceiling_setting(primitive: str) -> str:
    if primitive in primitives.UNCAPPED_WAITS:
        return "REACTOR_ORDERED_WAIT_CEILING"
    return "REACTOR_CONTENTION_CEILING"


def _blocker_snapshot(park: ParkRequested) -> dict[str, Any] | None:
    blocker = dict(park.refused.blocker or {})
    if park.refused.retry_after is not None:
        blocker.setdefault("retry_after", park.refused.retry_after)
    return blocker or None


# --------------------------------------------------------------------------------------------
# taking over from a dead delivery


def drop_stale_holds(run: ExecutionRun) -> list[tuple[str, str]]:
    """Force-release every lock and semaphore slot a dead delivery of ``run`` left behind.

    Called by a delivery that takes over an execution still ``running`` at claim time (its
    previous delivery was killed mid-run, or lost its claim), before any admission. Holds are
    owned by the root execution id — the same owner this delivery uses — so without this the
    redelivery would re-enter them (nesting count 2), release once, and leave the key held
    until its TTL lapses. While this delivery holds the execution claim no other delivery of
    the execution runs, so whatever the execution's held-key registry lists
    (``coordination.registry``: announced before every admission of that delivery, withdrawn
    when given back) is the dead one's: reactor-level holds, step holds, holds inside composed
    children and maps over reactors, and those re-taken by an interrupted compensate/undo.
    Holds kept across an earlier park are listed too, and dropped (not adopted). Rate-limit
    charges and ordered positions need nothing: a charge is spent, a position is reused.

    Caveat: if the predecessor is not dead but only lost its claim (renewal failed for a whole
    claim TTL), it may still be inside the step; it finds its lease lost at its next renewal,
    and its release frees nothing this delivery takes again (a lock's release names its
    admission's fencing token).
    Returns the ``(primitive, key)`` pairs actually released; records a ``forced_release``
    event (``detail={"reason": "redelivery"}``) for each and wakes their parked waiters.
    Raises ``CoordinationUnavailable`` when Redis cannot be reached, before changing anything
    it did not release: going on would re-enter the stale holds (the key held until its TTL
    after this delivery's release) and a park for the outage would make the next delivery
    no takeover — ``deliver`` sends the execution again later instead, still ``running``.
    """
    registry = run.held_keys.registry
    if registry is None:
        run.state.continuation.kept_holds = None
        return []
    targets = registry.entries()  # CoordinationUnavailable: nothing changed yet
    run.state.continuation.kept_holds = None
    coordinator = Coordinator()
    released: list[tuple[str, str]] = []
    woken: list[str] = []
    done: list[tuple[str, str]] = []
    for primitive, key, step in targets:
        try:
            # not handed on to a waiter: this delivery takes them again at once
            outcome = coordinator.force_release(primitive, key, owner=run.owner, hand_on=False)
        except CoordinationUnavailable:
            registry.withdraw(done)  # best effort, like every withdrawal
            if woken:
                wake(woken)
            raise
        except (ReactorError, ValueError):
            logger.warning("could not drop stale %s %r of %s", primitive, key, run.owner)
            continue
        done.append((primitive, key))
        if not outcome.released:
            continue
        released.append((primitive, key))
        woken.extend(outcome.woken)
        record_coordination(
            CoordinationEventKind.FORCED_RELEASE,
            primitive=primitive,
            key=key,
            owner=run.owner,
            step=step,
            reactor=run.reactor_path,
            execution_id=run.execution_id,
            reason="redelivery",
        )
    registry.withdraw(done)
    if woken:
        wake(woken)
    return released
