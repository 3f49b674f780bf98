"""What the engine does differently when it runs on a Celery worker.

* **Parking** (docs/design.md §2.3): contention in a worker does not wait and does not fail. The
  contended unit has run nothing and holds nothing of its own (admission is all-or-nothing;
  its ordered-lock position, if any, is kept). ``note_park`` counts the park in
  ``ContentionState`` — separately from failure retries — records a ``parked`` event, and picks
  the requeue delay: the primitive's own hint for a rate limit or an ordered lock, else the
  contention backoff with jitter. Past ``REACTOR_CONTENTION_CEILING`` parks of one unit the
  park becomes a ``ContentionCeilingExceeded`` failure (ordered-lock waits are never capped:
  the line moves on its own, and a dead head is passed over).
* **The hand-off guard** (docs/design.md §2.4): ownership never crosses a process hand-off, so
  handing an ``async_step`` or ``async_reactor`` to a worker while this execution holds a lock (or a
  limit-1 semaphore) the dispatched work declares would deadlock: the worker could never take
  the key its own dispatcher holds. ``guard_hand_off`` refuses that before anything is created
  or enqueued (for a parallel ``map_step``, per element).
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
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from reactor_app.conf import reactor_settings
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.state import lock_state, semaphore_state
from reactor_app.dsl.arguments import FromInput, Scope, Value
from reactor_app.dsl.declarations import Declaration, LockDeclaration, SemaphoreDeclaration
from reactor_app.dsl.kinds import AsyncReactorSpec, AsyncStepSpec, MapSpec
from reactor_app.dsl.step import StepSpec
from reactor_app.engine.enqueueing import wake
from reactor_app.exceptions import ContentionCeilingExceeded, HandOffRefused, ReactorError
from reactor_app.models import ContentionState, Execution
from reactor_app.status import CoordinationEventKind
from reactor_app.tracking import record_coordination

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun
    from reactor_app.engine.gate import ParkRequested

logger = logging.getLogger(__name__)

#: primitives whose refusal carries a useful "come back at" hint; a lock's or semaphore's
#: hint is only the holder's lease, an upper bound, so those use the backoff instead
HINTED_PRIMITIVES = ("rate_limit", "ordered_lock")
#: primitives whose waits are not capped by the contention ceiling (only by the optional
#: ``REACTOR_ORDERED_WAIT_CEILING``)
UNCAPPED_PRIMITIVES = ("ordered_lock",)


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


def outage_delay(run: ExecutionRun) -> float:
    """The requeue delay of a worker unit that met ``CoordinationUnavailable``: the contention
    backoff, growing with the outages this execution met (never counted as contention)."""
    continuation = run.root.state.continuation
    outages = continuation.outages = int(continuation.outages or 0) + 1
    logger.warning(
        "coordination store unreachable for %s; requeued (outage %d)", run.reactor_path, outages
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
    sweeps, so one missed sweep never loses them (at least 10 s)."""
    return max(2 * reactor_settings.SWEEP_INTERVAL, 10.0)


def requeue_delay(park: ParkRequested, attempts: int) -> float:
    refused = park.refused
    if refused.claim.primitive in HINTED_PRIMITIVES and refused.retry_after is not None:
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
    row, _ = ContentionState.objects.get_or_create(
        execution=run.execution,
        step=label,
        defaults={"primitive": claim.primitive, "key": claim.key},
    )
    attempts = row.attempts + 1
    ceiling = reactor_settings.CONTENTION_CEILING
    row.primitive, row.key, row.attempts = claim.primitive, claim.key, attempts
    row.blocker = _blocker_snapshot(park)
    where = f"step {label!r}" if label else "reactor-level coordination"
    if claim.primitive in UNCAPPED_PRIMITIVES:
        # ordered waits are uncapped unless REACTOR_ORDERED_WAIT_CEILING says otherwise
        ceiling = reactor_settings.ORDERED_WAIT_CEILING or attempts
    if attempts > ceiling:
        row.next_attempt_at = None
        row.save()
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
    row.next_attempt_at = timezone.now() + timedelta(seconds=delay)
    row.save()
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
        blocker=row.blocker,
    )
    return None


def _ceiling_setting(primitive: str) -> str:
    if primitive in UNCAPPED_PRIMITIVES:
        return "REACTOR_ORDERED_WAIT_CEILING"
    return "REACTOR_CONTENTION_CEILING"


