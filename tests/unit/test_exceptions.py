"""The error tree: every structured field is declared, so reading one is type-checked."""

from __future__ import annotations

import typing

import pytest

from reactor_app import exceptions
from reactor_app.exceptions import CoordinationKeyError, ReactorError, StepFailed


def _error_classes() -> list[type[ReactorError]]:
    found: list[type[ReactorError]] = []
    pending: list[type[ReactorError]] = [ReactorError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return [cls for cls in found if cls.__module__ == exceptions.__name__]


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda cls: cls.__name__)
def test_every_field_is_declared(cls: type[ReactorError]) -> None:
    declared = typing.get_type_hints(cls, vars(exceptions))
    assert [name for name in cls.field_names if name not in declared] == []


def test_fill_location_names_only_fields_left_unset() -> None:
    unset = CoordinationKeyError("no key", reactor=None, step=None)
    unset.fill_location(reactor="app.R", step="charge")
    assert (unset.reactor, unset.step) == ("app.R", "charge")
    named = StepFailed("boom", reactor="app.Other", step="own")
    named.fill_location(reactor="app.R", step="charge")
    assert (named.reactor, named.step) == ("app.Other", "own")
    bare = ReactorError("no location fields")
    bare.fill_location(reactor="app.R", step="charge")
    assert not hasattr(bare, "step") and not hasattr(bare, "reactor")
