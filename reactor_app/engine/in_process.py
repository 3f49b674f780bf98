"""``Reactor.run``: a new execution run to its end in the caller's process.

Split from ``engine.executor`` (which keeps the loop and ``run_inline``, the one pass any
in-process caller runs): this is only the creation of the row — failed at once on bad inputs,
else inserted already running — before that pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.utils import timezone

from reactor_app.engine.cancel_flag import note_clear
from reactor_app.engine.enqueueing import hand_off_new
from reactor_app.engine.executor import ExecutionRun, run_inline
from reactor_app.engine.inputs import input_errors
from reactor_app.engine.priority import checked_priority, in_process_context
from reactor_app.engine.result import Result
from reactor_app.models import Execution
from reactor_app.serialization import encode
from reactor_app.status import ExecutionStatus

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor


def run_reactor(
    reactor: type[Reactor], inputs: dict[str, Any], *, priority: int | None = None
) -> Result:
    """``Reactor.run``: create the execution row and run it to the end in this process (or, for
    ``background = True``, hand the whole run to a worker). ``priority`` places its waiting
    units in the lines of contended keys, as ``run_async``'s does (``InputValidationError``
    at the call when it is not an int from -100 to 100)."""
    priority = checked_priority(reactor, priority, call="run")
    if reactor.background is True:
        return hand_off_new(reactor, inputs, priority=priority)
    error = input_errors(reactor, inputs)
    now = timezone.now()
    if error is not None:
        failed = Execution.objects.start(
            reactor=reactor.path(),
            inputs=encode(inputs, strict=False, where="inputs"),
            status=ExecutionStatus.FAILED,
            error=error.as_dict(),
            finished_at=now,
        )
        return Result(status=ExecutionStatus.FAILED, error=error, execution_id=str(failed.id))
    # inserted running: this process starts it at once (one statement, not insert + update)
    order = reactor.plan.order
    execution = Execution.objects.start(
        reactor=reactor.path(),
        inputs=encode(inputs, strict=False, where="inputs"),
        status=ExecutionStatus.RUNNING,
        started_at=now,
        heartbeat_at=now,
        current_step=order[0] if order else "",
        **({"context": in_process_context(priority)} if priority else {}),
    )
    run = ExecutionRun(reactor, execution, inputs)
    run.inserted_running = True
    note_clear(execution.pk)
    return run_inline(run)
