"""A run's inputs checked against the inputs its reactor declares.

Every way a run starts checks them the same way: ``Reactor.run`` and ``run_async`` (before
anything is stored), a composed child and an ``async_reactor`` child (against the target's
inputs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reactor_app.exceptions import InputValidationError

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor


def input_errors(reactor: type[Reactor], inputs: dict[str, Any]) -> InputValidationError | None:
    """Missing or unexpected inputs of a run, as one structured error."""
    field_errors = {name: "required" for name in reactor.inputs if name not in inputs}
    field_errors.update({name: "unexpected input" for name in inputs if name not in reactor.inputs})
    if not field_errors:
        return None
    described = ", ".join(f"{k}: {v}" for k, v in field_errors.items())
    return InputValidationError(
        f"invalid inputs for {reactor.__qualname__}: {described}",
        reactor=reactor.path(),
        step=None,
        field_errors=field_errors,
    )
