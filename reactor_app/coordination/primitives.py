"""The coordination primitives behind one interface, and the one registry of them.

A primitive is one Python module here (``lock``, ``semaphore``, ``rate_limit``, ``period``,
``ordered_lock``) plus its part of the Lua scripts (``lua/``). The module provides what
``Primitive`` lists — its name, the flags that set it apart (``HOLDS``, ``HINTED``,
``UNCAPPED_WAITS``, ``CHARGES``), how its claims and holds become script keys and arguments, and
how an operator sees one of its keys (``inspect``, ``summary``, ``attributed``). When its leases
are renewed while the work runs it also provides what ``Renewable`` adds, and when its admission
is an owned hold (``HOLDS``) what ``Holding`` adds (its holders, the claim standing for a hold
known by its key, the live-holds index reads, force release). Mypy checks each module against
these protocols where the registry below is built, so a new primitive is one module (plus its
Lua) and one line here; every list of primitive names elsewhere derives from the registry and
the flags, and callers ask the module (``get(name)``, ``holding(name)``) rather than test names.
"""

from __future__ import annotations

from typing import Any, Protocol

from reactor_app.coordination import lock, ordered_lock, period, rate_limit, semaphore
from reactor_app.coordination.claims import ADMISSION_ORDER, Claim, Hold


class Primitive(Protocol):
    """What every primitive module provides."""

    #: the name claims, declarations, events and the operator views use
    PRIMITIVE: str
    #: True when an admission is an owned hold until its release (a lock, a semaphore slot):
    #: such holds are attributed to their step in the live-holds index and in a worker's
    #: held-key registry, kept across a park, re-taken for compensate and undo, and can be
    #: force-released. False for gates and quotas (an ordered position, a period bucket, a
    #: rate-limit charge). A holding module satisfies ``Holding`` too.
    HOLDS: bool
    #: True when a refusal's ``retry_after`` says when to come back (a window's exact end, the
    #: line's turn), so a parked worker is requeued then; False when it is only the holder's
    #: lease, an upper bound, and the contention backoff is used instead
    HINTED: bool
    #: True when parked waits on it are not capped by ``REACTOR_CONTENTION_CEILING`` (only by
    #: the optional ``REACTOR_ORDERED_WAIT_CEILING``): a line that moves on its own
    UNCAPPED_WAITS: bool
    #: True when an admission spends budget that is never given back (a rate-limit charge): a
    #: continuation of a run already admitted is not charged again, and since no release
    #: frees it, a refusal clears only with time (at ``retry_after``), so waiting longer than
    #: the wait budget is useless
    CHARGES: bool

    def admit_keys(self, claim: Any, prefix: str) -> list[str]: ...

    def admit_spec(self, claim: Any) -> dict[str, Any]: ...

    def release_keys(self, claim: Any, prefix: str) -> list[str]: ...

    def release_spec(self, hold: Hold) -> dict[str, Any]: ...

    def wake_channel(self, claim: Any, prefix: str) -> str | None: ...

    def claim_waiters_key(self, claim: Any, prefix: str) -> str | None: ...

    # -- the operator's view of one key (``operator.live.inspect_key``, the admin) ----------

    def inspect(
        self,
        user_key: str,
        *,
        limit: int | None = None,
        client: Any = None,
        prefix: str | None = None,
    ) -> dict[str, Any]:
        """The live state of ``user_key``: the entries an ``inspect_key`` report adds to
        ``{"primitive", "key"}`` (``limit``: a semaphore's, for availability)."""
        ...

    def summary(self, report: dict[str, Any]) -> str:
        """One line describing a report of ``inspect`` (the admin's recent-keys table)."""
        ...

    def attributed(self, report: dict[str, Any]) -> list[dict[str, Any]]:
        """The entries of a report that the admin links to their execution's page (each names
        an ``execution``)."""
        ...


