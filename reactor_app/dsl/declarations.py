"""Coordination declarations: what a unit of work declares about when it may run.

A declaration is definition-time data, recorded by the ``with_*`` decorators
(``dsl.coordination``) on a step class, a reactor class or an inline step;
``Declaration.claim(key)`` turns it into the runtime ``Claim`` the coordination layer admits.
``Coordinated`` is the introspection ``Step`` and ``Reactor`` classes share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from reactor_app.coordination import live_limits, primitives
from reactor_app.coordination.claims import (
    Claim,
    LockClaim,
    OrderedLockClaim,
    OrderedPosition,
    PeriodClaim,
    RateLimitClaim,
    RateWindow,
    SemaphoreClaim,
)
from reactor_app.coordination.keys import user_key_problem
from reactor_app.coordination.rate_limit import named_windows
from reactor_app.exceptions import CoordinationKeyError, RateLimitCostError, location

KeyFunction = Callable[[Mapping[str, Any]], Any]
#: a weighted rate limit's cost: a constant, or computed from the arguments (inputs)
CostFunction = Callable[[Mapping[str, Any]], Any]

#: attribute under which declarations travel on functions, step classes and reactor classes
DECLARATIONS_ATTR = "__reactor_coordination__"

#: every primitive, in admission order (coordination.primitives is the one registry)
PRIMITIVES = primitives.NAMES
#: primitives re-taken for compensate/undo (docs/design.md §2.5): the owned holds — exclusion
#: only, never quotas
ROLLBACK_PRIMITIVES = primitives.HOLDING


#: ``on_contention`` strategies per primitive, default first (``engine.contention`` carries
#: them out); a semaphore has no one holder to cancel
CONTENTION_STRATEGIES: dict[str, tuple[str, ...]] = {
    "lock": ("queue", "skip", "cancel_newest", "cancel_in_progress"),
    "semaphore": ("queue", "skip", "cancel_newest"),
}


@dataclass(frozen=True)
class Declaration:
    """What a unit of work declares about when it may run (one primitive)."""

    primitive: ClassVar[str] = ""
    key_fn: KeyFunction | None

    def compute_key(self, args: Mapping[str, Any], *, reactor: str | None, step: str | None) -> str:
        """Call the key function; a raise or an empty key is a ``CoordinationKeyError``."""
        return self._call_key_function(self.key_fn, "key", args, reactor=reactor, step=step)

    def _call_key_function(
        self,
        key_fn: KeyFunction | None,
        what: str,
        args: Mapping[str, Any],
        *,
        reactor: str | None,
        step: str | None,
    ) -> str:
        """Call ``key_fn`` (the key function, or another one of its kind: ``fair_by``)."""
        where = location(reactor, step)
        if key_fn is None:
            raise CoordinationKeyError(
                f"{self.primitive} of {where} has no {what} function",
                reactor=reactor,
                step=step,
                primitive=self.primitive,
            )
        try:
            key = key_fn(args)
        except Exception as exc:
            # A KeyError is nearly always a misspelt name: say which names there are.
            known = f" (it receives {sorted(args)})" if isinstance(exc, KeyError) else ""
            raise CoordinationKeyError(
                f"the {self.primitive} {what} function of {where} raised "
                f"{type(exc).__name__}: {exc}{known}; the work did not run",
                reactor=reactor,
                step=step,
                primitive=self.primitive,
                cause=exc,
            ) from exc
        if key is None or (isinstance(key, str) and not key.strip()):
            raise CoordinationKeyError(
                f"the {self.primitive} {what} function of {where} returned {key!r}; return a "
                'non-empty string that identifies what to coordinate on (e.g. f"acct:{...}")',
                reactor=reactor,
                step=step,
                primitive=self.primitive,
                cause=f"returned {key!r}",
            )
        text = str(key)
        problem = user_key_problem(text)
        if problem is not None:
            raise CoordinationKeyError(
                f"the {self.primitive} {what} function of {where} returned a key that {problem}; "
                "the work did not run",
                reactor=reactor,
                step=step,
                primitive=self.primitive,
                cause=f"returned {text[:80]!r}",
            )
        return text

    def claim(self, key: str, position: OrderedPosition | None = None) -> Claim:
        raise NotImplementedError

    def wait_seconds(self) -> float:
        """How long a synchronous caller waits for this primitive before failing."""
        return 0.0

    def options(self) -> dict[str, Any]:
        """The declaration's options, for introspection, the admin and the docs."""
        data = {k: v for k, v in self.__dict__.items() if k != "key_fn"}
        return {"primitive": self.primitive, **data}


@dataclass(frozen=True)
class LockDeclaration(Declaration):
    primitive: ClassVar[str] = "lock"
    ttl: float = 60.0
    wait: float = 0.0
    auto_extend: bool = True
    rollback_wait: float | None = None
    on_contention: str = "queue"

    def claim(self, key: str, position: OrderedPosition | None = None) -> Claim:
        return LockClaim(key=key, ttl=self.ttl, auto_extend=self.auto_extend)

    def wait_seconds(self) -> float:
        return self.wait

    @property
    def effective_rollback_wait(self) -> float:
        return self.ttl if self.rollback_wait is None else self.rollback_wait


