"""The reactor-level gate of a pass (step 2 of the executor's main loop).

``enter_reactor_gate`` admits the run under its reactor's declarations on every pass (a resume
is a coordinated entry point), re-adopting the holds kept across a park; a refusal on a later
pass rolls back the steps completed on earlier ones (``fail_at_gate``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reactor_app.coordination import period, primitives
from reactor_app.coordination.admission import Coordinator
from reactor_app.engine.enqueueing import wake
from reactor_app.engine.gate import Gate, GateScope, ParkRequested, Skip
from reactor_app.engine.leftovers import release_kept
from reactor_app.engine.outcomes import PassEnd, RunEnd
from reactor_app.engine.rollback_progress import roll_back_to, rolling_back
from reactor_app.engine.settling import children_to_settle
from reactor_app.engine.state import REACTOR_SLOT
from reactor_app.engine.time_slice import limit_behind
from reactor_app.engine.worker import note_park, outage_delay
from reactor_app.exceptions import (
    ConfigurationError,
    CoordinationError,
    CoordinationUnavailable,
    ReactorError,
)

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun


def enter_reactor_gate(run: ExecutionRun) -> tuple[Gate | None, RunEnd | None]:
    declarations = run.reactor.declarations()
    if not declarations:
        # Holds kept across the last park by a version of the reactor that declared them (a
        # deploy between two deliveries): nothing here covers them any more, so they are given
        # back now rather than left standing until their park lease lapses.
        woken = release_kept(run, Coordinator())
        if woken:
            wake(woken)
        return None, None
    # kept across the last park (step 5.); whatever happens below, they are dealt with now
    kept, run.state.continuation.kept_holds = run.state.continuation.kept_holds, None
    continuing = bool(run.state.continuation.reactor_admitted)
    gate = Gate(
        # A continuation (resume, redelivery, hand-off) was charged its rate-limit slot
        # when the run was first admitted (``Primitive.CHARGES``); charging every pass would
        # let one run burn the budget of many.
        [
            d
            for d in declarations.ordered()
            if not (continuing and d.primitive in primitives.CHARGING)
        ],
        run.inputs,
        GateScope(
            reactor=run.reactor_path,
            step=None,
            owner=run.owner,
            execution_id=run.execution_id,
            held_keys=run.held_keys,
            positions=run.state.ordered,
            position_slot=REACTOR_SLOT,
            waiter_id=run.waiter_id,
            worker_wait=run.worker_wait,
            on_position=run.persist,
            priority=run.priority,
        ),
    )
    try:
        skip = gate.enter(wait=declarations.wait_seconds(), park=run.park_on_contention, adopt=kept)
    except CoordinationUnavailable as outage:
        if not run.park_on_contention:
            return None, fail_at_gate(run, outage)
        # A worker waits the outage out: it comes back later, nothing ran at this gate.
        if kept:
            run.state.continuation.kept_holds = kept  # not verified: still the execution's
        run.root.requeue_in = outage_delay(run, outage)
        return None, RunEnd(PassEnd.PARKED)
    except ParkRequested as parked:
        ceiling = note_park(run, "", parked)
        if ceiling is None:
            return None, RunEnd(PassEnd.PARKED, park=parked)
        parked.gate.abandon_position()
        return None, fail_at_gate(run, ceiling)
    except (CoordinationError, ConfigurationError) as error:
        limit = limit_behind(run.root.time_slice, error)
        if limit is not None:
            # the task's soft limit in a key or cost function: the delivery ends, nothing was
            # taken (engine.time_slice); what was kept stays the next delivery's
            run.state.continuation.kept_holds = kept
            raise limit from None
        return None, fail_at_gate(run, error)
    if isinstance(skip, Skip):
        if continuing and skip.reason == "period":
            # Another run completed in this bucket while this one was paused; halting now
            # would leave its completed steps in place, so it fails and rolls back.
            return None, fail_at_gate(
                run,
                CoordinationError(
                    f"the period bucket of {skip.key!r} was marked by another execution "
                    f"while {run.reactor_path} was paused; rolling back",
                    reactor=run.reactor_path,
                    step=None,
                    key=skip.key,
                    primitive="period",
                ),
            )
        return None, RunEnd(PassEnd.HALTED, reason=skip.reason)
    run.state.continuation.reactor_admitted = True
    run.gates.append(gate)
    return gate, None


#: the reactor-level primitives whose later admissions continue the first one: a rate limit is
#: not charged again, and a period bucket marked meanwhile fails the run instead of halting it
CONTINUED: tuple[str, ...] = (*primitives.CHARGING, period.PRIMITIVE)


def remember_admission(run: ExecutionRun) -> None:
    """Write down, before any body runs, that a worker delivery admitted the run for the first
    time, when its reactor declares a primitive whose continuation differs (``CONTINUED``).

    WHY: a delivery killed between its admission and its first checkpoint left no trace of the
    admission, so the one that took over was admitted as a first run: its rate limit charged a
    second time for one run, and a period bucket another run completed meanwhile halted it as
    if nothing had started, though its body may have run half-way (docs/coordination.md,
    "Period"). One statement, not waiting for the WAL flush (like a checkpoint), and only for
    those reactors; an in-process run is never taken over from its row."""
    if not run.policy.persists_each_step:
        return
    if any(d.primitive in CONTINUED for d in run.reactor.declarations().ordered()):
        run.checkpoint()


def fail_at_gate(run: ExecutionRun, error: ReactorError) -> RunEnd:
    """The reactor gate refused on a later pass (resume, hand-off, redelivery): steps that
    completed on earlier passes are rolled back as for any failure."""
    if run.state.completed or children_to_settle(run) or rolling_back(run) is not None:
        return roll_back_to(run, PassEnd.FAILED, error, [])
    return RunEnd(PassEnd.FAILED, error=error)
