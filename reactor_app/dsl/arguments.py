"""Argument sources: where a step's arguments come from.

``from_input`` reads the reactor's inputs, ``from_result`` another step's result (which also
makes that step a dependency), ``value`` a constant and ``element`` the current element of a
``map_step``. All but ``value`` take an optional dotted path into the value they read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_MISSING = object()


@dataclass(frozen=True)
class Scope:
    """What argument sources read from while a step's arguments are resolved."""

    inputs: Mapping[str, Any]
    results: Mapping[str, Any]
    element: Any = _MISSING


class PathError(LookupError):
    """A dotted path did not lead anywhere."""


def follow(value: Any, path: str | None) -> Any:
    """Follow a dotted path through mappings, sequences (by index) and attributes."""
    if not path:
        return value
    current = value
    for part in path.split("."):
        if isinstance(current, Mapping):
            if part not in current:
                raise PathError(f"no key {part!r} in path {path!r}")
            current = current[part]
        elif isinstance(current, Sequence) and not isinstance(current, str) and part.isdigit():
            try:
                current = current[int(part)]
            except IndexError as exc:
                raise PathError(f"index {part} out of range in path {path!r}") from exc
        elif hasattr(current, part):
            current = getattr(current, part)
        else:
            raise PathError(f"cannot read {part!r} of a {type(current).__name__} (path {path!r})")
    return current


class Source:
    """Base of every argument source."""

    def resolve(self, scope: Scope) -> Any:
        raise NotImplementedError

    def step_dependency(self) -> str | None:
        """The step whose result this source reads, if any."""
        return None

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class FromInput(Source):
    name: str
    path: str | None = None

    def resolve(self, scope: Scope) -> Any:
        if self.name not in scope.inputs:
            raise PathError(f"input {self.name!r} was not given")
        return follow(scope.inputs[self.name], self.path)

    def describe(self) -> str:
        return f"from_input({self.name!r}{f', {self.path!r}' if self.path else ''})"


@dataclass(frozen=True)
class FromResult(Source):
    step: str
    path: str | None = None

    def resolve(self, scope: Scope) -> Any:
        if self.step not in scope.results:
            raise PathError(f"step {self.step!r} has no result yet")
        return follow(scope.results[self.step], self.path)

    def step_dependency(self) -> str | None:
        return self.step

    def describe(self) -> str:
        return f"from_result({self.step!r}{f', {self.path!r}' if self.path else ''})"


@dataclass(frozen=True)
class Value(Source):
    constant: Any

    def resolve(self, scope: Scope) -> Any:
        return self.constant

    def describe(self) -> str:
        return f"value({self.constant!r})"


@dataclass(frozen=True)
class Element(Source):
    path: str | None = None

    def resolve(self, scope: Scope) -> Any:
        if scope.element is _MISSING:
            raise PathError("element() is only available inside map_step")
        return follow(scope.element, self.path)

    def describe(self) -> str:
        return f"element({self.path!r})" if self.path else "element()"


def from_input(name: str, path: str | None = None) -> FromInput:
    """The reactor input ``name`` (optionally a dotted path inside it)."""
    return FromInput(name, path)


def from_result(step: str, path: str | None = None) -> FromResult:
    """The result of step ``step`` (optionally a dotted path inside it); a dependency."""
    return FromResult(step, path)


def value(constant: Any) -> Value:
    """A constant argument."""
    return Value(constant)


def element(path: str | None = None) -> Element:
    """The current element of the enclosing ``map_step`` (optionally a dotted path inside it)."""
    return Element(path)