@dataclass(frozen=True)
class SemaphoreDeclaration(Declaration):
    primitive: ClassVar[str] = "semaphore"
    #: a number, or the name of a limit in ``REACTOR_LIMITS`` (overridable live)
    limit: int | str = 1
    wait: float = 0.0
    ttl: float = 60.0
    rollback_wait: float = 60.0
    on_contention: str = "queue"
    #: the waiter's group for fair sharing (round-robin across groups), from the arguments
    fair_by: KeyFunction | None = None

    def claim(
        self,
        key: str,
        position: OrderedPosition | None = None,
        *,
        args: Mapping[str, Any] | None = None,
        reactor: str | None = None,
        step: str | None = None,
    ) -> Claim:
        """The claim for ``key``; with ``fair_by``, its group is computed from ``args``; a named
        limit (``REACTOR_LIMITS``) is resolved to its effective value now, and again at every
        admission (``limit_name``)."""
        fair = None
        if self.fair_by is not None:
            fair = self._call_key_function(
                self.fair_by, "fair_by", args or {}, reactor=reactor, step=step
            )
        if isinstance(self.limit, str):
            return SemaphoreClaim(
                key=key,
                limit=self.effective_limit(),
                ttl=self.ttl,
                limit_name=self.limit,
                fair=fair,
            )
        return SemaphoreClaim(key=key, limit=self.limit, ttl=self.ttl, fair=fair)

    def options(self) -> dict[str, Any]:
        data = super().options()
        if self.fair_by is not None:
            data["fair_by"] = f"computed ({getattr(self.fair_by, '__name__', 'function')})"
        return data

    def effective_limit(self) -> int:
        """The limit now: a named one from its live override or settings (read at each
        admission as well, ``coordination.live_limits``), else as declared."""
        if isinstance(self.limit, str):
            return live_limits.semaphore_limit(self.limit)
        return self.limit

    def wait_seconds(self) -> float:
        return self.wait

    @property
    def effective_rollback_wait(self) -> float:
        return self.rollback_wait


@dataclass(frozen=True)
class RateLimitDeclaration(Declaration):
    primitive: ClassVar[str] = "rate_limit"
    name: str | None = None  # a named limit from REACTOR_RATE_LIMITS
    windows: tuple[RateWindow, ...] = ()
    strategy: str = "sliding"
    wait: float = 0.0
    #: units charged per admission: a positive int, or a function of the arguments (inputs)
    cost: int | CostFunction = 1

    def wait_seconds(self) -> float:
        # In-process only: the caller sleeps until the window frees (the refusal's exact
        # retry_after), up to ``wait``; a worker parks instead.
        return self.wait

    def options(self) -> dict[str, Any]:
        data = super().options()
        if callable(self.cost):
            data["cost"] = f"computed ({getattr(self.cost, '__name__', 'function')})"
        return data

    def compute_cost(
        self,
        args: Mapping[str, Any],
        windows: tuple[RateWindow, ...],
        *,
        key: str,
        reactor: str | None,
        step: str | None,
    ) -> int:
        """The cost of this admission, checked against every window's budget.

        A cost no window could ever admit is an error now, not a park that never ends; like a
        bad key, it fails the work before anything is taken (``RateLimitCostError``)."""
        where = location(reactor, step)
        common = {"reactor": reactor, "step": step, "key": key, "primitive": self.primitive}
        cost: Any = self.cost
        if callable(cost):
            try:
                cost = cost(args)
            except Exception as exc:
                known = f" (it receives {sorted(args)})" if isinstance(exc, KeyError) else ""
                raise RateLimitCostError(
                    f"the rate-limit cost function of {where} raised "
                    f"{type(exc).__name__}: {exc}{known}; the work did not run",
                    cause=exc,
                    **common,
                ) from exc
        if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
            raise RateLimitCostError(
                f"the rate-limit cost of {where} must be a positive integer, got {cost!r}; "
                "the work did not run",
                cause=f"cost {cost!r}",
                cost=cost if isinstance(cost, (int, float)) else repr(cost),
                **common,
            )
        for window in windows:
            if cost > window.limit:
                raise RateLimitCostError(
                    f"{where}: rate limit {key!r} allows {window.limit} per {window.label}, "
                    f"so a cost of {cost} could never be admitted; the work did not run",
                    cause="cost above the window's limit",
                    cost=cost,
                    limit=window.limit,
                    period=window.label,
                    **common,
                )
        return int(cost)

    def compute_key(self, args: Mapping[str, Any], *, reactor: str | None, step: str | None) -> str:
        if self.name is not None:
            return self.name  # a named limit is one global budget
        return super().compute_key(args, reactor=reactor, step=step)

    def resolved_windows(self) -> tuple[RateWindow, ...]:
        """The windows, reading a named limit from settings now (so settings can change)."""
        if self.name is None:
            return self.windows
        return named_windows(self.name)

    def claim(
        self,
        key: str,
        position: OrderedPosition | None = None,
        *,
        args: Mapping[str, Any] | None = None,
        reactor: str | None = None,
        step: str | None = None,
    ) -> Claim:
        """The claim for ``key``; ``args`` are needed when the cost is computed from them."""
        windows = self.resolved_windows()
        cost = 1
        if self.cost != 1:
            cost = self.compute_cost(args or {}, windows, key=key, reactor=reactor, step=step)
        return RateLimitClaim(
            key=key,
            windows=windows,
            strategy="fixed" if self.strategy == "fixed" else "sliding",
            cost=cost,
            limit_name=self.name,
        )


