"""The registry of reactor classes by dotted path, so workers can find a reactor by name."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from reactor_app.exceptions import ReactorNotRegistered

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor

_reactors: dict[str, type[Reactor]] = {}
#: reactors built on first use, by path (``reactor_app.tasks_backend`` files one per task
#: function: its class can only be built once the function's module finished importing)
_factories: dict[str, Callable[[], type[Reactor]]] = {}
#: the base ``Reactor`` class itself (never registered: only its subclasses are reactors)
_base: type[Reactor] | None = None


def path_of(reactor: type[Reactor]) -> str:
    return f"{reactor.__module__}.{reactor.__qualname__}"


def register(reactor: type[Reactor]) -> None:
    _reactors[path_of(reactor)] = reactor


def register_factory(path: str, factory: Callable[[], type[Reactor]]) -> None:
    """File ``factory`` to build the reactor at ``path`` when it is first looked up (a factory
    filed again for the same path replaces the earlier one until the reactor is built)."""
    if path not in _reactors:
        _factories[path] = factory


def register_base(base: type[Reactor]) -> None:
    global _base
    _base = base


def is_base(reactor: type[Reactor]) -> bool:
    """Whether ``reactor`` is the base ``Reactor`` class: ``Reactor.resume(...)`` called on it
    resumes an execution of any reactor."""
    return reactor is _base


def is_reactor(target: object) -> bool:
    """Whether ``target`` is a reactor class (a subclass of the base ``Reactor``), for the
    modules ``dsl.reactor`` imports, which cannot import it back."""
    return isinstance(target, type) and _base is not None and issubclass(target, _base)


def lookup(path: str) -> type[Reactor]:
    """The reactor class at ``path``, importing its module when it is not loaded yet.

    Raises ``ReactorNotRegistered`` — saying whether the module failed to import, or imported
    without defining the class — when this process cannot find it.
    """
    if path in _reactors:
        return _reactors[path]
    if path in _factories:
        return _built(path)
    module_name, _, qualname = path.rpartition(".")
    import_error: BaseException | None = None
    while module_name:
        try:
            importlib.import_module(module_name)
            break
        except ImportError as exc:
            import_error = import_error or exc
            module_name, _, head = module_name.rpartition(".")
            qualname = f"{head}.{qualname}"
    if path in _reactors:
        return _reactors[path]
    if path in _factories:
        return _built(path)
    raise ReactorNotRegistered(
        _not_registered_message(path, import_error),
        setting=None,
        reactor=path,
        cause=f"{type(import_error).__name__}: {import_error}" if import_error else None,
    )


def _built(path: str) -> type[Reactor]:
    reactor = _factories.pop(path)()
    _reactors.setdefault(path, reactor)
    return _reactors[path]


def _not_registered_message(path: str, import_error: BaseException | None) -> str:
    # Worded for the operator reading the failed row: what is missing and the usual causes.
    if "<locals>" in path:
        reason = (
            "the class was defined inside a function, so no other process can import it; "
            "define reactors at module level (e.g. in an app's reactors.py)"
        )
    elif path.startswith(("__main__.", "__console__.")):
        reason = (
            "the class was defined in a script or an interactive shell, which workers do not "
            "import; define reactors in a module of an installed app (e.g. reactors.py)"
        )
    elif import_error is not None:
        reason = (
            f"importing its module failed ({type(import_error).__name__}: {import_error}); is "
            "this worker running the same code as the process that started the run?"
        )
    else:
        reason = (
            "its module imported but defines no such reactor; is this worker running the same "
            "code as the process that started the run (a stale deployment)?"
        )
    return f"the reactor {path!r} is not available in this process: {reason}"


def all_reactors() -> dict[str, type[Reactor]]:
    return dict(_reactors)
