"""Checks used by two callers each answer alike wherever they fire.

Each check below lives in one place (``dsl.step.declared_inputs``, the child-arguments check
of ``dsl.kinds``, the ``over`` errors of ``engine.mapping.run_map``) and has two callers; these
tests pin both callers to the same wording, option and fields.
"""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app import (
    Reactor,
    Step,
    Success,
    async_reactor,
    compose,
    from_input,
    map_step,
    step,
    value,
)
from reactor_app.exceptions import ArgumentResolutionError, DefinitionError


class Echo(Step):
    inputs = ("name",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(args["name"])


class EchoChild(Reactor):
    inputs = ("name",)

    echo = step(Echo, name=from_input("name"))


class EchoEach(Reactor):
    inputs = ("items",)

    each = map_step(Echo, over=from_input("items", "names"), name=value("x"))


@pytest.mark.parametrize("base", [Step, Reactor])
def test_inputs_given_as_a_string_fail_alike_on_steps_and_reactors(base: type) -> None:
    with pytest.raises(DefinitionError) as raised:
        type("Stringly", (base,), {"inputs": "account_id"})
    assert str(raised.value).startswith(
        "Stringly.inputs must be a tuple of names, e.g. ('account_id',), "
        "not the string 'account_id'"
    )
    assert raised.value.option == "inputs"


@pytest.mark.parametrize("base", [Step, Reactor])
def test_inputs_become_a_tuple_on_steps_and_reactors(base: type) -> None:
    cls = type("Listed", (base,), {"inputs": ["a", "b"]})
    assert cls.inputs == ("a", "b")


@pytest.mark.parametrize("kind", [compose, async_reactor])
def test_child_arguments_must_be_the_child_inputs_for_compose_and_async_reactor(
    kind: Any,
) -> None:
    with pytest.raises(DefinitionError) as raised:
        type("Parent", (Reactor,), {"child": kind(EchoChild, bogus=value(1))})
    assert str(raised.value).startswith(
        "Parent.child: EchoChild has inputs ('name',) but is given ['bogus']"
    )
    assert raised.value.option == "bogus"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("items", "problem"),
    [
        ({"other": 1}, ": "),  # the path does not lead anywhere
        ({"names": 3}, " must be a list, got int"),
    ],
)
def test_map_over_errors_name_the_argument_and_its_source(items: Any, problem: str) -> None:
    result = EchoEach.run(items=items)
    error = result.error
    assert isinstance(error, ArgumentResolutionError)
    over = "from_input('items', 'names')"
    assert str(error).startswith(f"map_step 'each' of {EchoEach.path()}: over={over}{problem}")
    assert (error.step, error.argument, error.source) == ("each", "over", over)


@pytest.mark.parametrize("name", ["priority", "idempotency_key", "debounce"])
def test_an_input_named_like_a_run_option_fails_at_definition(name: str) -> None:
    # run(priority=...) and run_async(...) take these themselves: such an input could never
    # be given, and a caller's value would silently become the option
    with pytest.raises(DefinitionError, match=f"names '{name}', which run\\(\\) and run_async"):
        type("Ticket", (Reactor,), {"inputs": ("ticket", name)})
