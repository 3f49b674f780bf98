"""Key functions: their signature is checked when the class is defined, and a ``KeyError`` in
one names the arguments it did receive."""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app import Step, Success, with_lock, with_semaphore
from reactor_app.dsl.declarations import LockDeclaration
from reactor_app.exceptions import CoordinationKeyError, DefinitionError


def test_a_key_function_taking_the_wrong_arguments_fails_at_definition() -> None:
    with pytest.raises(DefinitionError, match="must accept one argument"):

        @with_lock(lambda: "acct")  # type: ignore[arg-type,misc]
        class NoArgument(Step):
            def run(self, args: dict[str, Any], context: Any) -> Any:
                return Success(None)

    with pytest.raises(DefinitionError, match="must accept one argument"):

        @with_semaphore(lambda args, other: "pool", limit=2)  # type: ignore[arg-type,misc]
        class TwoArguments(Step):
            def run(self, args: dict[str, Any], context: Any) -> Any:
                return Success(None)


def test_flexible_signatures_are_accepted() -> None:
    @with_lock(lambda args, *rest, **options: "k")
    class Flexible(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success(None)

    assert Flexible.lock_config is not None


def test_a_key_error_lists_the_argument_names() -> None:
    declaration = LockDeclaration(key_fn=lambda args: f"acct:{args['acount_id']}")
    with pytest.raises(CoordinationKeyError) as raised:
        declaration.compute_key({"account_id": 1, "amount": 5}, reactor="shop.Pay", step="charge")
    message = raised.value.message
    assert "KeyError: 'acount_id'" in message
    assert "['account_id', 'amount']" in message
