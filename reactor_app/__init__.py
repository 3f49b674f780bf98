"""reactor_app: saga workflows with keyed, step-scoped Redis coordination for Django.

The public API (see docs/design.md) is re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reactor_app.dsl.arguments import element, from_input, from_result, value
from reactor_app.dsl.coordination import (
    with_debounce,
    with_lock,
    with_ordered_lock,
    with_period,
    with_rate_limit,
    with_semaphore,
)
from reactor_app.dsl.kinds import async_reactor, async_step, compose, interrupt, map_step
from reactor_app.dsl.outcome import Failure, Halt, Skipped, Success
from reactor_app.dsl.reactor import Reactor
from reactor_app.dsl.retries import Retries
from reactor_app.dsl.step import Step, step
from reactor_app.engine.result import Result

if TYPE_CHECKING:
    from reactor_app.engine.context import StepContext

__version__ = "0.1.0"

__all__ = [
    "Failure",
    "Halt",
    "Reactor",
    "Result",
    "Retries",
    "Skipped",
    "Step",
    "StepContext",
    "Success",
    "async_reactor",
    "async_step",
    "compose",
    "element",
    "from_input",
    "from_result",
    "interrupt",
    "map_step",
    "step",
    "value",
    "with_debounce",
    "with_lock",
    "with_ordered_lock",
    "with_period",
    "with_rate_limit",
    "with_semaphore",
]


def __getattr__(name: str) -> Any:
    # deferred: StepContext's module imports the models, which cannot load while Django reads
    # INSTALLED_APPS (that imports this package), so it is resolved on first use.
    if name == "StepContext":
        from reactor_app.engine.context import StepContext

        return StepContext
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