def _blocker_snapshot(park: ParkRequested) -> dict[str, Any] | None:
    blocker = dict(park.refused.blocker or {})
    if park.refused.retry_after is not None:
        blocker.setdefault("retry_after", park.refused.retry_after)
    return blocker or None


# --------------------------------------------------------------------------------------------
# the hand-off guard


def _exclusive(declaration: Declaration) -> bool:
    """Declarations that deadlock when the dispatcher holds their key: locks, limit-1 semaphores."""
    if isinstance(declaration, LockDeclaration):
        return True
    return isinstance(declaration, SemaphoreDeclaration) and declaration.limit == 1


def _keys(
    declarations: Iterable[Declaration], args: dict[str, Any], reactor: str, step: str | None
) -> list[tuple[str, str, str | None]]:
    found = []
    for declaration in declarations:
        if _exclusive(declaration):
            key = declaration.compute_key(args, reactor=reactor, step=step)
            found.append((declaration.primitive, key, step))
    return found


def dispatched_keys(spec: StepSpec, args: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """``(primitive, key, declared_by)`` of the exclusive keys the dispatched work will take.

    For an ``async_step``: the step's own declarations, keyed on its arguments. For an
    ``async_reactor``: the child's reactor-level declarations (keyed on its inputs, the
    arguments) and those of its steps whose arguments come from inputs and constants alone —
    the only step keys knowable before the child runs.
    """
    if isinstance(spec, (AsyncStepSpec, MapSpec)):  # a parallel map's element is one step
        return _keys(
            spec.declarations.ordered(), args, spec.owner.path() if spec.owner else "", spec.name
        )
    assert isinstance(spec, AsyncReactorSpec)
    child = spec.target
    found = _keys(child.declarations().ordered(), args, child.path(), None)
    for name, child_spec in child.steps.items():
        step_class = child_spec.step_class()
        if step_class is None or not child_spec.declarations:
            continue
        if not all(isinstance(s, (FromInput, Value)) for s in child_spec.arguments.values()):
            continue
        scope = Scope(args, {})
        step_args = (
            {n: s.resolve(scope) for n, s in child_spec.arguments.items()}
            if child_spec.arguments
            else dict(args)
        )
        found.extend(_keys(child_spec.declarations.ordered(), step_args, child.path(), name))
    return found


def guard_hand_off(run: ExecutionRun, spec: StepSpec, args: dict[str, Any]) -> None:
    """Raise ``HandOffRefused`` if the dispatched work declares a key this execution holds."""
    for primitive, key, declared_by in dispatched_keys(spec, args):
        held = run.held_keys.holds(primitive, key)
        if not held:
            continue
        holding_steps = [s for s in held.get("steps", []) if s]
        holder_where = (
            f"its step {holding_steps[-1]!r}" if holding_steps else f"its reactor-level {primitive}"
        )
        target = spec.target.__qualname__
        in_target = ""
        if declared_by and declared_by != spec.name:
            in_target = f" (step {declared_by!r} of {target})"
        kind = _hand_off_kind(spec)
        message = (
            f"step {spec.name!r} of {run.reactor_path}: handing {target} to a worker "
            f"({kind}) would deadlock: it declares {primitive} {key!r}{in_target}, which this "
            f"execution (owner {run.owner}) already holds through {holder_where}, and ownership "
            "never crosses a process hand-off. Nothing was enqueued. Remedies: run it in this "
            f"execution instead (compose({target}, ...) for a reactor, step({target}, ...) for "
            "a step — the same owner re-enters the key), narrow one of the keys so they "
            "differ, or release the outer hold before handing off"
        )
        holder = {
            "owner": run.owner,
            "execution": run.root.execution_id,
            "step": holding_steps[-1] if holding_steps else None,
        }
        record_coordination(
            CoordinationEventKind.HANDOFF_REFUSED,
            primitive=primitive,
            key=key,
            owner=run.owner,
            step=spec.name,
            reactor=run.reactor_path,
            execution_id=run.execution_id,
            holder=holder,
            target=target,
            handoff=kind,
        )
        raise HandOffRefused(
            message,
            reactor=run.reactor_path,
            step=spec.name,
            key=key,
            primitive=primitive,
            holder=holder,
        )


def _hand_off_kind(spec: StepSpec) -> str:
    if isinstance(spec, MapSpec):
        return "map_step(parallel=True)"
    return "async_step" if isinstance(spec, AsyncStepSpec) else "async_reactor"


def dispatcher_owners(run: ExecutionRun) -> list[str]:
    """The owners of the executions that handed ``run``'s tree off through ``async_reactor``
    (nearest first); empty for every other tree. Looked up once per delivery."""
    root = run.root
    cached = getattr(root, "_dispatcher_owners", None)
    if cached is not None:
        return list(cached)
    owners: list[str] = []
    execution = root.execution
    seen: set[str] = set()
    while execution.parent_id is not None and str(execution.root_id) == str(execution.id):
        # an async_reactor child is a tree of its own whose parent is its dispatcher
        parent = Execution.objects.filter(pk=execution.parent_id).only("id", "root", "parent")
        found = parent.first()
        if found is None:
            break
        owner = str(found.root_id or found.id)
        if owner in seen:
            break
        seen.add(owner)
        owners.append(owner)
        execution = Execution.objects.filter(pk=owner).only("id", "root", "parent").first()
        if execution is None:
            break
    root._dispatcher_owners = owners
    return list(owners)


def guard_dispatcher_keys(
    run: ExecutionRun, spec: StepSpec, args: dict[str, Any], label: str
) -> None:
    """``HandOffRefused`` when a step of an ``async_reactor`` child declares an exclusive key
    its dispatcher still holds — a key that depends on a result or a map element, so the
    dispatcher's own guard (``guard_hand_off``) could not compute it. Waiting would wait for
    an execution that is itself waiting for this one."""
    exclusive = [d for d in spec.declarations.ordered() if _exclusive(d)]
    if not exclusive:
        return
    owners = dispatcher_owners(run)
    if not owners:
        return
    for primitive, key, _ in _keys(exclusive, args, run.reactor_path, label):
        if primitive == "lock":
            holder = lock_state(key).owner
            holders = [holder] if holder else []
        else:
            holders = [h.owner for h in semaphore_state(key).holders]
        dispatcher = next((o for o in owners if o in holders), None)
        if dispatcher is None:
            continue
        holder_info = {"owner": dispatcher, "execution": dispatcher, "step": None}
        record_coordination(
            CoordinationEventKind.HANDOFF_REFUSED,
            primitive=primitive,
            key=key,
            owner=run.owner,
            step=label,
            reactor=run.reactor_path,
            execution_id=run.execution_id,
            holder=holder_info,
            target=run.reactor_path,
            handoff="async_reactor",
        )
        raise HandOffRefused(
            f"step {label!r} of {run.reactor_path}: it declares {primitive} {key!r}, which "
            f"execution {dispatcher} holds — the execution that handed this run to a worker "
            "(async_reactor). It would wait for an execution that waits for it, and ownership "
            "never crosses a process hand-off. Remedies: compose(...) the child instead (the "
            "same owner re-enters the key), narrow one of the keys so they differ, or release "
            "the outer hold before handing off",
            reactor=run.reactor_path,
            step=label,
            key=key,
            primitive=primitive,
            holder=holder_info,
        )


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
    claim TTL), it may still be inside the step; it finds its lease lost at its next renewal.
    Returns the ``(primitive, key)`` pairs actually released; records a ``forced_release``
    event (``detail={"reason": "redelivery"}``) for each and wakes their parked waiters.
    """
    run.state.continuation.kept_holds = None
    registry = run.held_keys.registry
    if registry is None:
        return []
    try:
        targets = registry.entries()
    except ReactorError:  # Redis unreachable: admission will report it
        logger.warning("could not read the held-key registry of %s", run.owner)
        return []
    coordinator = Coordinator()
    released: list[tuple[str, str]] = []
    woken: list[str] = []
    for primitive, key, step in targets:
        try:
            outcome = coordinator.force_release(primitive, key, owner=run.owner)
        except (ReactorError, ValueError):
            logger.warning("could not drop stale %s %r of %s", primitive, key, run.owner)
            continue
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
    registry.withdraw([(primitive, key) for primitive, key, _ in targets])
    if woken:
        wake(woken)
    return released
