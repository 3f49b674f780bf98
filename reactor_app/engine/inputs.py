"""A run's inputs checked against the inputs its reactor declares, and kept on its row.

Every way a run starts checks them the same way: ``Reactor.run`` and ``run_async`` (before
anything is stored), a composed child and an ``async_reactor`` child (against the target's
inputs). ``stored_inputs`` is the row's copy of inputs that may not have been checked by the
codec (an in-process run, a call that failed at once). ``who_asked`` checks the one input of
an operation on a run, its ``by``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reactor_app.exceptions import InputNotSerializable, InputValidationError
from reactor_app.serialization import encode
from reactor_app.storable import storable_text

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


def stored_inputs(inputs: dict[str, Any]) -> tuple[Any, str | None]:
    """The inputs as the row keeps them, and None — or, when the codec cannot hold one, a
    display copy (its ``repr``) and the codec's message, to be noted in the state
    (``Origin.inputs_shown``) so that nothing runs again from that copy (``engine.retry``)."""
    try:
        return encode(inputs, where="inputs"), None
    except TypeError as exc:
        return encode(inputs, strict=False, where="inputs"), str(exc)


def check_kept_arguments(
    args: dict[str, Any], reactor_path: str, label: str, *, kept_for: str
) -> None:
    """``InputNotSerializable`` when a step's arguments, kept ``kept_for`` a later pass or
    another process, could not come back as the same values (``reactor_app.serialization``):
    kept anyway, a value the codec cannot hold was only its ``repr`` there."""
    try:
        encode(args, where="arguments")
    except TypeError as exc:
        raise InputNotSerializable(
            f"step {label!r} of {reactor_path} cannot keep its arguments {kept_for}: {exc}",
            reactor=reactor_path,
            step=label,
            field_errors={"arguments": str(exc)},
        ) from exc


def who_asked(by: Any, action: str) -> str | None:
    """``by`` of an operation on a run (``cancel``, ``retry``): who asked, shown in the admin
    and kept in its event and state — text or None. Anything else is an
    ``InputValidationError``: an object used to come out of the Redis write as a raw
    ``TypeError``, or be kept as its ``repr``. Text the database cannot store is kept
    readable (``storable_text``): it is only shown."""
    if by is None:
        return None
    if isinstance(by, str):
        return storable_text(by)
    raise InputValidationError(
        f"{action}: by must be text (who asked), got {type(by).__name__}",
        field_errors={"by": "must be a string"},
    )