class Renewable(Primitive, Protocol):
    """A primitive whose leases the keep-alive thread renews while the work runs."""

    def extend_keys(self, claim: Any, prefix: str) -> list[str]: ...

    def extend_spec(self, hold: Hold, owner: str) -> dict[str, Any]: ...


class Holding(Renewable, Protocol):
    """A primitive whose admission is an owned hold (``HOLDS``): a lock, a semaphore slot."""

    #: what one hold is called in messages ("lock", "semaphore lease")
    HOLD_NOUN: str
    #: how a message says that nothing holds a key
    NONE_HELD: str

    def holders(
        self, user_key: str, *, client: Any = None, prefix: str | None = None
    ) -> dict[str, dict[str, Any]]:
        """``owner -> {step, execution, reactor, token, count}`` of the live holds of
        ``user_key`` (one round trip)."""
        ...

    def hold_claim(self, user_key: str, limit: int | None = None) -> Claim:
        """A claim on ``user_key`` standing for a hold known only by its key (and, for a
        semaphore, its limit): one kept across a park, or one a cancelled run waited for."""
        ...

    def force_release_keys(self, user_key: str, prefix: str) -> list[str]:
        """The keys ``lua/force_release.lua`` takes (before the live-holds index keys)."""
        ...

    def live_key(self, user_key: str, prefix: str) -> str:
        """The key that shows whether an owner's hold is live (``lua/prune_holds.lua``)."""
        ...

    def index_read(self, pipe: Any, user_key: str, owner: str, prefix: str) -> None:
        """Queue on ``pipe`` the two reads ``index_row`` takes for an index entry."""
        ...

    def index_row(
        self, user_key: str, owner: str, first: Any, second: Any, now_ms: int
    ) -> dict[str, Any] | None:
        """The ``live_holds`` row of an index entry from the two reads of ``index_read``, or
        None when the hold is gone."""
        ...


_MODULES: tuple[Primitive, ...] = (ordered_lock, period, lock, semaphore, rate_limit)
_RENEWABLE: tuple[Renewable, ...] = (period, lock, semaphore)
_HOLDING: tuple[Holding, ...] = (lock, semaphore)

#: name -> module, in admission order (ordered gate, period check, lock, semaphore, charge)
REGISTRY: dict[str, Primitive] = {
    name: module for name in ADMISSION_ORDER for module in _MODULES if name == module.PRIMITIVE
}
#: the primitives whose leases are renewed (name -> module)
RENEWABLE: dict[str, Renewable] = {module.PRIMITIVE: module for module in _RENEWABLE}
#: the primitives whose admission is an owned hold (name -> module), in admission order
HOLDING_MODULES: dict[str, Holding] = {
    name: module for name in ADMISSION_ORDER for module in _HOLDING if name == module.PRIMITIVE
}
#: every primitive's name, in admission order
NAMES: tuple[str, ...] = tuple(REGISTRY)
#: the primitives whose admission is an owned hold (see ``Primitive.HOLDS``)
HOLDING: tuple[str, ...] = tuple(name for name, module in REGISTRY.items() if module.HOLDS)
#: the primitives whose refusal's ``retry_after`` is when to come back (``Primitive.HINTED``)
HINTED: tuple[str, ...] = tuple(name for name, module in REGISTRY.items() if module.HINTED)
#: the primitives whose parked waits the contention ceiling does not cap
UNCAPPED_WAITS: tuple[str, ...] = tuple(
    name for name, module in REGISTRY.items() if module.UNCAPPED_WAITS
)
#: the primitives whose admission spends budget never given back (``Primitive.CHARGES``)
CHARGING: tuple[str, ...] = tuple(name for name, module in REGISTRY.items() if module.CHARGES)


def get(name: str) -> Primitive:
    """The module of primitive ``name``."""
    return REGISTRY[name]


def holding(name: str) -> Holding:
    """The module of holding primitive ``name`` (``KeyError`` for one that holds nothing)."""
    return HOLDING_MODULES[name]


def holds(name: str) -> bool:
    """Whether an admission of ``name`` is an owned hold until released."""
    return name in HOLDING
