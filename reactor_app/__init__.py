"""reactor_app: saga workflows with keyed, step-scoped Redis coordination for Django.

The public API (DESIGN §1) is re-exported here.
"""

from __future__ import annotations

from reactor_app.dsl.arguments import element, from_input, from_result, value
from reactor_app.dsl.coordination import (
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

__version__ = "0.1.0"

__all__ = [
    "Failure",
    "Halt",
    "Reactor",
    "Result",
    "Retries",
    "Skipped",
    "Step",
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
    "with_lock",
    "with_ordered_lock",
    "with_period",
    "with_rate_limit",
    "with_semaphore",
]