@dataclass(frozen=True)
class PeriodDeclaration(Declaration):
    primitive: ClassVar[str] = "period"
    every: str | int = "hour"
    ttl: float = 60.0
    wait: float | None = None

    def claim(self, key: str, position: OrderedPosition | None = None) -> Claim:
        return PeriodClaim(key=key, every=self.every, ttl=self.ttl)

    def wait_seconds(self) -> float:
        # Waiting one lease is enough to see the other run end or its dead holder's
        # reservation lapse; a live run longer than that is reported, not waited out.
        return self.ttl if self.wait is None else self.wait


@dataclass(frozen=True)
class DebounceDeclaration(Declaration):
    """``with_debounce``: starts of the reactor with one key within ``seconds`` of each other
    become one run, of the last start's inputs, once they settle (``engine.debounce``). Not a
    coordination primitive: it decides when a run starts, never what it may hold."""

    primitive: ClassVar[str] = "debounce"
    seconds: float = 1.0
    max_wait: float | None = None


@dataclass(frozen=True)
class OrderedLockDeclaration(Declaration):
    primitive: ClassVar[str] = "ordered_lock"
    ttl: float = 86400.0
    poison_pill_timeout: float = 600.0
    strict: bool = True
    wait: float | None = None

    def claim(self, key: str, position: OrderedPosition | None = None) -> Claim:
        if position is None:
            raise ValueError("an ordered-lock claim needs the position assigned to this execution")
        return OrderedLockClaim(
            key=key,
            position=position,
            ttl=self.ttl,
            poison_pill_timeout=self.poison_pill_timeout,
            strict=self.strict,
        )

    def wait_seconds(self) -> float:
        # A synchronous caller waits its turn; after poison_pill_timeout a dead head is
        # passed over, so waiting longer than that by default would only hide a stuck line.
        return self.poison_pill_timeout if self.wait is None else self.wait


@dataclass
class DeclarationSet:
    """The declarations of one unit of work, keyed by primitive, in admission order."""

    by_primitive: dict[str, Declaration] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.by_primitive)

    def ordered(self) -> list[Declaration]:
        return [self.by_primitive[p] for p in PRIMITIVES if p in self.by_primitive]

    def for_rollback(self) -> list[Declaration]:
        """What compensate and undo re-take: the owned holds, always queueing for them (an
        undo must run; ``on_contention`` decides only whether the work itself starts)."""
        return [
            replace(declaration, on_contention="queue")  # type: ignore[call-arg]
            if getattr(declaration, "on_contention", "queue") != "queue"
            else declaration
            for declaration in (
                self.by_primitive[p] for p in ROLLBACK_PRIMITIVES if p in self.by_primitive
            )
        ]

    def with_(self, declaration: Declaration) -> DeclarationSet:
        return DeclarationSet({**self.by_primitive, declaration.primitive: declaration})

    def merged(self, other: DeclarationSet) -> DeclarationSet:
        return DeclarationSet({**self.by_primitive, **other.by_primitive})

    def wait_seconds(self) -> float:
        return max((d.wait_seconds() for d in self.by_primitive.values()), default=0.0)


def record_on_class(declaration: Declaration, target: type[Coordinated]) -> None:
    """Record ``declaration`` on a step or reactor class."""
    current: DeclarationSet = getattr(target, DECLARATIONS_ATTR, DeclarationSet())
    # Assign on the class itself: subclasses inherit it, and a redeclaration in a subclass
    # replaces only that primitive.
    setattr(target, DECLARATIONS_ATTR, current.with_(declaration))
    setattr(target, f"{declaration.primitive}_config", declaration)


class Coordinated:
    """Introspection shared by ``Step`` and ``Reactor`` classes."""

    lock_config: ClassVar[LockDeclaration | None] = None
    semaphore_config: ClassVar[SemaphoreDeclaration | None] = None
    rate_limit_config: ClassVar[RateLimitDeclaration | None] = None
    period_config: ClassVar[PeriodDeclaration | None] = None
    ordered_lock_config: ClassVar[OrderedLockDeclaration | None] = None
    #: reactors only (``with_debounce``)
    debounce_config: ClassVar[DebounceDeclaration | None] = None

    @classmethod
    def declarations(cls) -> DeclarationSet:
        return getattr(cls, DECLARATIONS_ATTR, None) or DeclarationSet()

    @classmethod
    def declares_coordination(cls) -> bool:
        return bool(cls.declarations())

    @classmethod
    def coordination_declarations(cls) -> list[Declaration]:
        return cls.declarations().ordered()
