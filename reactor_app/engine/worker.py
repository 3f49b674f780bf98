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
  or enqueued.
* ``ClaimLost``: the delivery's claim on its execution lapsed, so another delivery may now be
  running it; the engine stops at the next checkpoint.
* **Taking over after a crash**: holds belong to the root execution id, not to a delivery, so a
  redelivery would re-enter the holds its killed predecessor left (one more nesting level) and,
  releasing once, leave the key held until the TTL lapses. ``drop_stale_holds`` force-releases
  them first.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from reactor_app.conf import reactor_settings
from reactor_app.dsl.arguments import FromInput, PathError, Scope, Value
from reactor_app.dsl.coordination import Declaration, LockDeclaration, SemaphoreDeclaration
from reactor_app.dsl.kinds import (
    AsyncReactorSpec,
    AsyncStepSpec,
    ComposeSpec,
    InterruptSpec,
    MapSpec,
)
from reactor_app.dsl.step import StepSpec
from reactor_app.engine.context import KEPT_HOLDS
from reactor_app.exceptions import ContentionCeilingExceeded, HandOffRefused, ReactorError
from reactor_app.models import ContentionState
from reactor_app.status import CoordinationEventKind
from reactor_app.tracking import record_coordination

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun
    from reactor_app.engine.gate import ParkRequested

logger = logging.getLogger(__name__)

#: primitives whose refusal carries a useful "come back at" hint; a lock's or semaphore's
#: hint is only the holder's lease, an upper bound, so those use the backoff instead
HINTED_PRIMITIVES = ("rate_limit", "ordered_lock")
#: primitives whose waits are not capped by the contention ceiling
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
    if claim.primitive not in UNCAPPED_PRIMITIVES and attempts > ceiling:
        row.next_attempt_at = None
        row.save()
        return ContentionCeilingExceeded(
            f"{where} of {run.reactor_path} was refused {attempts} times on {claim.primitive} "
            f"{claim.key!r} (REACTOR_CONTENTION_CEILING = {ceiling}); the work never ran",
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
    run.root.state.extra["parked_on"] = {
        "execution": run.execution_id,
        "step": label,
        "primitive": claim.primitive,
        "key": claim.key,
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
    if isinstance(spec, AsyncStepSpec):
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
        kind = "async_step" if isinstance(spec, AsyncStepSpec) else "async_reactor"
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


# --------------------------------------------------------------------------------------------
# taking over from a dead delivery


def drop_stale_holds(run: ExecutionRun) -> list[tuple[str, str]]:
    """Force-release the locks and semaphore slots a dead delivery of ``run`` left behind.

    Called by a delivery that takes over an execution still ``running`` at claim time (its
    previous delivery was killed mid-run, or lost its claim), before any admission. The holds
    are owned by the root execution id — the same owner this delivery uses — so without this
    the redelivery re-enters them (nesting count 2), releases once, and leaves the key held
    until its TTL lapses. While this delivery holds the execution claim no other delivery of
    the execution runs, so a hold this root owns on these keys is the dead one's.

    Bounded to the keys computable here without running anything: the reactor-level claims
    (from the inputs) and those of the unit at the resume point — the step at
    ``state.next_index`` with arguments resolved as the runner would, the current iteration
    of a ``map_step`` over a step, or an ``async_step`` task's own step. Not covered (these
    lapse with their TTL, their auto-extend died with the process): holds inside a composed
    child or a ``map_step`` over a reactor, and the re-taken holds of a compensate/undo that
    was interrupted by the crash. Rate-limit charges and ordered positions need nothing: a
    charge is spent, and the position is reused by the redelivery.

    Caveat: if the predecessor is not dead but only lost its claim (renewal failed for a whole
    claim TTL), it may still be inside the step; it finds its lease lost at its next renewal.
    Returns the ``(primitive, key)`` pairs actually released; records a ``forced_release``
    event (``detail={"reason": "redelivery"}``) for each and wakes their parked waiters.
    """
    from reactor_app.coordination.admission import Coordinator
    from reactor_app.engine.dispatch import wake

    # a hold kept across an earlier park is the dead delivery's too: dropped below, not adopted
    run.state.extra.pop(KEPT_HOLDS, None)
    targets: list[tuple[str, str, str | None]] = []
    reactor = run.reactor_path
    for declaration in run.reactor.declarations().ordered():
        if declaration.primitive in ("lock", "semaphore"):
            targets.extend(_stale_key(declaration, run.inputs, reactor, None))
    for label, spec, args in _resume_units(run):
        for declaration in spec.declarations.ordered():
            if declaration.primitive in ("lock", "semaphore"):
                targets.extend(_stale_key(declaration, args, reactor, label))
    coordinator = Coordinator()
    released: list[tuple[str, str]] = []
    woken: list[str] = []
    for primitive, key, step in targets:
        if (primitive, key) in released:
            continue  # the same key at reactor and step level: one hold, already dropped
        try:
            outcome = coordinator.force_release(primitive, key, owner=run.owner)
        except ReactorError:  # Redis unreachable: admission will report it
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
            reactor=reactor,
            execution_id=run.execution_id,
            reason="redelivery",
        )
    if woken:
        wake(woken)
    return released


def _stale_key(
    declaration: Declaration, args: dict[str, Any], reactor: str, step: str | None
) -> list[tuple[str, str, str | None]]:
    try:
        key = declaration.compute_key(args, reactor=reactor, step=step)
    except ReactorError:  # a key function that raises: the gate reports it, nothing was taken
        return []
    return [(declaration.primitive, key, step)]


def _resume_units(run: ExecutionRun) -> list[tuple[str, StepSpec, dict[str, Any]]]:
    """``(label, spec, arguments)`` of the unit the run resumes at, when it is a step."""
    from reactor_app.engine.runner import resolve_arguments

    marker = run.state.extra.get("dispatch") or {}
    if marker.get("kind") == "async_step":
        return [(marker["step"], run.reactor.steps[marker["step"]], dict(run.inputs))]
    order = run.reactor.plan.order
    if run.state.next_index >= len(order):
        return []
    spec = run.reactor.plan.specs[order[run.state.next_index]]
    scope = Scope(run.inputs, run.state.results)
    try:
        if isinstance(spec, MapSpec):
            if spec.is_reactor:
                return []
            items = spec.over.resolve(scope)
            progress = (run.state.extra.get("map_progress") or {}).get(spec.name) or {}
            index = int(progress.get("index", 0))
            if not isinstance(items, (list, tuple)) or index >= len(items):
                return []
            args = resolve_arguments(
                spec, Scope(run.inputs, run.state.results, items[index]), run.reactor_path
            )
            return [(f"{spec.name}[{index}]", spec, args)]
        if isinstance(spec, (ComposeSpec, AsyncStepSpec, AsyncReactorSpec, InterruptSpec)):
            # a composed child's holds: not covered; an async child owns its holds under its
            # own id; an interrupt declares nothing
            return []
        if spec.step_class() is None:
            return []
        return [(spec.name, spec, resolve_arguments(spec, scope, run.reactor_path))]
    except (PathError, ReactorError):  # the runner will report the bad argument
        return []
