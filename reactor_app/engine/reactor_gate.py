"""The reactor-level gate of a pass (step 2 of the executor's main loop).

``enter_reactor_gate`` admits the run under its reactor's declarations on every pass (a resume
is a coordinated entry point), re-adopting the holds kept across a park; a refusal on a later
pass rolls back the steps completed on earlier ones (``fail_at_gate``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reactor_app.coordination import primitives
from reactor_app.coordination.admission import Coordinator
from reactor_app.engine.enqueueing import wake
from reactor_app.engine.gate import Gate, GateScope, ParkRequested, Skip
from reactor_app.engine.leftovers import release_kept
from reactor_app.engine.outcomes import PassEnd, RunEnd
from reactor_app.engine.rollback_progress import roll_back_to, rolling_back
from reactor_app.engine.settling import children_to_settle
from reactor_app.engine.state import REACTOR_SLOT
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


def fail_at_gate(run: ExecutionRun, error: ReactorError) -> RunEnd:
    """The reactor gate refused on a later pass (resume, hand-off, redelivery): steps that
    completed on earlier passes are rolled back as for any failure."""
    if run.state.completed or children_to_settle(run) or rolling_back(run) is not None:
        return roll_back_to(run, PassEnd.FAILED, error, [])
    return RunEnd(PassEnd.FAILED, error=error)
