"""Where a unit of work runs — an execution, or none for ``Step.call`` — and the one way to
build a unit's gate scope and step context from it.

The runner (a step's attempts and its compensation) and rollback (compensate and undo hooks)
both need the same facts about the run around the unit: its execution id and root, its reactor,
the enclosing gates, where ordered-lock positions are kept, how a parked worker is woken, how a
step run is recorded. ``ExecutionHost`` answers them from an ``ExecutionRun``; ``DirectCall``
is the null execution of ``Step.call``: no row to record into, no reactor, nothing persisted,
nothing parked. ``host_of`` picks one, and ``gate_scope`` / ``step_context`` build from either
without asking which it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reactor_app.engine.context import HeldKeys, StepContext
from reactor_app.engine.gate import Gate, GateScope
from reactor_app.tracking import StepRecorder

if TYPE_CHECKING:
    from collections.abc import Callable

    from reactor_app.dsl.reactor import Reactor
    from reactor_app.engine.executor import ExecutionRun
    from reactor_app.engine.state import PendingFailure


class ExecutionHost:
    """A unit of work inside an execution (``Reactor.run`` in process, or a worker delivery)."""

    #: results are kept in the execution state (JSON): a step must return storable values
    stores_results = True

    def __init__(self, run: ExecutionRun) -> None:
        self.run: ExecutionRun | None = run
        self._run = run

    @property
    def execution_id(self) -> str | None:
        return self._run.execution_id

    @property
    def root_execution_id(self) -> str | None:
        # the tree's root, also in a dispatched child (an async step, a parallel map's
        # element), whose run in this process has no parent: the cancel poll reads its flag
        return self._run.tree_root_id

    @property
    def reactor_path(self) -> str:
        return self._run.reactor_path

    @property
    def reactor(self) -> type[Reactor] | None:
        return self._run.reactor

    @property
    def instance(self) -> Any:
        return self._run.instance

    @property
    def inputs(self) -> dict[str, Any]:
        return self._run.inputs

    @property
    def gates(self) -> list[Gate]:
        return list(self._run.gates)

    @property
    def positions(self) -> dict[str, dict[str, Any]] | None:
        return self._run.state.ordered

    @property
    def waiter_id(self) -> str | None:
        return self._run.waiter_id

    @property
    def worker_wait(self) -> float:
        return self._run.worker_wait

    @property
    def priority(self) -> int:
        """The execution's place among waiters (``run_async(priority=...)``)."""
        return self._run.priority

    @property
    def on_position(self) -> Callable[[], None] | None:
        return self._run.persist

    def recorder(self, label: str, kind: str, attempt: int) -> StepRecorder | None:
        return StepRecorder(self._run.execution, label, kind, attempt)

    def take_spent_attempts(self, label: str) -> int:
        """Failed attempts of ``label`` spent before a park (parks neither spend retries nor
        give them back); forgotten once read."""
        return int((self._run.state.continuation.spent_attempts or {}).pop(label, 0))

    def keep_spent_attempts(self, label: str, spent: int) -> None:
        """Remember the failed attempts of a unit that leaves before its next attempt."""
        if spent > 0:
            self._run.state.continuation.attempts()[label] = spent

    def note_pending_failure(self, label: str, failure: PendingFailure) -> None:
        """A failed attempt of ``label`` that is to be retried — or a body whose delivery ended
        before its result was recorded (``lost``, ``engine.in_flight``): the rollback
        compensates it if the run ends before the unit's next body starts
        (``engine.settling``)."""
        self._run.state.continuation.failures()[label] = failure

    def drop_pending_failure(self, label: str) -> None:
        """The unit's next body starts: the failed (or lost) one before it is no longer the
        last."""
        pending = self._run.state.continuation.pending_failures
        if pending:
            pending.pop(label, None)


class DirectCall:
    """The null execution of ``Step.call``: nothing recorded, persisted, parked or resumed."""

    run: ExecutionRun | None = None
    stores_results = False  # the caller gets the value itself
    execution_id: str | None = None
    root_execution_id: str | None = None
    reactor_path = ""
    reactor: type[Reactor] | None = None
    instance: Any = None
    positions: dict[str, dict[str, Any]] | None = None  # a fresh ordered position each time
    waiter_id: str | None = None
    worker_wait = 0.0
    priority = 0
    on_position: Callable[[], None] | None = None

    @property
    def inputs(self) -> dict[str, Any]:
        return {}

    @property
    def gates(self) -> list[Gate]:
        return []

    def recorder(self, label: str, kind: str, attempt: int) -> StepRecorder | None:
        return None

    def take_spent_attempts(self, label: str) -> int:
        return 0

    def keep_spent_attempts(self, label: str, spent: int) -> None:
        return None

    def note_pending_failure(self, label: str, failure: PendingFailure) -> None:
        return None  # a direct call retries in place: no run ends between its attempts

    def drop_pending_failure(self, label: str) -> None:
        return None


Host = ExecutionHost | DirectCall
DIRECT_CALL = DirectCall()


def host_of(run: ExecutionRun | None) -> Host:
    return DIRECT_CALL if run is None else ExecutionHost(run)


def gate_scope(
    host: Host,
    *,
    step: str,
    owner: str,
    held_keys: HeldKeys | None,
    position_slot: str = "",
    parks: bool = True,
) -> GateScope:
    """Who asks for a unit's coordination, on behalf of which execution. ``parks=False``
    (rollback): no ordered positions and no parking, whatever the host."""
    return GateScope(
        reactor=host.reactor_path,
        step=step,
        owner=owner,
        execution_id=host.execution_id,
        held_keys=held_keys,
        positions=host.positions if parks else None,
        position_slot=position_slot,
        waiter_id=host.waiter_id if parks else None,
        worker_wait=host.worker_wait if parks else 0.0,
        on_position=host.on_position if parks else None,
        priority=host.priority,
    )


def step_context(
    host: Host,
    parent: StepContext | None,
    *,
    step: str,
    attempt: int,
    owner: str,
    held_keys: HeldKeys | None,
    gate: Gate | None,
) -> StepContext:
    """A unit's ``StepContext``. Inside another unit (``parent``: a ``Step.call`` from a step
    body, or a compensation inside its failing step) the enclosing gates come from that unit,
    and a direct call inherits its execution, root and reactor instance."""
    gates = parent.gates if parent is not None else host.gates
    inherited = parent if parent is not None and host.run is None else None
    return StepContext(
        execution_id=inherited.execution_id if inherited else host.execution_id,
        root_execution_id=inherited.root_execution_id if inherited else host.root_execution_id,
        step_name=step,
        attempt=attempt,
        reactor=host.reactor,
        reactor_instance=inherited.reactor_instance if inherited else host.instance,
        inputs=host.inputs,
        owner=owner,
        gates=[*gates, *([gate] if gate is not None else [])],
        held_keys=held_keys,
        lease_lost=gate.lost if gate is not None else [],
    )
