"""The executor: runs a reactor's plan for one execution.

Main loop of ``ExecutionRun.execute`` (one execution; a composed child runs the same loop with
the root's owner and held-key registry). Its ``RunPolicy`` (``engine.policy``) says where it
runs: ``IN_PROCESS`` in the caller's process, ``ON_WORKER`` as a Celery delivery
(``engine.delivery``), which parks instead of waiting::

    1. Mark the execution running and emit ``execution_started`` — or ``execution_resumed``
       when it ran before (a park, an interrupt, a hand-off, a redelivery after a crash).
       Not written again when the row's INSERT (``run_reactor``) already marked it.
    2. Enter the reactor-level gate with the reactor's inputs (again on every pass: a resume
       is a coordinated entry point): the ordered-lock position is assigned on the first pass
       and reused; a marked period bucket or a failed strict chain halts the run; contention
       waits then fails (sync) or parks (worker, counted against the contention ceiling; past
       it → failed). A failure here rolls back steps completed on earlier passes.
       After a park in a step, the lock and semaphore holds kept across it
       (``state.continuation.kept_holds``, see 5.) are re-adopted instead of acquired again: checked
       to be still ours, no nesting level, no new fencing token, a ``resumed`` event; only the
       ordered gate and period check are admitted again (the rate limit stays charged). If a
       kept hold lapsed or was force-released meanwhile: ``lease_lost``, the rest is given
       back and the gate competes normally (worker → may park here, holding nothing).
    3. For each step of the plan from the checkpoint ``state.next_index``:
         a. if it reads the result of an ``async_step``/``async_reactor`` still running:
            sync → block for it (up to its ``result_timeout``); worker → park until the child
            ends (the child's delivery wakes this one). A failed child fails this step.
         b. ``where`` false → record the step skipped, move on (no arguments, no holds).
         c. resolve and validate arguments (failure → step failed, nothing held).
         d. run it by kind: a step through the runner (retries, step gate, compensation),
            ``compose`` as a child execution of this loop, ``map_step`` once per element,
            ``async_step``/``async_reactor`` → hand-off guard (a key this execution holds →
            ``HandOffRefused``, nothing created or enqueued), then a child execution row and,
            after commit, its task (→ dispatched: checkpoint, move on without a result),
            ``interrupt`` → its resume payload if one came, else pause.
         e. completed → store the result, append to the rollback log, checkpoint.
            skipped   → store the value (never undone), checkpoint.
            halted    → wait for running async children (their results recorded), then
                        stop cleanly: no rollback.
            parked    → count the park (ceiling exceeded → failed), persist, return; the
                        unit's own holds were given back (ordered positions kept); the
                        reactor-level ones are kept (5.).
            interrupted → persist the correlation id, return (holds released below).
            failed    → wait for running async children, then undo the rollback log newest
                        first, collect rollback failures, fail.
         f. sync mode, ``background = "after:<this step>"`` → hand off: return; the
            caller enqueues the execution and a worker continues from the checkpoint.
    4. Wait for (sync) or park on (worker) async children not read yet. The value is the
       ``returns`` step's result, else a dict of every result.
    5. In ``finally``: leave the reactor-level gate (if it was entered on this pass):
         parked (in a step, or waiting on an async child) → suspend: keep the lock and
            semaphore holds without renewal and record them in ``state.continuation.kept_holds``
            (persisted by ``finish``), so the "exclusive" workflow stays exclusive while it
            sleeps (docs/design.md §2.8); the rest is released with ``park`` (ordered position
            kept).
            A TTL still bounds the kept hold: a park longer than it lets the key go (2.).
         interrupted, handed off, or the delivery lost its claim → release with ``park``:
            nothing is held across the pause; the resume re-takes the holds (a fresh
            acquisition).
         terminal → release; the outcome decides period mark / cursor. Rollback runs before
            this, under the (adopted or acquired) holds.

A delivery that takes over an execution left ``running`` by a dead delivery first drops the
holds that delivery left behind (``engine.worker.drop_stale_holds``), so they are not re-entered
as an extra nesting level.

Where the parts live: the reactor-level gate of 2. in ``engine.reactor_gate``; one step of
3b-3d in ``engine.steps`` (plain steps through ``run_unit`` → ``engine.runner``); ``compose``
and ``async_step``/``async_reactor`` children, and reading their results, in
``engine.children``; ``map_step`` in ``engine.mapping``; the interrupt step in
``engine.interrupts`` (resuming one is ``engine.dispatch``'s); cancel in ``engine.cancel``
(the flag polled at each boundary: ``engine.cancel_flag``; ending the run:
``engine.cancelled``); writing the end of a pass and its ``Result`` in ``engine.finishing``.
What a checkpoint writes (the difference since the last write, conditional on the delivery's
claim generation) is ``engine.progress``'s; creating the row of a ``Reactor.run`` is
``engine.in_process``'s. This module keeps the loop itself, with the run's identities, when it
writes, and ``run_inline`` (one pass in the caller's process). It is one piece on purpose,
though over the usual size: its pseudocode above is a good part of its length, and every part
left here reads and writes the same ``ExecutionRun`` in the order the pseudocode gives.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from reactor_app.coordination.registry import HoldRegistry
from reactor_app.dsl.arguments import Scope
from reactor_app.dsl.registry import lookup
from reactor_app.dsl.step import StepSpec
from reactor_app.engine.async_order import enter_log
from reactor_app.engine.cancel_flag import cancel_request, cancelled_error
from reactor_app.engine.cancelled import end_cancelled
from reactor_app.engine.children import await_children
from reactor_app.engine.context import HeldKeys
from reactor_app.engine.enqueueing import enqueue_on_commit
from reactor_app.engine.finishing import finish_pass, result_of
from reactor_app.engine.gate import Gate
from reactor_app.engine.outcomes import PassEnd, RunEnd, UnitStatus, release_outcome
from reactor_app.engine.policy import IN_PROCESS, RunPolicy
from reactor_app.engine.priority import message_priority
from reactor_app.engine.progress import ProgressStore, load_state
from reactor_app.engine.reactor_gate import enter_reactor_gate, remember_admission
from reactor_app.engine.result import Result
from reactor_app.engine.rollback_progress import go_on, roll_back_to, rolling_back
from reactor_app.engine.runner import StepOutcome
from reactor_app.engine.settling import settle_on_halt
from reactor_app.engine.steps import execute_async_step, run_spec, run_unit
from reactor_app.engine.time_slice import DeliveryTimeUp, TimeSlice, stops_delivery
from reactor_app.engine.worker import ClaimLost, kept_hold_cover
from reactor_app.exceptions import ExecutionCancelled, ReactorError, StepFailed
from reactor_app.models import Execution
from reactor_app.serialization import decode
from reactor_app.status import EngineEvent, ExecutionStatus
from reactor_app.tracking import emit_engine
from reactor_app.write_behind import get_writer

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor
    from reactor_app.engine.state import LostDeliveries


logger = logging.getLogger(__name__)


class ExecutionRun:
    """The in-memory side of one execution while the engine works on it."""

    def __init__(
        self,
        reactor: type[Reactor],
        execution: Execution,
        inputs: dict[str, Any],
        *,
        parent: ExecutionRun | None = None,
        policy: RunPolicy = IN_PROCESS,
    ) -> None:
        self.reactor = reactor
        self.execution = execution
        # rows read back on a worker hold codec-tagged values (serialization.encode)
        self.inputs = decode(inputs)
        self.parent = parent
        self.root: ExecutionRun = parent.root if parent else self
        self.policy = policy
        self.held_keys: HeldKeys = parent.held_keys if parent else self._new_held_keys()
        self.state = load_state(execution)  # the context and its progress rows, read once
        #: what of ``state`` is on the row (``engine.progress``)
        self.store = ProgressStore(execution, self.state)
        self.instance = reactor()
        self.gates: list[Gate] = list(parent.gates) if parent else []
        self.children: dict[str, ExecutionRun] = {}
        #: worker mode: seconds until the parked execution is requeued (set by ``note_park``)
        self.requeue_in: float | None = None
        #: called before every checkpoint; a delivery checks its claim there
        self.on_persist: Callable[[], None] | None = parent.on_persist if parent else None
        #: the next ``persist`` writes the buffered tracking rows first (``persist``)
        self.history_first = False
        self.last_end: RunEnd | None = None
        #: the owners that handed this tree off (``engine.hand_off_guard.dispatcher_owners``)
        self._dispatcher_owners: list[str] | None = None
        #: the row was inserted already running (``run_reactor``): the first pass's "mark
        #: running" write is that INSERT, so a caller waits for one statement less
        self.inserted_running = False
        #: a worker delivery's claim statement started this pass (``engine.delivery``): the
        #: start is not written again
        self.started_by_claim = False
        #: a worker delivery's share of its Celery task's time limit (``engine.time_slice``)
        self.time_slice: TimeSlice | None = None
        #: deliveries lost in a row at the point this delivery starts from: the next unit it
        #: starts fails instead of running (``engine.lost_deliveries``); None: run it
        self.lost_verdict: LostDeliveries | None = None

    def _new_held_keys(self) -> HeldKeys:
        # A worker delivery mirrors what it holds in Redis, so that the delivery taking over
        # after a crash frees exactly that (``coordination.registry``).
        if self.policy.registers_holds:
            return HeldKeys(HoldRegistry(self.execution_id))
        return HeldKeys()

    # -- identities -----------------------------------------------------------------------

    @property
    def execution_id(self) -> str:
        return str(self.execution.id)

    @property
    def owner(self) -> str:
        """Holds are owned by the root execution: the basis of re-entrancy."""
        return self.root.execution_id

    @property
    def tree_root_id(self) -> str:
        """The tree's root execution: ``root`` is the root of what runs in this process, which
        for a dispatched child (an async step, a parallel map's element) is the child itself;
        its row names the tree's root."""
        return str(self.root.execution.root_id or self.root.execution_id)

    @property
    def reactor_path(self) -> str:
        return self.reactor.path()

    @property
    def park_on_contention(self) -> bool:
        return self.policy.parks

    @property
    def worker_wait(self) -> float:
        """How long a contended unit of a worker delivery waits in-process before parking:
        never past its share of the task's time limit, so a wait is not cut off mid-way
        (``engine.time_slice``)."""
        wait = self.policy.worker_wait
        clock = self.root.time_slice
        return wait if clock is None else min(wait, clock.left())

    @property
    def priority(self) -> int:
        """The place among waiters of this delivery's units (``run_async(priority=...)``,
        kept in the state of the execution the delivery runs)."""
        return int(self.root.state.origin.priority or 0)

    @property
    def waiter_id(self) -> str | None:
        """The id a parked unit registers on the contended key: the execution whose task a
        release re-enqueues (the root of this tree). None outside workers."""
        return self.root.execution_id if self.park_on_contention else None

    # -- persistence ----------------------------------------------------------------------

    def persist(self, **fields: Any) -> None:
        """Write the state and ``fields`` now, waiting for the commit: a pass's end (and its
        start in process), and the writes others rely on at once (a child created, a park).
        One conditional statement (``engine.progress``): what changed since the last write,
        never the whole context; ``ClaimLost`` if another delivery claimed the row
        meanwhile."""
        self._write(fields, durable=True)

    def _write(self, fields: dict[str, Any], *, durable: bool) -> None:
        if self.on_persist is not None:
            self.on_persist()
        if self.history_first:
            # The end of a pass: its buffered step runs and events with (or else just before)
            # the row's new status — whoever sees the status finds the history written. They
            # ride in the same statement where they can (write_behind.flush_into: one round
            # trip, one synchronous commit); a failed final write never costs the buffer's
            # rows, which may be other threads' too.
            self.history_first = False
            get_writer().flush_into(
                self.execution.pk,
                lambda leading: self.store.write(
                    self.state, fields, durable=durable, leading=leading
                ),
            )
            return
        self.store.write(self.state, fields, durable=durable)

    def checkpoint(self, **fields: Any) -> None:
        """After a completed step. A worker delivery writes it (one statement that carries what
        the step added, not waiting for the WAL flush: a redelivery resumes from here); an
        in-process run writes its progress behind (``write_behind``), so a caller waits for
        O(1) statements per run, not per step (docs/operations.md) — nothing resumes an
        in-process run from its row, and ``finish`` writes the state it ends in."""
        if self.policy.persists_each_step:
            self._write(fields, durable=False)
            return
        for name, value in fields.items():
            setattr(self.execution, name, value)
        # the admin still shows where a live run is, one freshness bound late
        get_writer().update_execution(self.execution.pk, **fields)

    def element_done(self) -> None:
        """After a sequential map's element: a worker delivery checkpoints the elements in
        batches (``ProgressStore.batch_due``); a redelivery re-runs at most the unwritten
        batch (docs/operations.md, "Checkpoints"). In process nothing is written until the
        pass ends."""
        if self.policy.persists_each_step and (
            self.store.batch_due() or self.root.state.continuation.lost_deliveries is not None
        ):
            # after a lost delivery, every element: the next loss names the element it met
            # (``engine.lost_deliveries``)
            self._write({}, durable=False)

    def spawn_child(
        self, reactor: type[Reactor], execution: Execution, inputs: dict[str, Any]
    ) -> ExecutionRun:
        """A composed child of this run: same tree, same mode (``engine.children``)."""
        child = ExecutionRun(reactor, execution, inputs, parent=self, policy=self.policy)
        self.children[child.execution_id] = child
        return child

    def child_run(self, execution_id: str) -> ExecutionRun | None:
        if execution_id in self.children:
            return self.children[execution_id]
        try:
            execution = Execution.objects.get(pk=execution_id)
        except Execution.DoesNotExist:
            return None
        child = ExecutionRun(
            lookup(execution.reactor), execution, execution.inputs, parent=self, policy=self.policy
        )
        self.children[execution_id] = child
        return child

    # -- the main loop --------------------------------------------------------------------

    def execute(self) -> RunEnd:
        resuming = (
            self.execution.started_at is not None
            and not self.inserted_running
            and not self.started_by_claim
        )
        # created by this very call: nobody could have cancelled it yet (cancel_flag.note_clear)
        created_here = self.inserted_running
        if self.inserted_running:
            self.inserted_running = False
        elif self.started_by_claim:
            # the delivery's claim statement wrote this start (``ExecutionManager.claim``):
            # status, ``started_at`` and the first step, durable with the claim
            self.started_by_claim = False
        else:
            # On a worker the start is written like a checkpoint, without waiting for the WAL
            # flush: the claim statement before it was durable, and a database crash that
            # loses it leaves the row as that statement left it (pending or parked, sent again
            # by the sweeper) — what losing a checkpoint does. Waiting for the disk here held
            # every delivery's body, a woken one's too, behind a flush (docs/operations.md).
            self._write(
                {
                    "status": ExecutionStatus.RUNNING,
                    "started_at": self.execution.started_at or timezone.now(),
                    "current_step": self._resume_point() or self.execution.current_step,
                },
                durable=not self.policy.persists_each_step,
            )
        emit_engine(
            EngineEvent.EXECUTION_RESUMED if resuming else EngineEvent.EXECUTION_STARTED,
            self.execution,
        )
        gate: Gate | None = None
        end: RunEnd | None = None
        abandoned = held_over = False
        try:
            cancel = None
            if self.parent is None and not created_here and rolling_back(self) is None:
                cancel = self._cancel_request()
            if cancel is not None:
                # cancelled while it waited (or its delivery died): never enter it again. (A
                # composed child stops at its first step boundary instead, inside its gate:
                # what the tree holds outside it belongs to its parent.)
                end = end_cancelled(self, cancel, gate_held=False)
                return end
            first_admission = not self.state.continuation.reactor_admitted
            gate, end = enter_reactor_gate(self)
            if gate is not None and first_admission:
                remember_admission(self)  # written down where a takeover would need it
            if end is None:
                # a rollback under way (an earlier delivery died in it) is gone on with
                end = go_on(self) if rolling_back(self) is not None else self._run_steps()
            return end
        except ClaimLost:
            abandoned = True  # another delivery may run it now: give back, decide nothing
            raise
        except Exception as exc:
            if stops_delivery(self.root.time_slice, exc):
                # The task's soft time limit ran out outside a body: stop here as a killed
                # delivery would, keeping what is held for the next one (engine.time_slice)
                held_over = True
                if isinstance(exc, DeliveryTimeUp):
                    raise
                raise DeliveryTimeUp(f"{self.reactor_path} cut off by its time limit") from exc
            # Not a step body (those become Failures): our own code, an argument value the ORM
            # cannot store... Fail the run like any step failure instead of leaving the row
            # "running" with its completed steps never undone.
            try:
                end = self._unexpected(exc)
            except DeliveryTimeUp:
                held_over = True  # in the rollback that followed
                raise
            return end
        except BaseException:
            # Not an error of the run: the process is being stopped (gevent's hard time limit,
            # the SystemExit of a pool child told to terminate, Ctrl-C). As a killed delivery
            # would, keep what is held for the delivery that takes over — a terminal release
            # would fail a strict ordered line the execution is still in.
            held_over = True
            raise
        finally:
            if gate is not None and held_over:
                # held on (and still listed in its registry) as by a killed delivery: the
                # next delivery takes over from the checkpoint and takes them again
                gate.suspend()
                self.gates.remove(gate)
            elif gate is not None:
                if not abandoned and end is not None and end.status == PassEnd.PARKED:
                    # A park keeps the outer reactor-level holds (see step 5.), lengthened to
                    # cover the park (docs/coordination.md, "Guarantees").
                    kept = gate.suspend(hold_for=kept_hold_cover(self.root.requeue_in))
                    if kept:
                        self.state.continuation.kept_holds = kept
                else:
                    gate.exit("park" if abandoned else release_outcome(end))
                self.gates.remove(gate)

    def _unexpected(self, exc: Exception) -> RunEnd:
        step = self.execution.current_step or None
        logger.exception("unexpected error in %s at step %s", self.reactor_path, step)
        error = StepFailed(
            f"unexpected {type(exc).__name__} in {self.reactor_path}"
            f"{f' at step {step!r}' if step else ''}: {exc}",
            reactor=self.reactor_path,
            step=step,
            cause=exc,
        )
        try:
            return roll_back_to(self, PassEnd.FAILED, error, [])
        except ClaimLost:
            raise
        except Exception as again:
            if stops_delivery(self.root.time_slice, again):
                raise DeliveryTimeUp(f"{self.reactor_path} cut off by its time limit") from again
            logger.exception("rollback after an unexpected error failed too")
            self.state.continuation.rolling_back = None  # ends here: no pass goes on with it
            failures = [
                {"step": step, "kind": "undo", "reason": "error", "error": {"message": str(again)}}
            ]
        return RunEnd(PassEnd.FAILED, error=error, rollback_failures=failures)

    def execute_async_step(self) -> RunEnd:
        """The body of an ``async_step`` task (``engine.steps``)."""
        return execute_async_step(self)

    def _cancel_request(self, *, fresh: bool = True) -> dict[str, Any] | None:
        """An operator's cancel of this execution, of its root or of its tree's root
        (engine.cancel); ``fresh=False`` at step boundaries, which read the flag at most every
        ``REACTOR_CANCEL_POLL``."""
        return cancel_request(
            self.tree_root_id, self.root.execution_id, self.execution_id, fresh=fresh
        )

    def cancel_requested(self) -> dict[str, Any] | None:
        """The cancel request of this execution or of its root, read now (the start of a
        child's pass: ``engine.steps.execute_async_step``)."""
        return self._cancel_request()

    def stopped_by_cancel(self, error: ReactorError | None) -> bool:
        """A failure that is this execution's cancel (a checkpoint raised it, or a composed
        child stopped for it) — not an async child cancelled on its own, which fails us."""
        if isinstance(error, ExecutionCancelled) and error.fields().get("execution_id") in (
            self.execution_id,
            self.root.execution_id,
        ):
            return True
        return self._cancel_request() is not None

    def _run_steps(self) -> RunEnd:
        plan = self.reactor.plan
        while self.state.next_index < len(plan.order):
            cancel = self._cancel_request(fresh=False)  # a step boundary: stop if cancelled
            if cancel is not None:
                return end_cancelled(self, cancel, gate_held=True)
            if self.out_of_time():
                return RunEnd(PassEnd.PARKED)  # requeued at once: a fresh delivery goes on
            name = plan.order[self.state.next_index]
            spec = plan.specs[name]
            self.execution.current_step = name
            readers_of = plan.dependencies.get(name, frozenset())
            outcome = await_children(self, readers_of) or run_spec(self, spec)
            if outcome.status == UnitStatus.DISPATCHED:
                continue  # checkpointed with the child; its result is read later
            if outcome.status in (UnitStatus.COMPLETED, UnitStatus.SKIPPED):
                self.state.results[name] = outcome.value
                if outcome.record is not None:
                    enter_log(self, outcome.record)  # after the async steps that ended
                self.state.next_index += 1
                # current_step is where the execution is (or resumes): the next step to run.
                if self._finish_carries_checkpoint():
                    self.execution.current_step = name  # written by the finish
                else:
                    self.checkpoint(current_step=self._resume_point() or name)
                if self._hands_off_after(name):
                    return RunEnd(PassEnd.HANDED_OFF)
                continue
            if outcome.status == UnitStatus.HALTED:
                settle_on_halt(self)  # no async child runs on after the run has ended
                return RunEnd(PassEnd.HALTED, reason=outcome.reason)
            if outcome.status == UnitStatus.PARKED:
                return RunEnd(PassEnd.PARKED, park=outcome.park)
            if outcome.status == UnitStatus.INTERRUPTED:
                return RunEnd(PassEnd.INTERRUPTED, reason=outcome.reason)
            if self.policy.persists_each_step:
                self.root.store.confirm_claim()  # a delivery that lost its claim undoes nothing
            failures = list(outcome.rollback_failures)
            if self.stopped_by_cancel(outcome.error):
                # stopped by a checkpoint (or a cancelled child): rolled back like a failure
                cancel = self._cancel_request() or {}
                error = cancelled_error(cancel, self.execution_id, reactor=self.reactor_path)
                return roll_back_to(self, PassEnd.CANCELLED, error, failures)
            return roll_back_to(self, PassEnd.FAILED, outcome.error, failures)
        awaited = await_children(self, None)
        if awaited is not None:
            if awaited.status == UnitStatus.PARKED:
                return RunEnd(PassEnd.PARKED)
            if awaited.status == UnitStatus.HALTED:
                settle_on_halt(self)
                return RunEnd(PassEnd.HALTED, reason=awaited.reason)
            return roll_back_to(self, PassEnd.FAILED, awaited.error, [])
        return RunEnd(PassEnd.SUCCEEDED, value=self._value())

    def out_of_time(self) -> bool:
        """At a unit boundary: this delivery has used its share of the task's time limit
        (``engine.time_slice``). The pass then parks with a requeue at once — not contention,
        no attempt spent, a reactor-level lock kept as across any park."""
        clock = self.root.time_slice
        if clock is None or not clock.spent():
            return False
        self.root.requeue_in = 0.0
        return True

    def _finish_carries_checkpoint(self) -> bool:
        """After the last step of a worker delivery's own execution, with no reactor-level
        gate to leave: the finish's write (``engine.finishing``) follows at once and carries
        what this checkpoint would (the same conditional statement), so it is not written
        twice. With a gate the checkpoint stays: leaving the gate decides things in Redis (a
        period mark, an ordered cursor) that must not happen for a delivery that has lost
        its claim, which the checkpoint's conditional write finds out first. A crash between
        the last step and the finish re-runs that step (docs/operations.md, "Checkpoints")."""
        return (
            self.policy.persists_each_step
            and self.parent is None
            and not self.gates
            and self.state.next_index == len(self.reactor.plan.order)
        )

    def _resume_point(self) -> str | None:
        order = self.reactor.plan.order
        return order[self.state.next_index] if self.state.next_index < len(order) else None

    def _hands_off_after(self, name: str) -> bool:
        """``background = "after:<name>"`` in the caller's process: the rest goes to a worker."""
        return (
            self.policy.hands_off
            and self.parent is None
            and self.reactor.background == f"after:{name}"
            and self.state.next_index < len(self.reactor.plan.order)
        )

    def _value(self) -> Any:
        if self.reactor.returns is not None:
            return self.state.results.get(self.reactor.returns)
        return dict(self.state.results)

    def scope(self, element: Any = None, with_element: bool = False) -> Scope:
        if with_element:
            return Scope(self.inputs, self.state.results, element)
        return Scope(self.inputs, self.state.results)

    def run_unit(
        self, spec: StepSpec, step_class: Any, args: dict[str, Any], label: str
    ) -> StepOutcome:
        """A plain step (or one map element) through the runner (``engine.steps``)."""
        return run_unit(self, spec, step_class, args, label)

    # -- ending ---------------------------------------------------------------------------

    def finish(self, end: RunEnd) -> None:
        """Write the end of this pass onto the execution row and emit its event
        (``engine.finishing``)."""
        finish_pass(self, end)

    def result(self, end: RunEnd) -> Result:
        return result_of(self, end)


def run_inline(run: ExecutionRun) -> Result:
    """One pass in this process; a ``background = "after:..."`` hand-off enqueues the rest."""
    end = run.execute()
    run.finish(end)
    if end.status == PassEnd.HANDED_OFF:
        enqueue_on_commit(run.execution.id, priority=message_priority(run.priority))
    return run.result(end)
