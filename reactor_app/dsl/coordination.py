"""The five coordination decorators and the declarations they record.

The same decorators apply to ``Reactor`` subclasses (the key function receives the reactor's
inputs), to ``Step`` subclasses and to inline ``@step`` methods (the key function receives the
step's resolved, validated arguments). Options are validated here, when the class is created,
so a bad declaration fails at import with a message that says what to change.

A declaration is definition-time data; ``Declaration.claim(key)`` turns it into the runtime
``Claim`` the coordination layer admits.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from reactor_app.coordination import primitives
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
from reactor_app.exceptions import CoordinationKeyError, DefinitionError, RateLimitCostError

KeyFunction = Callable[[Mapping[str, Any]], Any]
#: a weighted rate limit's cost: a constant, or computed from the arguments (inputs)
CostFunction = Callable[[Mapping[str, Any]], Any]
T = TypeVar("T")

#: attribute under which declarations travel on functions, step classes and reactor classes
DECLARATIONS_ATTR = "__reactor_coordination__"

#: every primitive, in admission order (coordination.primitives is the one registry)
PRIMITIVES = primitives.NAMES
#: primitives re-taken for compensate/undo (docs/design.md §2.5): the owned holds — exclusion
#: only, never quotas
ROLLBACK_PRIMITIVES = primitives.HOLDING


@dataclass(frozen=True)
class Declaration:
    """What a unit of work declares about when it may run (one primitive)."""

    primitive: ClassVar[str] = ""
    key_fn: KeyFunction | None

    def compute_key(self, args: Mapping[str, Any], *, reactor: str | None, step: str | None) -> str:
        """Call the key function; a raise or an empty key is a ``CoordinationKeyError``."""
        where = f"step {step!r} of {reactor}" if step else f"reactor {reactor}"
        if self.key_fn is None:
            raise CoordinationKeyError(
                f"{self.primitive} of {where} has no key function",
                reactor=reactor,
                step=step,
                primitive=self.primitive,
            )
        try:
            key = self.key_fn(args)
        except Exception as exc:
            # A KeyError is nearly always a misspelt name: say which names there are.
            known = f" (it receives {sorted(args)})" if isinstance(exc, KeyError) else ""
            raise CoordinationKeyError(
                f"the {self.primitive} key function of {where} raised "
                f"{type(exc).__name__}: {exc}{known}; the work did not run",
                reactor=reactor,
                step=step,
                primitive=self.primitive,
                cause=exc,
            ) from exc
        if key is None or (isinstance(key, str) and not key.strip()):
            raise CoordinationKeyError(
                f"the {self.primitive} key function of {where} returned {key!r}; return a "
                'non-empty string that identifies what to coordinate on (e.g. f"acct:{...}")',
                reactor=reactor,
                step=step,
                primitive=self.primitive,
                cause=f"returned {key!r}",
            )
        return str(key)

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
    limit: int = 1
    wait: float = 0.0
    ttl: float = 60.0
    rollback_wait: float = 60.0

    def claim(self, key: str, position: OrderedPosition | None = None) -> Claim:
        return SemaphoreClaim(key=key, limit=self.limit, ttl=self.ttl)

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
        where = f"step {step!r} of {reactor}" if step else f"reactor {reactor}"
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
        from reactor_app.coordination.rate_limit import named_windows

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
        return [self.by_primitive[p] for p in ROLLBACK_PRIMITIVES if p in self.by_primitive]

    def with_(self, declaration: Declaration) -> DeclarationSet:
        return DeclarationSet({**self.by_primitive, declaration.primitive: declaration})

    def merged(self, other: DeclarationSet) -> DeclarationSet:
        return DeclarationSet({**self.by_primitive, **other.by_primitive})

    def wait_seconds(self) -> float:
        return max((d.wait_seconds() for d in self.by_primitive.values()), default=0.0)


# --------------------------------------------------------------------------------------------
# validation helpers


def _positive_number(owner: str, option: str, value: Any, *, allow_zero: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and (value > 0 or (allow_zero and value == 0)):
        return float(value)
    bound = ">= 0" if allow_zero else "> 0"
    raise DefinitionError(
        f"{owner}: {option} must be a number of seconds {bound}, got {value!r}",
        owner=owner,
        option=option,
    )


def _key_function(owner: str, key: Any) -> KeyFunction:
    if not callable(key):
        raise DefinitionError(
            f"{owner}: the first argument must be a key function such as "
            f"lambda args: f\"acct:{{args['account_id']}}\", got {key!r}",
            owner=owner,
            option="key",
        )
    try:
        signature = inspect.signature(key)
    except (TypeError, ValueError):  # some builtins and C callables have none to inspect
        return key  # type: ignore[no-any-return]
    try:
        signature.bind({})
    except TypeError as exc:
        # Checked now, not when the first run calls it: it is called with one mapping.
        raise DefinitionError(
            f"{owner}: the key function {getattr(key, '__name__', key)!r} must accept one "
            f"argument (the arguments or inputs mapping), but its signature is {signature} "
            f"({exc})",
            owner=owner,
            option="key",
        ) from exc
    return key  # type: ignore[no-any-return]


def _windows_from(owner: str, limits: Mapping[Any, Any]) -> tuple[RateWindow, ...]:
    from reactor_app.coordination.rate_limit import parse_period

    if not isinstance(limits, Mapping) or not limits:
        raise DefinitionError(
            f"{owner}: limits must be a non-empty dict such as {{'second': 3, 'minute': 100}}",
            owner=owner,
            option="limits",
        )
    windows = []
    for period, limit in limits.items():
        try:
            seconds = parse_period(period)
        except (ValueError, TypeError) as exc:
            raise DefinitionError(f"{owner}: {exc}", owner=owner, option="limits") from exc
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise DefinitionError(
                f"{owner}: the limit for {period!r} must be a positive integer, got {limit!r}",
                owner=owner,
                option="limits",
            )
        windows.append(RateWindow(seconds=seconds, limit=limit, label=str(period)))
    return tuple(sorted(windows, key=lambda w: w.seconds))


# --------------------------------------------------------------------------------------------
# attaching declarations to their targets


def _attach(declaration: Declaration, target: T) -> T:
    """Record ``declaration`` on a step class, a reactor class, an inline step or a function."""
    from reactor_app.dsl.reactor import Reactor
    from reactor_app.dsl.step import Step, StepSpec

    if isinstance(target, type) and issubclass(target, (Step, Reactor)):
        current: DeclarationSet = getattr(target, DECLARATIONS_ATTR, DeclarationSet())
        # Assign on the class itself: subclasses inherit it, and a redeclaration in a subclass
        # replaces only that primitive.
        setattr(target, DECLARATIONS_ATTR, current.with_(declaration))
        setattr(target, f"{declaration.primitive}_config", declaration)
        return target
    if isinstance(target, StepSpec):
        target.add_declaration(declaration)
        return target
    if callable(target) and not isinstance(target, type):
        current = getattr(target, DECLARATIONS_ATTR, DeclarationSet())
        target.__dict__[DECLARATIONS_ATTR] = current.with_(declaration)
        return target
    raise DefinitionError(
        f"{declaration.primitive} decorators apply to Reactor subclasses, Step subclasses and "
        f"inline @step methods, not to {target!r}",
        owner=repr(target),
        option=declaration.primitive,
    )


def with_lock(
    key: KeyFunction,
    *,
    ttl: float = 60,
    wait: float = 0,
    auto_extend: bool = True,
    rollback_wait: float | None = None,
) -> Callable[[T], T]:
    """At most one execution inside the decorated work per key.

    ``ttl`` is the lease in seconds (renewed every ``ttl/3`` while the work runs when
    ``auto_extend``), ``wait`` how long a synchronous caller waits before failing, and
    ``rollback_wait`` how long compensate/undo wait to re-take it (default: ``ttl``).
    """
    owner = "with_lock"
    declaration = LockDeclaration(
        key_fn=_key_function(owner, key),
        ttl=_positive_number(owner, "ttl", ttl),
        wait=_positive_number(owner, "wait", wait, allow_zero=True),
        auto_extend=_bool(owner, "auto_extend", auto_extend),
        rollback_wait=None
        if rollback_wait is None
        else _positive_number(owner, "rollback_wait", rollback_wait, allow_zero=True),
    )
    return lambda target: _attach(declaration, target)


def with_semaphore(
    key: KeyFunction,
    limit: int | None = None,
    *,
    wait: float = 0,
    ttl: float = 60,
    rollback_wait: float = 60,
) -> Callable[[T], T]:
    """At most ``limit`` executions inside the decorated work per key (one slot per owner)."""
    owner = "with_semaphore"
    if limit is None:
        raise DefinitionError(
            f"{owner}: limit is required, e.g. with_semaphore(key, limit=3)",
            owner=owner,
            option="limit",
        )
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise DefinitionError(
            f"{owner}: limit must be a positive integer, got {limit!r}", owner=owner, option="limit"
        )
    declaration = SemaphoreDeclaration(
        key_fn=_key_function(owner, key),
        limit=limit,
        wait=_positive_number(owner, "wait", wait, allow_zero=True),
        ttl=_positive_number(owner, "ttl", ttl),
        rollback_wait=_positive_number(owner, "rollback_wait", rollback_wait, allow_zero=True),
    )
    return lambda target: _attach(declaration, target)


def with_rate_limit(
    key: KeyFunction | str,
    *,
    limit: int | None = None,
    period: str | int | None = None,
    limits: Mapping[Any, int] | None = None,
    strategy: str = "sliding",
    wait: float = 0,
    cost: int | CostFunction = 1,
) -> Callable[[T], T]:
    """At most ``limit`` executions of the decorated work per window per key.

    ``with_rate_limit(key, limit=10, period="minute")``, several windows at once with
    ``limits={"second": 3, "minute": 100}``, or a named limit from ``REACTOR_RATE_LIMITS``
    with ``with_rate_limit("stripe")``. ``strategy="fixed"`` trades exactness at window edges
    for constant memory on very large limits. ``wait`` (seconds, in-process runs): how long a
    caller waits for the window to free before ``RateLimitExceeded``; on a worker the
    execution is parked until then instead.

    ``cost`` makes the limit weighted: each admission charges that many units of ``limit``
    (``cost=lambda args: args["tokens"]`` for a token budget). A constant cost above a
    window's limit is a ``DefinitionError`` now; a computed one that is not a positive integer
    or exceeds a limit fails the work with ``RateLimitCostError`` (it could never run).
    """
    owner = "with_rate_limit"
    wait_seconds = _positive_number(owner, "wait", wait, allow_zero=True)
    if not callable(cost) and (isinstance(cost, bool) or not isinstance(cost, int) or cost < 1):
        raise DefinitionError(
            f"{owner}: cost must be a positive integer or a function of the arguments such as "
            f"lambda args: args['tokens'], got {cost!r}",
            owner=owner,
            option="cost",
        )
    if strategy not in ("sliding", "fixed"):
        raise DefinitionError(
            f"{owner}: strategy must be 'sliding' or 'fixed', got {strategy!r}",
            owner=owner,
            option="strategy",
        )
    if isinstance(key, str):
        if limit is not None or period is not None or limits is not None:
            raise DefinitionError(
                f"{owner}({key!r}) refers to the named limit REACTOR_RATE_LIMITS[{key!r}] and "
                "cannot also take limit=, period= or limits=; define them in settings, or pass "
                "a key function instead of a name",
                owner=owner,
                option="name",
            )
        # a constant cost is checked against the named windows when it is charged: settings
        # may change after import
        declaration = RateLimitDeclaration(
            key_fn=None, name=key, strategy=strategy, wait=wait_seconds, cost=cost
        )
        return lambda target: _attach(declaration, target)
    key_fn = _key_function(owner, key)
    if limits is not None:
        if limit is not None or period is not None:
            raise DefinitionError(
                f"{owner}: give either limits={{...}} or limit= and period=",
                owner=owner,
                option="limits",
            )
        windows = _windows_from(owner, limits)
    else:
        if limit is None or period is None:
            raise DefinitionError(
                f"{owner}: give limit= and period= (e.g. limit=10, period='minute'), or limits=",
                owner=owner,
                option="limit",
            )
        windows = _windows_from(owner, {period: limit})
    if not callable(cost):
        for window in windows:
            if cost > window.limit:
                raise DefinitionError(
                    f"{owner}: cost={cost} is more than the limit of {window.limit} per "
                    f"{window.label}, so the work could never be admitted",
                    owner=owner,
                    option="cost",
                )
    declaration = RateLimitDeclaration(
        key_fn=key_fn, windows=windows, strategy=strategy, wait=wait_seconds, cost=cost
    )
    return lambda target: _attach(declaration, target)


def with_period(
    key: KeyFunction,
    *,
    every: str | int = "hour",
    ttl: float = 60,
    wait: float | None = None,
) -> Callable[[T], T]:
    """The decorated work succeeds at most once per bucket per key, never twice at once.

    On a step, a bucket already done **skips the step** (``Skipped(reason="period")``) and the
    workflow continues; on a reactor it halts the whole run. Named units ("second" ... "year")
    are calendar-aligned UTC buckets; an integer is a bucket of that many seconds from the
    epoch.

    Admission reserves the bucket for this execution (a lease of ``ttl`` seconds, renewed while
    the work runs); a success marks it done, any other outcome frees it, and a holder that dies
    frees it when the lease lapses. Another execution that meets the bucket in flight is in
    contention: in-process it waits up to ``wait`` seconds (default: ``ttl``, one lease) for
    that run to end, then skips (done) or runs (freed), or fails with
    ``PeriodInFlightError``; on a worker it parks and decides when it comes back.
    """
    from reactor_app.coordination.period import validate_every

    owner = "with_period"
    try:
        validate_every(every)
    except (ValueError, TypeError) as exc:
        raise DefinitionError(f"{owner}: {exc}", owner=owner, option="every") from exc
    declaration = PeriodDeclaration(
        key_fn=_key_function(owner, key),
        every=every,
        ttl=_positive_number(owner, "ttl", ttl),
        wait=None if wait is None else _positive_number(owner, "wait", wait, allow_zero=True),
    )
    return lambda target: _attach(declaration, target)


def with_ordered_lock(
    key: KeyFunction,
    *,
    ttl: float = 86400,
    poison_pill_timeout: float = 600,
    strict: bool = True,
    wait: float | None = None,
) -> Callable[[T], T]:
    """Executions pass the decorated work one at a time, in position order, per key.

    On a reactor the position is assigned when the run starts (enqueue order). On a step the
    key is computed from the step's arguments, which do not exist until the step is reached,
    so **a step orders executions by their arrival at that step**, not by when they started:
    for a first step the two coincide; the deeper the step, the weaker the promise.

    A holder silent for ``poison_pill_timeout`` seconds is passed over. With ``strict`` a
    failure stops the line: later positions are skipped (reason
    ``"ordered_lock_chain_failed"``) until an operator resets the key. ``wait`` bounds how
    long a synchronous caller waits for its turn (default: ``poison_pill_timeout``).
    """
    owner = "with_ordered_lock"
    declaration = OrderedLockDeclaration(
        key_fn=_key_function(owner, key),
        ttl=_positive_number(owner, "ttl", ttl),
        poison_pill_timeout=_positive_number(owner, "poison_pill_timeout", poison_pill_timeout),
        strict=_bool(owner, "strict", strict),
        wait=None if wait is None else _positive_number(owner, "wait", wait, allow_zero=True),
    )
    return lambda target: _attach(declaration, target)


def _bool(owner: str, option: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise DefinitionError(
            f"{owner}: {option} must be True or False, got {value!r}", owner=owner, option=option
        )
    return value


class Coordinated:
    """Introspection shared by ``Step`` and ``Reactor`` classes."""

    lock_config: ClassVar[LockDeclaration | None] = None
    semaphore_config: ClassVar[SemaphoreDeclaration | None] = None
    rate_limit_config: ClassVar[RateLimitDeclaration | None] = None
    period_config: ClassVar[PeriodDeclaration | None] = None
    ordered_lock_config: ClassVar[OrderedLockDeclaration | None] = None

    @classmethod
    def declarations(cls) -> DeclarationSet:
        return getattr(cls, DECLARATIONS_ATTR, None) or DeclarationSet()

    @classmethod
    def declares_coordination(cls) -> bool:
        return bool(cls.declarations())

    @classmethod
    def coordination_declarations(cls) -> list[Declaration]:
        return cls.declarations().ordered()
