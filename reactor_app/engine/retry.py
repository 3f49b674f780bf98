"""Retry from a step: run a failed execution again from the step that failed (or a named one).

``Execution.retry(from_step=None, on_worker=None, by="")`` creates a **new** execution of the
same reactor with the same inputs, linked to the failed one by ``retry_of``, whose checkpoint
starts at ``from_step``:

* **A result whose undo ran is never reused.** The failed run's rollback undid its completed
  steps that define an undo (a failed run rolls back its completed steps, newest first): their
  effects no longer exist, so their results describe nothing (a refunded charge, a released
  reservation). By default the retry starts at the **first step the rollback undid** when
  that is earlier than the failed step — or at the first step without a recorded result when
  that is earlier still (an ``async_step`` nobody read that failed as well); a ``from_step``
  later than the first undone step is refused with ``ExecutionNotRetryable`` naming the
  undone steps (``undone``).
* **Earlier steps whose effects still stand are not re-run.** A step without an undo (or
  whose undo never ran: it could not take its coordination, or the step was itself reused
  from an earlier run) keeps its effect; its recorded result (the failed execution's
  ``state.results``) is copied into the new execution, and arguments that read it resolve as
  they did.
* **Nothing reused is rolled back again.** The reused steps are not in the new execution's
  rollback log (they were undone once already); if the retry fails too, only the steps it
  ran itself are compensated and undone.
* **Coordination is taken afresh**: no holds, ordered positions, park counts or kept holds
  carry over. The reactor-level gate is entered as for a new run, and every step from
  ``from_step`` on is admitted as usual.
* **Where it runs**: where the reactor would run that step — in this process for a reactor
  that runs synchronously (as ``Reactor.resume``), on a worker (an outbox row, enqueued after
  commit, as ``run_async``) for a ``background = True`` reactor, and for
  ``background = "after:<step>"`` on a worker when retrying from a step after that one (from an
  earlier step: here, handing off after it as a first run does). ``on_worker=True`` sends any
  reactor to a worker (the admin action does: a saga never runs inside an admin request);
  ``on_worker=False`` runs any reactor here.

Validation (``ExecutionNotRetryable``): only a ``failed`` root execution (a composed or async
child is retried through its root); only once (a second retry of the same execution names
the first; retry that one instead); ``from_step`` must be a step of the reactor's plan, no
later than the first step the failed run's rollback undid, and every step before it must have
a recorded result (a step after the failure point, or after an async child that never
finished, has none).

``retry_plan`` answers what a retry would reuse and re-run without retrying (the admin's
confirmation pages show it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from reactor_app import isolation
from reactor_app.dsl.kinds import AsyncReactorSpec, ComposeSpec, InterruptSpec, MapSpec
from reactor_app.dsl.registry import lookup
from reactor_app.engine.enqueueing import enqueue_new_on_commit
from reactor_app.engine.executor import ExecutionRun, run_inline
from reactor_app.engine.inputs import who_asked
from reactor_app.engine.progress import load_state
from reactor_app.engine.state import ExecutionState
from reactor_app.exceptions import ExecutionNotRetryable
from reactor_app.models import Execution
from reactor_app.serialization import decode
from reactor_app.status import ExecutionStatus

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor
    from reactor_app.dsl.step import StepSpec


@dataclass(frozen=True)
class RetryPlan:
    """What retrying ``failed`` from ``from_step`` does: the steps before it are ``reused``
    (their recorded results; their effects still stand), the rest (``rerun``) run again.
    ``undone``: the steps of the failed run whose undo ran — never reused."""

    from_step: str
    reused: list[str]
    rerun: list[str]
    undone: list[str]


def retry_plan(failed: Execution, from_step: str | None = None) -> RetryPlan:
    """What ``retry(failed, from_step=...)`` would reuse and re-run; raises
    ``ExecutionNotRetryable`` as the retry would (without the row lock: the retry checks
    again)."""
    reactor = lookup(failed.reactor)
    order = list(reactor.plan.order)
    _check(failed)
    state = load_state(failed)
    _check_inputs(failed, state)
    start = _start_index(failed, state, order, from_step, reactor)
    return RetryPlan(
        from_step=order[start],
        reused=order[:start],
        rerun=order[start:],
        undone=undone_steps(failed, state, reactor),
    )


def retry(
    failed: Execution, *, from_step: str | None = None, on_worker: bool | None = None, by: str = ""
) -> Execution:
    """See the module docstring. Returns the new execution: pending (a worker runs it) or as
    its in-process run left it."""
    by = who_asked(by, "retry") or ""
    reactor = lookup(failed.reactor)
    order = list(reactor.plan.order)
    with isolation.atomic():
        # under a row lock: of two concurrent retries of one execution, one wins
        failed = Execution.objects.select_for_update().get(pk=failed.pk)
        _check(failed)
        state = load_state(failed)
        _check_inputs(failed, state)
        start = _start_index(failed, state, order, from_step, reactor)
        worker = _on_worker(reactor, order, start) if on_worker is None else on_worker
        fresh = ExecutionState(
            results={name: state.results[name] for name in order[:start]},
            next_index=start,
        )
        fresh.origin.retry = {
            "of": str(failed.pk),
            "from_step": order[start],
            "reused": order[:start],
            "by": by,
        }
        if worker:
            fresh.origin.worker = True
        execution = Execution.objects.start(
            reactor=failed.reactor,
            inputs=failed.inputs,
            status=ExecutionStatus.PENDING,
            context=fresh.to_json(),
            current_step=order[start],
            heartbeat_at=timezone.now(),
            retry_of=failed,
        )
        if worker:
            enqueue_new_on_commit(reactor, decode(failed.inputs), execution)
    if not worker:
        run_inline(ExecutionRun(reactor, execution, dict(execution.inputs)))
        execution.refresh_from_db()
    return execution


def _on_worker(reactor: type[Reactor], order: list[str], start: int) -> bool:
    """Where the reactor would run this step: ``background = True`` on a worker; with
    ``background = "after:<step>"``, the steps after that one on a worker (before it, the
    retry runs here and hands off after it, as a first run would)."""
    background = reactor.background
    if background is True:
        return True
    if isinstance(background, str) and background.startswith("after:"):
        after = background.removeprefix("after:")
        return after in order and start > order.index(after)
    return False


def _check(failed: Execution) -> None:
    fields: dict[str, Any] = {"execution_id": str(failed.pk), "status": failed.status}
    if failed.status != ExecutionStatus.FAILED:
        raise ExecutionNotRetryable(
            f"execution {failed.pk} is {failed.status}: only a failed execution can be retried",
            step=None,
            **fields,
        )
    if failed.parent_id is not None:
        raise ExecutionNotRetryable(
            f"execution {failed.pk} is a child of {failed.root_id or failed.parent_id}: "
            "retry its root execution",
            step=None,
            **fields,
        )
    earlier = failed.retries.first()
    if earlier is not None:
        raise ExecutionNotRetryable(
            f"execution {failed.pk} was already retried as {earlier.pk} ({earlier.status}); "
            "retry that one if it failed too",
            step=None,
            retried_as=str(earlier.pk),
            **fields,
        )


def _check_inputs(failed: Execution, state: ExecutionState) -> None:
    """Refuse a run whose row keeps only a display copy of its inputs: a retry reads them from
    the row, and would have run on their ``repr`` (the text ``"{'a', 'b'}"`` for a set)."""
    if state.origin.inputs_shown:
        raise ExecutionNotRetryable(
            f"execution {failed.pk} cannot be retried from its row: its inputs were kept for "
            f"display only ({state.origin.inputs_shown}); start a new run with them",
            step=None,
            execution_id=str(failed.pk),
            status=failed.status,
        )


def undone_steps(failed: Execution, state: ExecutionState, reactor: type[Reactor]) -> list[str]:
    """The steps of ``failed`` whose undo its rollback ran, in plan order.

    A failed run undoes every step it completed whose undo exists (``engine.rollback``). So:
    the steps with a recorded result that this run ran itself (not reused from the run it
    retried) and whose rollback has an undo — a step, an ``async_step`` or a map of a step
    defining ``undo``; a composed reactor (or a map of one) with such a step anywhere inside.
    An undo that never ran because it could not take its coordination
    (``rollback_failures`` reason ``coordination_unavailable``) leaves the effect standing."""
    origin = state.origin.retry
    reused = set(origin["reused"]) if origin else set()
    not_run = {
        str(entry.get("step", "")).split("[", 1)[0]
        for entry in failed.rollback_failures or []
        if isinstance(entry, dict)
        and entry.get("kind") == "undo"
        and entry.get("reason") == "coordination_unavailable"
    }
    return [
        name
        for name in reactor.plan.order
        if name in state.results
        and name not in reused
        and name not in not_run
        and _undoes(reactor.plan.specs[name])
    ]


def _undoes(spec: StepSpec, seen: frozenset[type[Reactor]] = frozenset()) -> bool:
    """Whether rolling back a completed ``spec`` runs an undo."""
    if isinstance(spec, InterruptSpec):
        return False
    if isinstance(spec, ComposeSpec) or (isinstance(spec, MapSpec) and spec.is_reactor):
        child = spec.target
        if child in seen:
            return False
        return any(_undoes(inner, seen | {child}) for inner in child.plan.specs.values())
    if isinstance(spec, AsyncReactorSpec):
        return False  # a tree of its own, never in this run's rollback
    step_class = spec.step_class()
    return step_class is not None and step_class.has_undo()


def _start_index(
    failed: Execution,
    state: ExecutionState,
    order: list[str],
    from_step: str | None,
    reactor: type[Reactor],
) -> int:
    fields: dict[str, Any] = {"execution_id": str(failed.pk), "status": failed.status}
    undone = undone_steps(failed, state, reactor)
    first_undone = order.index(undone[0]) if undone else len(order)
    if from_step is None:
        # the checkpoint of the failed run is the step it was running when it failed; a run
        # that failed after its last step (waiting for async children) restarts at the step
        # its error names
        start = state.next_index
        if start >= len(order):
            named = (failed.error or {}).get("step") or failed.current_step
            if named not in order:
                raise ExecutionNotRetryable(
                    f"execution {failed.pk} failed after its last step: name the step to "
                    f"retry from (one of {', '.join(order)})",
                    step=None,
                    **fields,
                )
            start = order.index(named)
        # never past a step whose effect the rollback undid: it runs again; nor past one
        # without a recorded result (an async step nobody read that failed too: the run's
        # error names a later step)
        start = min(start, first_undone)
        unrecorded = [
            index for index, name in enumerate(order[:start]) if name not in state.results
        ]
        if unrecorded:
            start = unrecorded[0]
    elif from_step in order:
        start = order.index(from_step)
        if start > first_undone:
            names = [name for name in undone if order.index(name) < start]
            raise ExecutionNotRetryable(
                f"cannot retry execution {failed.pk} from {from_step!r}: the failed run's "
                f"rollback undid {', '.join(repr(n) for n in names)} before it, so their "
                f"results describe effects that no longer exist; retry from {undone[0]!r} "
                "or earlier",
                step=from_step,
                undone=names,
                **fields,
            )
    else:
        raise ExecutionNotRetryable(
            f"{failed.reactor} has no step {from_step!r}; its steps are: {', '.join(order)}",
            step=from_step,
            **fields,
        )
    missing = [name for name in order[:start] if name not in state.results]
    if missing:
        raise ExecutionNotRetryable(
            f"cannot retry execution {failed.pk} from {order[start]!r}: "
            f"{', '.join(repr(m) for m in missing)} before it has no recorded result (it did "
            "not complete in the failed run); retry from an earlier step",
            step=order[start],
            **fields,
        )
    return start
