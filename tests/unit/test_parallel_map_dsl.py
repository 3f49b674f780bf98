"""``map_step(..., parallel=...)`` is checked where it is written (issue 17 item 3).

A wrong value, a reactor target (parallel maps fan out Steps only) and ``parallel=`` given to
a kind that has no such option all raise ``DefinitionError`` at import, naming the option.
"""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app import (
    Reactor,
    Step,
    Success,
    async_step,
    compose,
    element,
    from_input,
    map_step,
    step,
    value,
)
from reactor_app.dsl.kinds import MapSpec
from reactor_app.exceptions import DefinitionError


class Echo(Step):
    inputs = ("name",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(args["name"])


class Flagged(Step):
    inputs = ("name", "parallel")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success((args["name"], args["parallel"]))


class EchoChild(Reactor):
    inputs = ("name",)

    echo = step(Echo, name=from_input("name"))


def test_parallel_is_recorded_on_the_map_spec() -> None:
    spec = map_step(Echo, over=from_input("names"), parallel=True, name=element())
    assert isinstance(spec, MapSpec) and spec.parallel is True
    assert map_step(Echo, over=from_input("names"), name=element()).parallel is False


@pytest.mark.parametrize("wrong", ["yes", 1, None, 0.5])
def test_parallel_must_be_a_bool(wrong: Any) -> None:
    with pytest.raises(DefinitionError) as raised:
        map_step(Echo, over=from_input("names"), parallel=wrong, name=element())
    assert "map_step(parallel=...) must be True or False" in str(raised.value)
    assert raised.value.option == "parallel"


def test_parallel_map_of_a_reactor_is_refused_with_the_reason() -> None:
    with pytest.raises(DefinitionError) as raised:
        map_step(EchoChild, over=from_input("names"), parallel=True, name=element())
    message = str(raised.value)
    assert "map_step(EchoChild, parallel=True)" in message and "Step elements only" in message
    assert raised.value.option == "parallel"


@pytest.mark.parametrize(
    "kind", [lambda: step(Echo, parallel=True), lambda: async_step(Echo, parallel=True)]
)
def test_parallel_on_a_step_kind_names_map_step(kind: Any) -> None:
    with pytest.raises(DefinitionError) as raised:
        kind()
    assert "parallel=True is an option of map_step(...) only" in str(raised.value)
    assert raised.value.option == "parallel"


def test_parallel_on_compose_names_map_step() -> None:
    with pytest.raises(DefinitionError) as raised:
        compose(EchoChild, parallel=True)
    assert "an option of map_step(...) only" in str(raised.value)


@pytest.mark.django_db
def test_an_argument_named_parallel_is_passed_with_value() -> None:
    class MapsFlagged(Reactor):
        inputs = ("names",)

        each = map_step(Flagged, over=from_input("names"), name=element(), parallel=value("x"))

        returns = "each"

    spec = MapsFlagged.steps["each"]
    assert isinstance(spec, MapSpec) and spec.parallel is False
    assert set(spec.arguments) == {"name", "parallel"}
    result = MapsFlagged.run(names=["a", "b"])
    assert result.ok, result.error
    assert [tuple(v) for v in result.value] == [("a", "x"), ("b", "x")]
