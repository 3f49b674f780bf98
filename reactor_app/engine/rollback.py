"""Rollback: compensate the failing step, then undo every completed step, newest first
(by completion across a tree's logs: ``engine.undo_order``).

Compensate and undo re-take the step's **lock and semaphore** (same keys from the same stored
arguments, same owner), waiting up to ``rollback_wait``; never its rate limit, period or
ordered lock, because a forward-work quota must never suppress cleanup. A hook that cannot
acquire, or that raises, is reported in ``rollback_failures`` and the rest still runs.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from reactor_app.dsl.declarations import DeclarationSet
from reactor_app.dsl.step import Step, StepSpec
from reactor_app.engine.context import CompletedStep, HeldKeys, StepContext
from reactor_app.engine.gate import Gate
from reactor_app.engine.host import gate_scope, host_of, step_context
from reactor_app.engine.lost_deliveries import take_verdict
from reactor_app.engine.outcomes import PassEnd, RunEnd
from reactor_app.engine.result import error_from_dict
from reactor_app.engine.state import RollingBack
from reactor_app.engine.time_slice import DeliveryTimeUp, cut_off, limit_behind
from reactor_app.engine.undo_order import plan_undos
from reactor_app.exceptions import (
    CompensationFailed,
    ConfigurationError,
    CoordinationError,
    ReactorError,
    UndoFailed,
)
from reactor_app.status import EngineEvent, StepRunKind

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun

_EVENTS = {
    StepRunKind.COMPENSATE: (EngineEvent.COMPENSATION_SUCCEEDED, EngineEvent.COMPENSATION_FAILED),
    StepRunKind.UNDO: (EngineEvent.UNDO_SUCCEEDED, EngineEvent.UNDO_FAILED),
}


def run_rollback_hook(
    run: ExecutionRun | None,
    step_class: type[Step],
    label: str,
    args: dict[str, Any],
    *,
    kind: str,
    call: Callable[[StepContext], Any],
    owner: str,
    held_keys: HeldKeys | None,
    parent_context: StepContext | None = None,
    declared: DeclarationSet | None = None,
) -> list[dict[str, Any]]:
    """Run one compensate/undo under the step's re-taken exclusion; return failures.

    ``declared``: every declaration the forward path honoured — the class's merged with those
    placed on the step in its reactor (``with_lock(...)(step(Cls, ...))``); defaults to the
    class's own. Rollback must re-take what the forward path took, wherever it was declared.
    """
    host = host_of(run)
    reactor = host.reactor_path
    declarations = (declared if declared is not None else step_class.declarations()).for_rollback()
    gate = None
    try:
        # Entering sits inside the try, as the runner's does: whatever ends the hook after an
        # admission, the finally below gives the holds back (a no-op when nothing was taken).
        if declarations:
            rollback_waits = {
                d.primitive: d.effective_rollback_wait  # type: ignore[attr-defined]
                for d in declarations
            }
            scope = gate_scope(host, step=label, owner=owner, held_keys=held_keys, parks=False)
            gate = Gate(declarations, args, scope, waits=rollback_waits)
            wait = max(rollback_waits.values())
            try:
                gate.enter(wait=wait, park=False)  # rollback never parks
            except (CoordinationError, ConfigurationError) as error:
                limit = limit_behind(run.root.time_slice if run is not None else None, error)
                if limit is not None:
                    # the task's soft limit in a key function, not the hook's failure: the
                    # delivery ends, and the next one runs this hook (engine.time_slice)
                    raise limit from None
                return [
                    {
                        "step": label,
                        "kind": kind,
                        "reason": "coordination_unavailable",
                        "key": getattr(error, "key", None),
                        "primitive": getattr(error, "primitive", None),
                        "error": error.as_dict(),
                    }
                ]
        recorder = host.recorder(label, kind, 1)
        succeeded_event, failed_event = _EVENTS[kind]  # type: ignore[index]
        if recorder:
            recorder.started()
        context = step_context(
            host,
            parent_context,
            step=label,
            attempt=1,
            owner=owner,
            held_keys=held_keys,
            gate=gate,
        )
        clock = run.root.time_slice if run is not None else None
        first = clock is None or not clock.worked
        # deliveries lost in a row here: this hook is not run again
        lost = take_verdict(run, label)
        try:
            if lost is not None:
                raise lost
            call(context)
        except Exception as exc:
            if clock is not None and cut_off(exc) and not first:
                # the delivery's time ran out, not the hook's: it runs again in the next
                # delivery, which goes on with the rollback (engine.time_slice)
                raise DeliveryTimeUp(f"{kind} of step {label!r} cut off") from exc
            error_class = CompensationFailed if kind == StepRunKind.COMPENSATE else UndoFailed
            failure = error_class(
                f"{kind} of step {label!r} of {reactor} raised {type(exc).__name__}: {exc}",
                reactor=reactor,
                step=label,
                cause=exc,
            )
            if recorder:
                recorder.finished(failed_event, error=failure.as_dict())
            return [{"step": label, "kind": kind, "reason": "error", "error": failure.as_dict()}]
        finally:
            if clock is not None:
                clock.worked = True
        if recorder:
            recorder.finished(succeeded_event)
        return []
    finally:
        if gate is not None:
            gate.exit("rollback")


def roll_back(run: ExecutionRun, *, with_ancestors: bool = True) -> list[dict[str, Any]]:
    """Undo every completed step of ``run`` — and of the composed children in its log —
    newest first by completion (``engine.undo_order``); return what could not be undone.

    ``with_ancestors``: ``run`` is a composed child rolling back before the runs it is
    composed into do (they always roll back after it); their async steps that ended after its
    oldest entry (settled by ``engine.settling.settle_children``) are undone in between its
    own, and leave their logs.

    A run on a worker counts its hooks as they run (``HookCount``), so that a redelivery
    after a crash goes on where this rollback stopped (``engine.rollback_progress``)."""
    plan = plan_undos(run, with_ancestors=with_ancestors and run.parent is not None)
    count = HookCount(run)
    failures: list[dict[str, Any]] = []
    for undo in plan.undos:
        failures.extend(undo_record(undo.owner, undo.record, count))
    for undo in plan.undos:
        if undo.owner is not run and undo.owner not in plan.children:
            log = undo.owner.state.completed
            log[:] = [record for record in log if record is not undo.record]
    run.state.completed.clear()
    for child in plan.children:
        child.state.completed.clear()
        child.persist()
    return failures


def record_rollback(
    run: ExecutionRun,
    status: PassEnd,
    error: ReactorError | None,
    failures: list[dict[str, Any]],
) -> RollingBack | None:
    """The rollback under way of ``run`` — recorded now (durably: a redelivery must find the
    decision before any hook runs) when ``run`` runs on a worker and none is; None in process,
    where nothing resumes a run from its row (``engine.rollback_progress``)."""
    mark = run.state.continuation.rolling_back
    if mark is None and run.policy.persists_each_step:
        mark = RollingBack(
            status=status.value,
            error=error.as_dict() if error is not None else None,
            failures=list(failures),
            done=0,
        )
        run.state.continuation.rolling_back = mark
        run.persist()
    return mark


def recorded_end(run: ExecutionRun, mark: RollingBack, settled: list[dict[str, Any]]) -> RunEnd:
    """The end ``mark`` recorded, its rollback done (the record leaves the state)."""
    run.state.continuation.rolling_back = None
    recorded = error_from_dict(mark["error"])
    return RunEnd(
        PassEnd(mark["status"]),
        error=recorded if isinstance(recorded, ReactorError) else None,
        rollback_failures=list(mark["failures"]) + settled,
    )


class HookCount:
    """The hooks of one rollback, counted in its plan's order: with a rollback under way
    recorded in the run's state (``Continuation.rolling_back``: a run on a worker), the
    first ``done`` are passed over — they ran before the delivery that did them died — and
    each one that runs is counted and checkpointed once it returns, its failures with it.
    The plan (``engine.undo_order``) is laid out from the same log on every pass, so the
    count names the same hooks."""

    def __init__(self, run: ExecutionRun) -> None:
        self.run = run
        self.mark = run.state.continuation.rolling_back
        self.seen = 0

    def run_hook(self, hook: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        self.seen += 1
        if self.mark is None:
            return hook()
        if self.seen <= self.mark["done"]:
            return []  # ran on an earlier pass; its failures are in the mark
        if self.run.out_of_time():
            # this delivery used its share of the task's time limit: the next one goes on
            # from this count, as after a killed delivery (engine.time_slice)
            raise DeliveryTimeUp(f"rollback of {self.run.reactor_path} goes on in a new delivery")
        failures = hook()
        self.mark["done"] = self.seen
        self.mark["failures"].extend(failures)
        self.run.checkpoint()
        return failures


def undo_record(run: ExecutionRun, record: CompletedStep, count: HookCount) -> list[dict[str, Any]]:
    spec = run.reactor.steps.get(record.step.split("[", 1)[0])
    if record.kind == "compose":
        return count.run_hook(lambda: _undo_child(run, record.child_execution))
    if record.kind == "map":
        failures: list[dict[str, Any]] = []
        for element in reversed(record.elements):
            if element.get("child_execution"):
                failures += count.run_hook(partial(_undo_child, run, element["child_execution"]))
            elif spec is not None:
                label, args, result = element["label"], element["args"], element["result"]
                failures += count.run_hook(partial(_undo_step, run, spec, label, args, result))
        return failures
    if spec is None:
        return []
    return count.run_hook(lambda: _undo_step(run, spec, record.step, record.args, record.result))


def _undo_step(
    run: ExecutionRun, spec: StepSpec, label: str, args: dict[str, Any], result: Any
) -> list[dict[str, Any]]:
    step_class = spec.step_class()
    if step_class is None or not step_class.has_undo():
        return []
    instance = step_class()
    return run_rollback_hook(
        run,
        step_class,
        label,
        args,
        kind=StepRunKind.UNDO,
        call=lambda ctx: instance.undo(result, args, ctx),
        owner=run.owner,
        held_keys=run.held_keys,
        declared=spec.declarations,
    )


def _undo_child(run: ExecutionRun, child_execution: str | None) -> list[dict[str, Any]]:
    child = run.child_run(child_execution) if child_execution else None
    if child is None:
        return []
    failures = roll_back(child, with_ancestors=False)
    child.persist()
    return failures
