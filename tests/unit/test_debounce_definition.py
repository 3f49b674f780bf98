"""``with_debounce`` fails at definition time with a message that says what to change."""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app import Reactor, Step, Success, from_input, step, with_debounce
from reactor_app.exceptions import DefinitionError


class Noop(Step):
    inputs = ("account_id",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(None)


def test_with_debounce_applies_to_reactors_only() -> None:
    with pytest.raises(DefinitionError, match="applies to Reactor subclasses"):
        with_debounce(lambda args: "k", seconds=1)(Noop)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"seconds": 0}, "seconds"),
        ({"seconds": -1}, "seconds"),
        ({"seconds": True}, "seconds"),
        ({"seconds": 1, "max_wait": 0}, "max_wait"),
    ],
)
def test_bad_debounce_options_name_the_option(options: dict[str, Any], message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        with_debounce(lambda args: "k", **options)


def test_the_key_must_be_a_function() -> None:
    with pytest.raises(DefinitionError, match="key function"):
        with_debounce("recompute", seconds=1)  # type: ignore[arg-type]


def test_a_debounced_reactor_records_its_declaration() -> None:
    @with_debounce(lambda args: f"acct:{args['account_id']}", seconds=2, max_wait=10)
    class Debounced(Reactor):
        inputs = ("account_id",)

        noop = step(Noop, account_id=from_input("account_id"))

    declaration = Debounced.debounce_config
    assert declaration is not None
    assert (declaration.seconds, declaration.max_wait) == (2.0, 10.0)
    assert declaration.compute_key({"account_id": 3}, reactor="r", step=None) == "acct:3"
