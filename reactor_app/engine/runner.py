"""The runner: one step, from its ``where`` condition to its outcome.

For a plain step: evaluate ``where`` → resolve and validate arguments → for each attempt: enter
the step's gate (coordination) → run the body (auto-extend running) → on a final failure,
compensate while still holding the step's coordination → release the gate. A cancel read after
a failed attempt, or before a retry, makes that attempt the final one (a retry already put off
leaves it in ``state.PendingFailure`` for the rollback to compensate). ``map_step`` runs
this once per element; ``compose`` hands the child reactor back to the executor.

One piece on purpose, though over the usual size: an attempt's gate, body, cancel check,
undo-after-cancel and compensation share the attempt's holds and its recorder, in an order
(release only after the cancel check; compensate or undo still holding) that reads best in one
place.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reactor_app.dsl.arguments import PathError, Scope
from reactor_app.dsl.outcome import Failure, Halt, Outcome, Skipped, Success, as_outcome
from reactor_app.dsl.step import Step, StepSpec
from reactor_app.engine.cancel_flag import cancelled_error, flag_keys, note_clear, request_from
from reactor_app.engine.clock import current_clock
from reactor_app.engine.context import CompletedStep, HeldKeys, StepContext
from reactor_app.engine.gate import Gate, ParkRequested, Skip, fresh_owner
from reactor_app.engine.host import gate_scope, host_of, step_context
from reactor_app.engine.locked_call import call_locked, lone_lock
from reactor_app.engine.lost_deliveries import skips_compensate, take_verdict
from reactor_app.engine.outcomes import ReleaseOutcome, UnitStatus
from reactor_app.engine.rollback import run_rollback_hook
from reactor_app.engine.time_slice import TimeSlice, cut_off, limit_behind, stops_delivery
from reactor_app.engine.worker import ClaimLost, outage_delay
from reactor_app.exceptions import (
    ArgumentResolutionError,
    ConfigurationError,
    CoordinationError,
    CoordinationUnavailable,
    DeliveryLost,
    ExecutionCancelled,
    FailureReason,
    InputValidationError,
    ReactorError,
    RetriesExhausted,
    StepFailed,
    TaskTimeLimitExceeded,
    location,
)
from reactor_app.serialization import encode
from reactor_app.status import EngineEvent, StepRunKind
from reactor_app.tracking import StepRecorder

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun


@dataclass
class StepOutcome:
    """What the executor learns from running one step."""

    status: UnitStatus
    value: Any = None
    error: ReactorError | None = None
    record: CompletedStep | None = None
    reason: str | None = None
    park: ParkRequested | None = None
    rollback_failures: list[dict[str, Any]] = field(default_factory=list)
    #: a worker unit that must come back later without it being contention (a failure
    #: retry's backoff, a coordination outage): seconds until its requeue
    retry_in: float | None = None


def evaluate_where(spec: StepSpec, inputs: dict[str, Any], results: dict[str, Any]) -> bool:
    if spec.where is None:
        return True
    if isinstance(spec.where, bool):
        return spec.where
    return bool(spec.where(inputs, results))


def resolve_arguments(
    spec: StepSpec, scope: Scope, reactor: str, *, default_to_inputs: bool = True
) -> dict[str, Any]:
    if not spec.arguments and default_to_inputs:
        return dict(scope.inputs)
    args: dict[str, Any] = {}
    for name, source in spec.arguments.items():
        try:
            args[name] = source.resolve(scope)
        except PathError as exc:
            raise ArgumentResolutionError(
                f"step {spec.name!r} of {reactor}: argument {name!r} = {source.describe()}: {exc}",
                reactor=reactor,
                step=spec.name,
                argument=name,
                source=source.describe(),
            ) from exc
    return args


def validate_arguments(
    step_class: type[Step], args: dict[str, Any], reactor: str | None, step: str | None
) -> None:
    missing = [name for name in step_class.inputs if name not in args]
    if missing:
        raise InputValidationError(
            f"step {step!r}{f' of {reactor}' if reactor else ''} is missing inputs "
            f"{', '.join(missing)}",
            reactor=reactor,
            step=step,
            field_errors={name: "required" for name in missing},
        )


def storable(outcome: Outcome, label: str) -> Outcome:
    """``outcome``, or a non-retryable failure when its value cannot be stored for a later pass.

    A result feeds later steps, possibly in another process after a park, an interrupt or a
    hand-off, so it must survive the codec (``reactor_app.serialization``) exactly — checked
    here, in every mode, so a workflow never behaves differently in-process and on a worker.
    """
    if not isinstance(outcome, (Success, Skipped)):
        return outcome
    try:
        encode(outcome.value, where=f"the result of step {label!r}")
    except TypeError as exc:
        return Failure(exc, retryable=False)
    return outcome


def failure_error(
    failure: Failure, reactor: str | None, step: str | None, attempts: int
) -> ReactorError:
    """The structured error a final failure becomes on the ``Result``."""
    cause = failure.exception()
    if isinstance(cause, ReactorError) and not isinstance(cause, StepFailed):
        cause.fill_location(reactor=reactor, step=step)
        return cause
    text = FailureReason.describe(cause)
    text = f": {text}" if text else ""
    where = location(reactor, step)
    reported = FailureReason.reported(cause)
    if attempts > 1:
        return RetriesExhausted(
            f"{where} failed after {attempts} attempts{text}",
            reactor=reactor,
            step=step,
            cause=reported,
            attempts=attempts,
        )
    return StepFailed(f"{where} failed{text}", reactor=reactor, step=step, cause=reported)


class UnitRunner:
    """Runs one step class with resolved arguments: attempts, coordination, compensation."""

    def __init__(
        self,
        run: ExecutionRun | None,
        step_class: type[Step],
        spec: StepSpec | None,
        args: dict[str, Any],
        *,
        label: str,
        owner: str,
        held_keys: HeldKeys | None,
        position_slot: str,
        parent_context: StepContext | None = None,
        max_attempts: int | None = None,
    ) -> None:
        self.run = run
        self.host = host_of(run)
        self.max_attempts = max_attempts or step_class.retry_policy.max_attempts
        self.step_class = step_class
        self.args = args
        self.label = label
        self.owner = owner
        self.held_keys = held_keys
        self.position_slot = position_slot
        self.parent_context = parent_context
        declarations = spec.declarations if spec is not None else step_class.declarations()
        #: everything the forward path honours; rollback re-takes its lock and semaphore
        self.declared = declarations
        # The one check a step declaring nothing pays.
        self.declarations = declarations.ordered() if declarations else []
        self.wait = declarations.wait_seconds() if declarations else 0.0
        self.reactor = self.host.reactor_path
        #: the reactor's step this unit runs (a map's step for an element); None: ``Step.call``
        self.step_name = spec.name if spec is not None else None
        #: when the last attempt's body returned (ns, wall clock)
        self.returned_at: int | None = None

    def _gate(self) -> Gate | None:
        if not self.declarations:
            return None
        scope = gate_scope(
            self.host,
            step=self.label,
            owner=self.owner,
            held_keys=self.held_keys,
            position_slot=self.position_slot,
        )
        return Gate(self.declarations, self.args, scope)

    def _context(self, attempt: int, gate: Gate | None) -> StepContext:
        return step_context(
            self.host,
            self.parent_context,
            step=self.label,
            attempt=attempt,
            owner=self.owner,
            held_keys=self.held_keys,
            gate=gate,
        )

    def _recorder(self, kind: str, attempt: int) -> StepRecorder | None:
        return self.host.recorder(self.label, kind, attempt)

    def execute(self, *, park: bool) -> StepOutcome:
        policy = self.step_class.retry_policy
        instance = self.step_class()
        # Attempts spent before a park count: parks do not spend retries, nor give them back.
        attempt = self.host.take_spent_attempts(self.label)
        while True:
            attempt += 1
            if attempt > 1:
                # a retry (in this pass, or after a park): a cancel requested since the failed
                # attempt makes that attempt the final one — no body starts after it
                stopped = self._cancelled_before_retry()
                if stopped is not None:
                    return stopped
            gate = self._gate()
            release_as: ReleaseOutcome = "failure"
            clock = self.run.root.time_slice if park and self.run is not None else None
            try:
                # Entering sits inside the try: whatever fails after an admission, the
                # finally below gives the holds back (exit is a no-op when nothing was taken).
                if gate is not None:
                    try:
                        skip = gate.enter(wait=self.wait, park=park)
                    except ParkRequested as parked:
                        self._keep_attempts(attempt - 1)
                        return StepOutcome(UnitStatus.PARKED, park=parked)
                    except (CoordinationError, ConfigurationError) as refusal:
                        limit = limit_behind(
                            self.run.root.time_slice if self.run else None, refusal
                        )
                        if limit is not None:
                            # the task's soft limit in a key or cost function: the delivery
                            # ends, nothing was taken or run (engine.time_slice)
                            raise limit from None
                        if park and self.run and isinstance(refusal, CoordinationUnavailable):
                            # A worker comes back when the store may be back: nothing ran,
                            # nothing is held; an outage is neither contention nor a failure.
                            self._keep_attempts(attempt - 1)
                            delay = outage_delay(self.run, refusal)
                            return StepOutcome(UnitStatus.PARKED, error=refusal, retry_in=delay)
                        # Contention, an uncomputable key, an unknown named limit or Redis
                        # down: the body never ran, so there is nothing to compensate.
                        self._record_refusal(attempt, refusal)
                        return StepOutcome(UnitStatus.FAILED, error=refusal)
                    if isinstance(skip, Skip):
                        # a retry skipped (its period bucket marked meanwhile): the step ends
                        # here, never failed; its failed attempt is left as any retried one
                        self.host.drop_pending_failure(self.label)
                        self._record_skip(attempt, skip.reason, key=skip.key)
                        return StepOutcome(UnitStatus.SKIPPED, reason=skip.reason)
                # this body is the last now, after a failed attempt or a lost delivery's (a
                # delivery lost in it marks it again: ``engine.in_flight``)
                self.host.drop_pending_failure(self.label)
                recorder = self._recorder(StepRunKind.RUN, attempt)
                if recorder:
                    recorder.started(args=self.args)
                context = self._context(attempt, gate)
                flags = _cancel_flags(gate, context)
                first = clock is None or not clock.worked
                # deliveries lost in a row here: this body is not run again
                lost = take_verdict(self.run, self.label)
                try:
                    if lost is not None:
                        raise lost
                    outcome: Outcome = as_outcome(instance.run(self.args, context))
                except Exception as exc:
                    if clock is not None and cut_off(exc):
                        if not first:
                            # the delivery's time ran out, not the body's (engine.time_slice)
                            release_as = "retry"
                            return self._cut_off(attempt, recorder, clock)
                        exc = self._over_time(clock)
                    # a cancelled execution stops here, and a body that kept killing its
                    # deliveries: no further attempt
                    outcome = Failure(
                        exc, retryable=not isinstance(exc, (ExecutionCancelled, DeliveryLost))
                    )
                finally:
                    if clock is not None:
                        clock.worked = True
                # when the body completed: its place in a rollback (``engine.async_order``)
                self.returned_at = time.time_ns()
                cancel: dict[str, Any] | None = None
                try:
                    if flags:
                        context.check_leases()  # the release below reads the cancel request
                    else:
                        context.checkpoint()
                except ExecutionCancelled as stop:
                    # Seen after the body: one that returned Success completed (its effect
                    # exists: it is undone below); one that failed is not attempted again.
                    cancel = _request_of(stop)
                    if isinstance(outcome, Failure):
                        outcome = Failure(outcome.exception(), retryable=False)
                except Exception as exc:  # a lease lost while the body ran
                    if clock is not None and cut_off(exc):
                        # the task's soft limit in the engine's own code, after the body: as
                        # a delivery killed before the checkpoint, the step runs again in the
                        # next one (engine.time_slice); not this attempt's failure
                        release_as = "retry"
                        return self._cut_off(attempt, recorder, clock, after_body=True)
                    if not isinstance(outcome, Failure):
                        outcome = Failure(exc)
                if self.host.stores_results:
                    outcome = storable(outcome, self.label)
                if flags and cancel is None and isinstance(outcome, (Success, Skipped, Halt)):
                    cancel = self._release_unless_cancelled(gate, outcome, flags, context)
                if isinstance(outcome, (Success, Skipped, Halt)):
                    if cancel is not None and not self._undone_by_parent():
                        # completed, then cancelled: undone here, still under its holds
                        # (released below like a failure's: no period mark)
                        return self._undo_cancelled(instance, outcome, cancel, recorder, context)
                    # Only a success marks a period bucket; a skip or halt is still terminal.
                    release_as = "success" if isinstance(outcome, Success) else "halt"
                    return self._finish_ok(outcome, recorder)
                if (
                    outcome.retryable
                    and attempt < self.max_attempts
                    and self._cancel_request() is not None
                ):
                    # cancelled while this attempt ran: it is the final one, compensated
                    # below while its holds are still held, as a body stopped by a checkpoint
                    outcome = Failure(outcome.exception(), retryable=False)
                if outcome.retryable and attempt < self.max_attempts:
                    release_as = "retry"
                    retried = failure_error(outcome, self.reactor, self.label, 1)
                    if recorder:
                        recorder.finished(EngineEvent.STEP_RETRIED, error=retried.as_dict())
                    if self.step_name is not None:
                        self.host.note_pending_failure(
                            self.label,
                            {
                                "step": self.step_name,
                                "args": self.args,
                                "error": retried.as_dict(),
                            },
                        )
                    delay = policy.delay_after(attempt)
                    if park and (delay > 0 or (clock is not None and clock.spent())):
                        # A worker never sleeps out a backoff inside its delivery: that would
                        # keep the worker slot, the execution claim and the outer holds. The
                        # step's own holds are released below; the execution is requeued.
                        # Nor does it retry at once past its share of the task's time limit
                        # (engine.time_slice): the retry starts a fresh delivery.
                        self._keep_attempts(attempt)
                        return StepOutcome(UnitStatus.PARKED, retry_in=delay)
                else:
                    final = failure_error(outcome, self.reactor, self.label, attempt)
                    if recorder:
                        recorder.finished(EngineEvent.STEP_FAILED, error=final.as_dict())
                    failures = self._compensate(instance, outcome.exception(), context)
                    return StepOutcome(UnitStatus.FAILED, error=final, rollback_failures=failures)
            except BaseException as exc:
                if release_as == "failure" and _stops_undecided(exc, clock):
                    # The delivery stops here with no verdict recorded (an outcome decided
                    # already — a success, a halt — is released as decided): the step runs
                    # again in a later delivery, as after a kill. Released as a retry, never
                    # as a failure: that would end a strict ordered line, and the step's own
                    # place in it, for a step that has not failed (docs/operations.md,
                    # "Celery time limits").
                    release_as = "retry"
                raise
            finally:
                if gate is not None:
                    gate.exit(release_as)
            current_clock().sleep(delay)

    def _release_unless_cancelled(
        self, gate: Gate | None, outcome: Outcome, flags: list[str], context: StepContext
    ) -> dict[str, Any] | None:
        """The check after a completed body, folded into the release: release the step's holds
        unless its execution was cancelled meanwhile — then keep them and return the cancel
        request: the step is undone under them (``_undo_cancelled``)."""
        assert gate is not None
        raised = gate.exit_unless("success" if isinstance(outcome, Success) else "halt", flags)
        if raised is None:
            note_clear(context.root_execution_id, context.execution_id)
            return None
        return request_from(raised)

    def _cancel_request(self) -> dict[str, Any] | None:
        """The run's cancel request, read now (None for ``Step.call``: nothing to cancel)."""
        return self.run.cancel_requested() if self.run is not None else None

    def _cancelled_before_retry(self) -> StepOutcome | None:
        """Before a retry: when the run was cancelled since the failed attempt, that attempt
        is the final one. Its body did not complete, so it is compensated — by the rollback
        that follows (``engine.settling.compensate_pending``, under re-taken holds, as on a
        later pass) — and the step fails with the cancel; no further body starts."""
        cancel = self._cancel_request()
        if cancel is None:
            return None
        error = cancelled_error(
            cancel, self.host.execution_id, reactor=self.reactor or None, step=self.label
        )
        return StepOutcome(UnitStatus.FAILED, error=error)

    def _cut_off(
        self,
        attempt: int,
        recorder: StepRecorder | None,
        clock: TimeSlice,
        *,
        after_body: bool = False,
    ) -> StepOutcome:
        """A body cut off by the soft time limit after an earlier unit of its delivery — or,
        ``after_body``, the engine's own code between a body and its checkpoint, wherever the
        body stood in its delivery: the attempt is not spent, and the step runs again first
        thing in a new delivery (the at-least-once rule of a body whose delivery was killed
        before its checkpoint)."""
        self._keep_attempts(attempt - 1)
        when = "after this body returned, before its checkpoint" if after_body else "during it"
        reached = f"the delivery reached its Celery soft time limit ({clock.named:g} s) {when}"
        if recorder:
            recorder.finished(
                EngineEvent.STEP_RETRIED,
                error={
                    "type": "DeliveryTimeUp",
                    "message": f"{reached}: the body runs again in a new delivery",
                },
            )
        if self.step_name is not None:
            # its effect may stand: compensated if the run ends before it runs again, as a
            # unit a killed delivery may have been running (``engine.in_flight``)
            lost = {
                "type": "DeliveryTimeUp",
                "message": f"{reached}, and the run ended before the body ran again",
            }
            self.host.note_pending_failure(
                self.label,
                {"step": self.step_name, "args": self.args, "error": lost, "lost": True},
            )
        return StepOutcome(UnitStatus.PARKED, retry_in=0.0)

    def _over_time(self, clock: TimeSlice) -> TaskTimeLimitExceeded:
        """A body cut off by the soft time limit although it started first in its delivery."""
        return TaskTimeLimitExceeded(
            f"{location(self.reactor or None, self.label)} ran past its Celery task's soft "
            f"time limit ({clock.named:g} s) although it started first in its delivery: raise "
            "the limit (CELERY_TASK_SOFT_TIME_LIMIT, or the task's soft_time_limit) or split "
            "the step",
            reactor=self.reactor or None,
            step=self.label,
            limit=clock.named,
        )

    def _keep_attempts(self, spent: int) -> None:
        """Remember the failed attempts of a unit that leaves before its next attempt."""
        self.host.keep_spent_attempts(self.label, spent)

    def _finish_ok(self, outcome: Outcome, recorder: StepRecorder | None) -> StepOutcome:
        if isinstance(outcome, Success):
            if recorder:
                recorder.finished(EngineEvent.STEP_SUCCEEDED)
            record = CompletedStep(
                step=self.label,
                kind="step",
                args=self.args,
                result=outcome.value,
                at=self.returned_at,
            )
            return StepOutcome(UnitStatus.COMPLETED, value=outcome.value, record=record)
        if isinstance(outcome, Skipped):
            if recorder:
                recorder.finished(EngineEvent.STEP_SKIPPED, reason=outcome.reason)
            return StepOutcome(UnitStatus.SKIPPED, value=outcome.value, reason=outcome.reason)
        assert isinstance(outcome, Halt)
        if recorder:
            recorder.finished(EngineEvent.STEP_SUCCEEDED, halt=outcome.reason)
        return StepOutcome(UnitStatus.HALTED, reason=outcome.reason)

    def _undone_by_parent(self) -> bool:
        """An ``async_step`` child delivery (also a parallel map's element): its success
        is undone by its parent's rollback, which waits for it and undoes its children newest
        first (``engine.children``) — so a body that completed before the tree's cancel was
        seen ends the child ``succeeded``, and is undone there, once."""
        run = self.run
        if run is None or run.parent is not None:
            return False
        marker = run.state.origin.dispatch
        return marker is not None and marker["kind"] == "async_step"

    def _undo_cancelled(
        self,
        instance: Step,
        outcome: Outcome,
        cancel: dict[str, Any],
        recorder: StepRecorder | None,
        context: StepContext,
    ) -> StepOutcome:
        """A body that completed (``Success``, ``Skipped``, ``Halt``) before its execution's
        cancel was seen: its effect exists, so a ``Success`` is **undone** — not compensated,
        which is for a body that did not complete — at once, while the step's holds are still
        held (``exit_unless`` kept them), as the newest completed step of the run. The step
        then fails with ``ExecutionCancelled``, and the executor undoes the earlier completed
        steps, newest first, and ends the run ``cancelled`` (docs/reactors-and-steps.md, "The
        promise under cancel and retry"). A skip or a halt left no effect to undo."""
        self._finish_ok(outcome, recorder)
        failures: list[dict[str, Any]] = []
        if isinstance(outcome, Success) and self.step_class.has_undo():
            result = outcome.value
            failures = run_rollback_hook(
                self.run,
                self.step_class,
                self.label,
                self.args,
                kind=StepRunKind.UNDO,
                call=lambda ctx: instance.undo(result, self.args, ctx),
                owner=self.owner,
                held_keys=self.held_keys,
                parent_context=context,
                declared=self.declared,
            )
        reactor = context.reactor.path() if context.reactor else None
        error = cancelled_error(cancel, context.execution_id, reactor=reactor, step=self.label)
        return StepOutcome(UnitStatus.FAILED, error=error, rollback_failures=failures)

    def _record_skip(self, attempt: int, reason: str, **detail: Any) -> None:
        recorder = self._recorder(StepRunKind.RUN, attempt)
        if recorder:
            recorder.finished(EngineEvent.STEP_SKIPPED, reason=reason, **detail)

    def _record_refusal(self, attempt: int, error: CoordinationError | ConfigurationError) -> None:
        recorder = self._recorder(StepRunKind.RUN, attempt)
        if recorder:
            recorder.finished(EngineEvent.STEP_FAILED, error=error.as_dict(), body_started=False)

    def _compensate(
        self, instance: Step, error: BaseException, context: StepContext
    ) -> list[dict[str, Any]]:
        """Compensate the failing step; its coordination is still held, so re-taking re-enters."""
        if not self.step_class.has_compensate():
            return []

        def compensate(ctx: StepContext) -> None:
            if skips_compensate(error):
                # the verdict again at the same point: this compensate is what kills its
                # deliveries (engine.lost_deliveries)
                raise error
            instance.compensate(error, self.args, ctx)

        return run_rollback_hook(
            self.run,
            self.step_class,
            self.label,
            self.args,
            kind=StepRunKind.COMPENSATE,
            call=compensate,
            owner=self.owner,
            held_keys=self.held_keys,
            parent_context=context,
            declared=self.declared,
        )


