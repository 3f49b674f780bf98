"""Retry from a step: run a failed execution again from the step that failed (or a named one).

``Execution.retry(from_step=None, on_worker=None, by="")`` creates a **new** execution of the
same reactor with the same inputs, linked to the failed one by ``retry_of``, whose checkpoint
starts at ``from_step``:

* **Earlier steps are not re-run.** Their recorded results (the failed execution's persisted
  ``state.results``) are copied into the new execution, and arguments that read them resolve
  as they did. The failed run's rollback already *undid* those steps' side effects (a failed
  run rolls back its completed steps, newest first); the retry reuses their **results**, it
  does not redo their effects. When the effects matter (a reservation that was released, a
  charge that was refunded), retry from the first step whose effect must exist again — e.g.
  ``retry(from_step="reserve")`` — or start a new run.
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
the first; retry that one instead); ``from_step`` must be a step of the reactor's plan, and
every step before it must have a recorded result (a step after the failure point, or after an
async child that never finished, has none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from reactor_app.dsl.registry import lookup
from reactor_app.engine.enqueueing import enqueue_new_on_commit
from reactor_app.engine.executor import ExecutionRun, run_inline
from reactor_app.engine.state import ExecutionState
from reactor_app.exceptions import ExecutionNotRetryable
from reactor_app.models import Execution
from reactor_app.serialization import decode
from reactor_app.status import ExecutionStatus

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor


def retry(
    failed: Execution, *, from_step: str | None = None, on_worker: bool | None = None, by: str = ""
) -> Execution:
    """See the module docstring. Returns the new execution: pending (a worker runs it) or as
    its in-process run left it."""
    reactor = lookup(failed.reactor)
    order = list(reactor.plan.order)
    with transaction.atomic():
        # under a row lock: of two concurrent retries of one execution, one wins
        failed = Execution.objects.select_for_update().get(pk=failed.pk)
        _check(failed)
        state = ExecutionState.from_json(failed.context)
        start = _start_index(failed, state, order, from_step)
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


def _start_index(
    failed: Execution, state: ExecutionState, order: list[str], from_step: str | None
) -> int:
    fields: dict[str, Any] = {"execution_id": str(failed.pk), "status": failed.status}
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
    elif from_step in order:
        start = order.index(from_step)
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
