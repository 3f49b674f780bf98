"""The lean path of the most common ``Step.call``: a step class with one lock and nothing else.

``runner.call_step`` takes it for a direct call (no enclosing step context) of a step class
whose only step-level declaration is a ``with_lock`` that queues on contention (the default
``on_contention``). What it does is ``UnitRunner.execute`` for exactly that case — one attempt,
no execution, nothing parked, recorded or persisted, no cancel request to read — written out
without the general runner's set-up (its host, gate scope and context builders, the retry and
park branches) and with the gate's single-lock entry (``Gate.enter_lock``). The admission, the
fencing token, the FIFO wait then failure, the live-holds index entry, the coordination
events, the renewal, the release on every exit and the compensation under the lock are the
gate's and the runner's own code, so the two paths cannot drift apart there; a test runs the
same scenarios through both and compares their outcomes, events and holds
(``tests/unit/test_locked_call.py``).

Why a path of its own: a locked no-op ``Step.call`` spent about as much CPU in the general
runner's and gate's set-up as in the two script calls themselves (docs/benchmarks.md, "The
single-lock ``Step.call`` path").
"""

from __future__ import annotations

from typing import Any

from reactor_app.dsl.declarations import LockDeclaration
from reactor_app.dsl.outcome import Failure, Halt, Outcome, Skipped, Success, as_outcome
from reactor_app.dsl.step import Step
from reactor_app.engine import contention
from reactor_app.engine.context import HeldKeys, StepContext
from reactor_app.engine.gate import Gate, GateScope, fresh_owner
from reactor_app.engine.outcomes import ReleaseOutcome
from reactor_app.engine.rollback import run_rollback_hook
from reactor_app.exceptions import (
    ConfigurationError,
    CoordinationError,
    ExecutionCancelled,
)
from reactor_app.status import StepRunKind


def lone_lock(step_class: type[Step]) -> LockDeclaration | None:
    """The step's lock when it is the class's only declaration and queues on contention (the
    lean path applies), else None (the general runner)."""
    declared = step_class.declarations().by_primitive
    if len(declared) != 1:
        return None
    declaration = declared.get("lock")
    if type(declaration) is not LockDeclaration or declaration.on_contention != contention.QUEUE:
        return None
    return declaration


def call_locked(
    step_class: type[Step], declaration: LockDeclaration, args: dict[str, Any], name: str
) -> Outcome:
    """``Step.call`` of a step whose only declaration is ``declaration`` (``lone_lock``), with no
    enclosing context; ``args`` already validated and copied. See the module docstring."""
    instance = step_class()
    owner = fresh_owner()
    held_keys = HeldKeys()
    scope = GateScope(
        reactor="",
        step=name,
        owner=owner,
        execution_id=None,
        held_keys=held_keys,
        position_slot=name,
    )
    wait = declaration.wait
    gate = Gate((declaration,), args, scope, waits={"lock": wait})
    release_as: ReleaseOutcome = "failure"
    try:
        # inside the try, as in the runner: whatever fails after the admission, the finally
        # gives the lock back (exit is a no-op when nothing was taken)
        try:
            gate.enter_lock(wait)
        except (CoordinationError, ConfigurationError) as refusal:
            # contention after the wait, an uncomputable key or Redis down: nothing ran
            return Failure(refusal, retryable=False)
        context = StepContext(
            execution_id=None,
            root_execution_id=None,
            step_name=name,
            attempt=1,
            reactor=None,
            reactor_instance=None,
            inputs={},
            owner=owner,
            gates=[gate],
            held_keys=held_keys,
            lease_lost=gate.lost,
        )
        try:
            outcome: Outcome = as_outcome(instance.run(args, context))
        except Exception as exc:
            outcome = Failure(exc, retryable=not isinstance(exc, ExecutionCancelled))
        try:
            context.check_leases()  # no execution: a checkpoint is the lease check alone
        except Exception as exc:  # a lease lost while the body ran
            if not isinstance(outcome, Failure):
                outcome = Failure(exc)
        if isinstance(outcome, Success):
            release_as = "success"
            return Success(outcome.value)
        if isinstance(outcome, Skipped):
            release_as = "halt"
            return Skipped(outcome.value, reason=outcome.reason)
        if isinstance(outcome, Halt):
            release_as = "halt"
            return Halt(outcome.reason)
        return _failed(instance, step_class, name, args, outcome, context)
    finally:
        gate.exit(release_as)


def _failed(
    instance: Step,
    step_class: type[Step],
    name: str,
    args: dict[str, Any],
    outcome: Failure,
    context: StepContext,
) -> Outcome:
    """A failed body: compensated while the lock is still held, as the runner does."""
    # deferred: the runner imports this module
    from reactor_app.engine.runner import failure_error

    error = failure_error(outcome, "", name, 1)
    if step_class.has_compensate():
        cause = outcome.exception()
        failures = run_rollback_hook(
            None,
            step_class,
            name,
            args,
            kind=StepRunKind.COMPENSATE,
            call=lambda ctx: instance.compensate(cause, args, ctx),
            owner=context.owner,
            held_keys=context.held_keys,
            parent_context=context,
            declared=step_class.declarations(),
        )
        if failures:
            # no execution row records them for a direct call: they travel on the error
            error.extra["rollback_failures"] = failures
    return Failure(error, retryable=False)