def _request_of(stop: ExecutionCancelled) -> dict[str, Any]:
    """The cancel request an ``ExecutionCancelled`` was raised for, as ``cancel_request``
    answers it."""
    fields = stop.fields()
    return {"reason": fields.get("reason") or "", "by": fields.get("by")}


def _stops_undecided(exc: BaseException, clock: TimeSlice | None) -> bool:
    """Whether ``exc``, leaving an attempt, stops its delivery without a verdict on the unit:
    not an ``Exception`` (the process is being stopped: gevent's hard time limit, the
    ``SystemExit`` of a pool child told to terminate, Ctrl-C), the task's soft time limit in
    the engine's own code, or a lost claim. Any other error fails the run at this step."""
    return (
        not isinstance(exc, Exception) or stops_delivery(clock, exc) or isinstance(exc, ClaimLost)
    )


def _cancel_flags(gate: Gate | None, context: StepContext) -> list[str]:
    """The cancel-request keys the step's release reads (``Gate.exit_unless``), or none: no
    holds to release, or no execution to cancel (``Step.call``)."""
    if gate is None or gate.admitted is None or not gate.admitted.holds:
        return []
    if context.execution_id is None:
        return []
    return flag_keys(context.root_execution_id, context.execution_id)


def call_step(
    step_class: type[Step], args: dict[str, Any], parent: StepContext | None = None
) -> Outcome:
    """``Step.call``: run one step outside a reactor, with its coordination (wait, then fail)."""
    name = step_class.__qualname__
    try:
        validate_arguments(step_class, args, None, name)
    except InputValidationError as exc:
        return Failure(exc, retryable=False)
    if parent is None:
        lock = lone_lock(step_class)
        if lock is not None:
            # one lock and nothing else: the same steps without the general set-up
            return call_locked(step_class, lock, dict(args), name)
    owner = parent.owner if parent is not None else fresh_owner()
    runner = UnitRunner(
        None,
        step_class,
        None,
        dict(args),
        label=name,
        owner=owner,
        held_keys=parent.held_keys if parent is not None else HeldKeys(),
        position_slot=name,
        parent_context=parent,
        max_attempts=1,  # a direct call is one attempt: never retried, never parked
    )
    outcome = runner.execute(park=False)
    if outcome.status == UnitStatus.COMPLETED:
        return Success(outcome.value)
    if outcome.status == UnitStatus.SKIPPED:
        return Skipped(outcome.value, reason=outcome.reason)
    if outcome.status == UnitStatus.HALTED:
        return Halt(outcome.reason)
    error = outcome.error
    if error is not None and outcome.rollback_failures:
        # No execution row records them for a direct call: they travel on the error.
        error.extra["rollback_failures"] = outcome.rollback_failures
    return Failure(error, retryable=False)
