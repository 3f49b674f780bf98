"""The coordination primitives behind one interface, and the one registry of them.

A primitive is one Python module here (``lock``, ``semaphore``, ``rate_limit``, ``period``,
``ordered_lock``) plus its part of the Lua scripts (``lua/``). The module provides what
``Primitive`` lists — its name, what sets it apart (``HOLDS``), and how its claims and holds
become script keys and arguments — and, when its leases are renewed while the work runs, what
``Renewable`` adds. Mypy checks each module against these protocols where the registry below
is built, so a new primitive is one module (plus its Lua) and one line here; every list of
primitive names elsewhere derives from the registry and the flags.
"""

from __future__ import annotations

from typing import Any, Protocol

from reactor_app.coordination import lock, ordered_lock, period, rate_limit, semaphore
from reactor_app.coordination.claims import ADMISSION_ORDER, Hold


class Primitive(Protocol):
    """What every primitive module provides."""

    #: the name claims, declarations, events and the operator views use
    PRIMITIVE: str
    #: True when an admission is an owned hold until its release (a lock, a semaphore slot):
    #: such holds are attributed to their step in the live-holds index and in a worker's
    #: held-key registry, kept across a park and re-taken for compensate and undo. False for
    #: gates and quotas (an ordered position, a period bucket, a rate-limit charge).
    HOLDS: bool

    def admit_keys(self, claim: Any, prefix: str) -> list[str]: ...

    def admit_spec(self, claim: Any) -> dict[str, Any]: ...

    def release_keys(self, claim: Any, prefix: str) -> list[str]: ...

    def release_spec(self, hold: Hold) -> dict[str, Any]: ...

    def wake_channel(self, claim: Any, prefix: str) -> str | None: ...

    def claim_waiters_key(self, claim: Any, prefix: str) -> str | None: ...


class Renewable(Primitive, Protocol):
    """A primitive whose leases the keep-alive thread renews while the work runs."""

    def extend_keys(self, claim: Any, prefix: str) -> list[str]: ...

    def extend_spec(self, hold: Hold, owner: str) -> dict[str, Any]: ...


_MODULES: tuple[Primitive, ...] = (ordered_lock, period, lock, semaphore, rate_limit)
_RENEWABLE: tuple[Renewable, ...] = (period, lock, semaphore)

#: name -> module, in admission order (ordered gate, period check, lock, semaphore, charge)
REGISTRY: dict[str, Primitive] = {
    name: module for name in ADMISSION_ORDER for module in _MODULES if name == module.PRIMITIVE
}
#: the primitives whose leases are renewed (name -> module)
RENEWABLE: dict[str, Renewable] = {module.PRIMITIVE: module for module in _RENEWABLE}
#: every primitive's name, in admission order
NAMES: tuple[str, ...] = tuple(REGISTRY)
#: the primitives whose admission is an owned hold (see ``Primitive.HOLDS``)
HOLDING: tuple[str, ...] = tuple(name for name, module in REGISTRY.items() if module.HOLDS)


def get(name: str) -> Primitive:
    """The module of primitive ``name``."""
    return REGISTRY[name]


def holds(name: str) -> bool:
    """Whether an admission of ``name`` is an owned hold until released."""
    return name in HOLDING
