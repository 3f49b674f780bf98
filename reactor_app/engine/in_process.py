"""``Reactor.run``: a new execution run to its end in the caller's process.

Split from ``engine.executor`` (which keeps the loop and ``run_inline``, the one pass any
in-process caller runs): this is only the creation of the row — failed at once on bad inputs,
else inserted already running — before that pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.utils import timezone

from reactor_app.dsl.kinds import InterruptSpec
from reactor_app.engine.cancel_flag import note_clear
from reactor_app.engine.enqueueing import hand_off_new
from reactor_app.engine.executor import ExecutionRun, run_inline
from reactor_app.engine.inputs import input_errors, stored_inputs
from reactor_app.engine.priority import checked_priority, in_process_context
from reactor_app.engine.result import Result
from reactor_app.exceptions import InputNotSerializable
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
    error = input_errors(reactor, inputs) or _not_for_another_process(reactor, inputs)
    now = timezone.now()
    stored, shown = stored_inputs(inputs)
    context = in_process_context(priority, shown) if priority or shown else None
    if error is not None:
        failed = Execution.objects.start(
            reactor=reactor.path(),
            inputs=stored,
            status=ExecutionStatus.FAILED,
            error=error.as_dict(),
            finished_at=now,
            **({"context": context} if context else {}),
        )
        return Result(status=ExecutionStatus.FAILED, error=error, execution_id=str(failed.id))
    # inserted running: this process starts it at once (one statement, not insert + update)
    order = reactor.plan.order
    execution = Execution.objects.start(
        reactor=reactor.path(),
        inputs=stored,
        status=ExecutionStatus.RUNNING,
        started_at=now,
        heartbeat_at=now,
        current_step=order[0] if order else "",
        **({"context": context} if context else {}),
    )
    run = ExecutionRun(reactor, execution, inputs)
    run.inserted_running = True
    note_clear(execution.pk)
    return run_inline(run)


def _not_for_another_process(
    reactor: type[Reactor], inputs: dict[str, Any]
) -> InputNotSerializable | None:
    """The error of an input a later part of this run, in another process, could not read back
    from the row — when the run can continue elsewhere: handed to a worker after a step
    (``background = "after:<step>"``) or resumed after an interrupt. Such a run reads its
    inputs from the row, where a value the codec cannot hold is only its ``repr``: a set
    arrived at the worker's step as the text ``"{'a', 'b'}"``. A run that stays in this
    process takes any inputs (the row keeps a display copy)."""
    continues_elsewhere = isinstance(reactor.background, str) or any(
        isinstance(spec, InterruptSpec) for spec in reactor.plan.specs.values()
    )
    if not continues_elsewhere:
        return None
    for name, value in inputs.items():
        try:
            encode(value, where=f"input {name!r}")
        except TypeError as exc:
            return InputNotSerializable(
                f"cannot run {reactor.__qualname__}: it may continue in another process, "
                f"which reads its inputs back from the row, and {exc}",
                reactor=reactor.path(),
                step=None,
                field_errors={name: str(exc)},
            )
    return None
