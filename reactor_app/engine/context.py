"""The held-key registry of an execution tree and the context handed to step code.

``HeldKeys`` is the registry of keys an execution tree holds (shared by a root and its composed
children). ``StepContext`` is the ``context`` argument of step bodies. What the engine persists
in ``Execution.context`` is ``engine.state``'s (re-exported here, where it used to live).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reactor_app.engine.cancel_flag import raise_if_cancelled
from reactor_app.engine.state import KEPT_HOLDS as KEPT_HOLDS
from reactor_app.engine.state import CompletedStep as CompletedStep
from reactor_app.engine.state import ExecutionState as ExecutionState
from reactor_app.serialization import to_json as to_json  # re-exported for the engine

if TYPE_CHECKING:
    from reactor_app.coordination.registry import HoldRegistry
    from reactor_app.dsl.reactor import Reactor
    from reactor_app.engine.gate import Gate


class HeldKeys:
    """The keys one execution tree holds: ``(primitive, key) -> nesting count and steps``.

    On a worker it is mirrored in Redis (``registry``, see ``coordination.registry``): keys
    are announced before they are asked for and withdrawn once fully given back, so the
    delivery that takes over after a crash frees exactly what this one held.
    """

    def __init__(self, registry: HoldRegistry | None = None) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str], dict[str, Any]] = {}
        self.registry = registry

    def announce(self, pairs: Sequence[tuple[str, str]], step: str | None) -> None:
        """Before an admission: write the pairs not held yet ahead into the registry."""
        if self.registry is None:
            return
        with self._lock:
            new = [pair for pair in pairs if pair not in self._held]
        self.registry.announce(new, step)

    def settle(self, pairs: Sequence[tuple[str, str]]) -> None:
        """After a refused (or failed) admission: withdraw the announced pairs not held."""
        if self.registry is None:
            return
        with self._lock:
            gone = [pair for pair in pairs if pair not in self._held]
        self.registry.withdraw(gone)

    def push(self, primitive: str, key: str, step: str | None, limit: int | None = None) -> None:
        with self._lock:
            entry = self._held.setdefault(
                (primitive, key), {"count": 0, "steps": [], "limit": limit}
            )
            entry["count"] += 1
            entry["steps"].append(step)

    def pop(self, primitive: str, key: str, *, still_held: bool = False) -> None:
        """One nesting level given back. ``still_held``: the hold stays taken in Redis
        although this delivery lets go of it (kept across a park), so it stays announced."""
        freed = False
        with self._lock:
            entry = self._held.get((primitive, key))
            if entry is None:
                return
            entry["count"] -= 1
            if entry["steps"]:
                entry["steps"].pop()
            if entry["count"] <= 0:
                del self._held[(primitive, key)]
                freed = True
        if freed and not still_held and self.registry is not None:
            self.registry.withdraw([(primitive, key)])

    def holds(self, primitive: str, key: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self._held.get((primitive, key))
            return dict(entry) if entry else None

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {"primitive": p, "key": k, "count": e["count"], "steps": list(e["steps"])}
                for (p, k), e in self._held.items()
            ]


@dataclass
class StepContext:
    """The ``context`` argument of ``run`` / ``compensate`` / ``undo``."""

    execution_id: str | None
    root_execution_id: str | None
    step_name: str | None
    attempt: int
    reactor: type[Reactor] | None
    reactor_instance: Any
    inputs: dict[str, Any]
    owner: str
    gates: list[Gate] = field(default_factory=list)  # innermost last
    held_keys: HeldKeys | None = None
    lease_lost: list[BaseException] = field(default_factory=list)

    def fencing_token(self, key: str | None = None) -> int | None:
        """Fencing token of the innermost lock covering this work (or of the lock on ``key``)."""
        for gate in reversed(self.gates):
            token = gate.token_for(key)
            if token is not None:
                return token
        return None

    def checkpoint(self) -> None:
        """Raise ``LeaseLost`` if a lease covering this work — the step's own or an enclosing
        reactor's — could not be renewed, or has run out by the local monotonic clock (a
        process paused longer than its lease knows it on waking), and ``ExecutionCancelled`` if
        the execution was cancelled (the step fails without retry and the execution rolls back
        and ends ``cancelled``). The engine also checks after every body."""
        self.check_leases()
        if self.execution_id is not None:
            # an operator's cancel (engine.cancel), from any process: stop the body here
            raise_if_cancelled(
                self.root_execution_id,
                self.execution_id,
                reactor=self.reactor.path() if self.reactor else None,
                step=self.step_name,
            )

    def check_leases(self) -> None:
        """``checkpoint()`` without the cancel read: after a body whose release reads the
        cancel request in its own round trip (``engine.runner``)."""
        if self.lease_lost:
            raise self.lease_lost[0]
        for gate in reversed(self.gates):
            if gate.lost:
                raise gate.lost[0]
            if gate.keep_alive is not None:
                gate.keep_alive.raise_if_lost()  # the clock check; records lease_lost once
