"""``with_semaphore(fair_by=...)`` at definition time and when its group is computed."""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app import Step, Success, with_semaphore
from reactor_app.coordination.claims import SemaphoreClaim
from reactor_app.dsl.declarations import SemaphoreDeclaration
from reactor_app.exceptions import CoordinationKeyError, DefinitionError


def _declaration(target: Any) -> SemaphoreDeclaration:
    found = [d for d in target.coordination_declarations() if isinstance(d, SemaphoreDeclaration)]
    assert len(found) == 1
    return found[0]


def test_fair_by_that_is_not_a_function_is_refused_at_import() -> None:
    with pytest.raises(DefinitionError, match="fair_by must be a function") as raised:
        with_semaphore(lambda a: "pool", limit=2, fair_by="tenant")
    assert raised.value.option == "fair_by"


def test_fair_by_taking_the_wrong_arguments_is_refused_at_import() -> None:
    with pytest.raises(DefinitionError, match="must accept one argument"):
        with_semaphore(lambda a: "pool", limit=2, fair_by=lambda a, b: a)


@with_semaphore(lambda a: "pool", limit=2, fair_by=lambda a: a["tenant"])
class Shared(Step):
    inputs = ("tenant",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(None)


def test_the_group_travels_with_the_claim() -> None:
    declaration = _declaration(Shared)
    claim = declaration.claim("pool", args={"tenant": "acme"}, reactor="r", step="s")
    assert claim == SemaphoreClaim("pool", limit=2, ttl=60.0, fair="acme")
    assert declaration.options()["fair_by"].startswith("computed")


def test_a_fair_by_that_raises_names_itself_and_the_arguments() -> None:
    declaration = _declaration(Shared)
    with pytest.raises(CoordinationKeyError, match="semaphore fair_by function") as raised:
        declaration.claim("pool", args={"tenent": "acme"}, reactor="r", step="s")
    assert "tenent" in raised.value.message


def test_a_semaphore_without_fair_by_sends_no_group() -> None:
    plain = SemaphoreDeclaration(key_fn=lambda a: "pool", limit=2)
    assert plain.claim("pool", args={}) == SemaphoreClaim("pool", limit=2, ttl=60.0)
