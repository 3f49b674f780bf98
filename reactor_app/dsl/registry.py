"""The registry of reactor classes by dotted path, so workers can find a reactor by name."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from reactor_app.exceptions import ConfigurationError

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor

_reactors: dict[str, type[Reactor]] = {}


def path_of(reactor: type[Reactor]) -> str:
    return f"{reactor.__module__}.{reactor.__qualname__}"


def register(reactor: type[Reactor]) -> None:
    _reactors[path_of(reactor)] = reactor


def lookup(path: str) -> type[Reactor]:
    """The reactor class at ``path``, importing its module when it is not loaded yet."""
    if path in _reactors:
        return _reactors[path]
    module_name, _, qualname = path.rpartition(".")
    while module_name:
        try:
            importlib.import_module(module_name)
            break
        except ImportError:
            module_name, _, head = module_name.rpartition(".")
            qualname = f"{head}.{qualname}"
    if path in _reactors:
        return _reactors[path]
    raise ConfigurationError(f"no reactor is registered under {path!r}", setting=path)


def all_reactors() -> dict[str, type[Reactor]]:
    return dict(_reactors)
