"""``run_async(idempotency_key=...)``: which keys can be stored, and which earlier call a key names.

A key is unique across executions (``Execution.idempotency_key``): the same key with the same
call — the same reactor and the same inputs, as stored — returns the execution the first call
made; with another call it is refused (``IdempotencyKeyReused``). ``engine.enqueueing`` asks
before it inserts, and again when a concurrent call with the same key won the insert.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reactor_app.exceptions import IdempotencyKeyReused, InputValidationError
from reactor_app.models import Execution
from reactor_app.serialization import encoded_form
from reactor_app.storable import text_problem

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor


def check_idempotency_key(reactor: type[Reactor], idempotency_key: Any) -> None:
    """``InputValidationError`` at the call for a key its column cannot store as it is (a NUL
    character or a lone surrogate, more characters than the column holds): before, the row's
    ``INSERT`` failed with a database error."""
    if idempotency_key is None:
        return
    text = str(idempotency_key)
    longest = Execution._meta.get_field("idempotency_key").max_length or len(text)
    problem = text_problem(text)
    if problem is None and len(text) > longest:
        problem = f"{len(text)} characters, more than the {longest} stored"
    if problem is not None:
        raise InputValidationError(
            f"run_async of {reactor.__qualname__}: the idempotency key has {problem}",
            reactor=reactor.path(),
            step=None,
            field_errors={"idempotency_key": f"has {problem}"},
        )


def same_call(
    reactor: type[Reactor], stored_inputs: dict[str, Any], idempotency_key: str | None
) -> Execution | None:
    """The execution an earlier call with ``idempotency_key`` made, if it was the same call."""
    if idempotency_key is None:
        return None
    existing = Execution.objects.with_idempotency_key(idempotency_key)
    if existing is None:
        return None
    # compared as stored JSON, not as Python values: True == 1 == 1.0 in Python, yet
    # amount=True and amount=1 are different calls (a worker reads back what was stored)
    if existing.reactor != reactor.path() or encoded_form(existing.inputs) != encoded_form(
        stored_inputs
    ):
        raise IdempotencyKeyReused(
            f"the idempotency key {idempotency_key!r} was used for execution {existing.id} "
            f"({existing.reactor} with other inputs or another reactor); use a new key for a "
            "different call",
            reactor=reactor.path(),
            step=None,
            field_errors={"idempotency_key": "already used for a different call"},
            execution_id=str(existing.id),
        )
    return existing
