"""The five coordination decorators (``with_lock``...); the checks of their options are
``dsl.option_checks``.

The same decorators apply to ``Reactor`` subclasses (the key function receives the reactor's
inputs), to ``Step`` subclasses and to inline ``@step`` methods (the key function receives the
step's resolved, validated arguments). Options are validated here, when the class is created,
so a bad declaration fails at import with a message that says what to change.

The declarations they record (``LockDeclaration``...) live in ``dsl.declarations``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from reactor_app.coordination.period import validate_every
from reactor_app.dsl.declarations import (
    DECLARATIONS_ATTR,
    CostFunction,
    DebounceDeclaration,
    Declaration,
    DeclarationSet,
    KeyFunction,
    LockDeclaration,
    OrderedLockDeclaration,
    PeriodDeclaration,
    RateLimitDeclaration,
    SemaphoreDeclaration,
    record_on_class,
)
from reactor_app.dsl.option_checks import (
    bool_option,
    count_option,
    fair_by_option,
    key_function,
    lifetime_option,
    strategy_option,
    wait_option,
    windows_option,
)
from reactor_app.dsl.reactor import Reactor
from reactor_app.dsl.step import Step, StepSpec
from reactor_app.exceptions import DefinitionError

T = TypeVar("T")


# --------------------------------------------------------------------------------------------
# attaching declarations to their targets


def _attach(declaration: Declaration, target: T) -> T:
    """Record ``declaration`` on a step class, a reactor class, an inline step or a function."""
    if isinstance(target, type) and issubclass(target, (Step, Reactor)):
        record_on_class(declaration, target)
        return target
    if isinstance(target, StepSpec):
        target.add_declaration(declaration)
        return target
    function = _task_function(target)
    if function is not None:
        # a django.tasks ``Task`` (the decorator stacked above ``@task``): recorded on its
        # function, which the task backend's reactor reads (reactor_app.tasks_backend)
        _attach(declaration, function)
        return target
    if callable(target) and not isinstance(target, type):
        current = getattr(target, DECLARATIONS_ATTR, DeclarationSet())
        target.__dict__[DECLARATIONS_ATTR] = current.with_(declaration)
        return target
    raise DefinitionError(
        f"{declaration.primitive} decorators apply to Reactor subclasses, Step subclasses, "
        f"inline @step methods and django.tasks @task functions, not to {target!r}",
        owner=repr(target),
        option=declaration.primitive,
    )


def _task_function(target: object) -> Callable[..., Any] | None:
    """The function of a ``django.tasks`` task (Django 6, or the django-tasks backport), found
    by its shape so that the DSL needs neither installed."""
    function = getattr(target, "func", None)
    if callable(function) and callable(getattr(target, "enqueue", None)):
        return function  # type: ignore[no-any-return]
    return None


def with_lock(
    key: KeyFunction,
    *,
    ttl: float = 60,
    wait: float = 0,
    auto_extend: bool = True,
    rollback_wait: float | None = None,
    on_contention: str = "queue",
) -> Callable[[T], T]:
    """At most one execution inside the decorated work per key.

    ``ttl`` is the lease in seconds (renewed every ``ttl/3`` while the work runs when
    ``auto_extend``), ``wait`` how long a synchronous caller waits before failing, and
    ``rollback_wait`` how long compensate/undo wait to re-take it (default: ``ttl``).
    ``on_contention`` says what a unit that finds the key taken does: ``"queue"`` (wait, or
    park on a worker), ``"skip"``, ``"cancel_newest"`` (cancel itself) or
    ``"cancel_in_progress"`` (cancel the holder, then queue) — docs/coordination.md.
    """
    owner = "with_lock"
    declaration = LockDeclaration(
        key_fn=key_function(owner, key),
        ttl=lifetime_option(owner, "ttl", ttl),
        wait=wait_option(owner, "wait", wait),
        auto_extend=bool_option(owner, "auto_extend", auto_extend),
        rollback_wait=None
        if rollback_wait is None
        else wait_option(owner, "rollback_wait", rollback_wait),
        on_contention=strategy_option(owner, "lock", on_contention),
    )
    return lambda target: _attach(declaration, target)


def with_semaphore(
    key: KeyFunction,
    limit: int | str | None = None,
    *,
    wait: float = 0,
    ttl: float = 60,
    rollback_wait: float = 60,
    on_contention: str = "queue",
    fair_by: KeyFunction | None = None,
) -> Callable[[T], T]:
    """At most ``limit`` executions inside the decorated work per key (one slot per owner).
    ``limit`` is a number, or the name of a limit in ``REACTOR_LIMITS``
    (``limit="partner_api"``), which an operator can override live from the admin.
    ``on_contention``: ``"queue"``, ``"skip"`` or ``"cancel_newest"`` (as ``with_lock``).

    ``fair_by``: a function of the arguments (inputs) naming the waiter's group, e.g.
    ``lambda args: args["tenant"]``; waiters are then admitted round-robin across groups (FIFO
    inside one), so one group's backlog cannot hold another's work behind it
    (docs/coordination.md, "Priority and fair sharing")."""
    owner = "with_semaphore"
    if limit is None:
        raise DefinitionError(
            f"{owner}: limit is required, e.g. with_semaphore(key, limit=3)",
            owner=owner,
            option="limit",
        )
    if isinstance(limit, str):
        if not limit.strip():
            raise DefinitionError(
                f"{owner}: a named limit must be a non-empty name from REACTOR_LIMITS",
                owner=owner,
                option="limit",
            )
        # the name is checked against settings when the limit is read (and by manage.py
        # check): settings may not be loaded when the decorator runs
    elif not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise DefinitionError(
            f"{owner}: limit must be a positive integer or the name of a limit in "
            f"REACTOR_LIMITS, got {limit!r}",
            owner=owner,
            option="limit",
        )
    else:
        count_option(owner, "limit", limit)
    declaration = SemaphoreDeclaration(
        key_fn=key_function(owner, key),
        limit=limit,
        wait=wait_option(owner, "wait", wait),
        ttl=lifetime_option(owner, "ttl", ttl),
        rollback_wait=wait_option(owner, "rollback_wait", rollback_wait),
        on_contention=strategy_option(owner, "semaphore", on_contention),
        fair_by=None if fair_by is None else fair_by_option(owner, fair_by),
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
    wait_seconds = wait_option(owner, "wait", wait)
    if not callable(cost) and (isinstance(cost, bool) or not isinstance(cost, int) or cost < 1):
        raise DefinitionError(
            f"{owner}: cost must be a positive integer or a function of the arguments such as "
            f"lambda args: args['tokens'], got {cost!r}",
            owner=owner,
            option="cost",
        )
    if not callable(cost):
        count_option(owner, "cost", cost)
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
    key_fn = key_function(owner, key)
    if limits is not None:
        if limit is not None or period is not None:
            raise DefinitionError(
                f"{owner}: give either limits={{...}} or limit= and period=",
                owner=owner,
                option="limits",
            )
        windows = windows_option(owner, limits)
    else:
        if limit is None or period is None:
            raise DefinitionError(
                f"{owner}: give limit= and period= (e.g. limit=10, period='minute'), or limits=",
                owner=owner,
                option="limit",
            )
        windows = windows_option(owner, {period: limit})
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
    owner = "with_period"
    try:
        validate_every(every)
    except (ValueError, TypeError) as exc:
        raise DefinitionError(f"{owner}: {exc}", owner=owner, option="every") from exc
    declaration = PeriodDeclaration(
        key_fn=key_function(owner, key),
        every=every,
        ttl=lifetime_option(owner, "ttl", ttl),
        wait=None if wait is None else wait_option(owner, "wait", wait),
    )
    return lambda target: _attach(declaration, target)


def with_debounce(
    key: KeyFunction, seconds: float, *, max_wait: float | None = None
) -> Callable[[T], T]:
    """Starts of the decorated reactor (``run_async``) with one key within ``seconds`` of each
    other become one execution, with the last start's inputs, started once ``seconds`` pass
    without another start — or ``max_wait`` after the burst's first start, whichever is first.
    The replaced starts end ``superseded``, pointing at the one that runs (docs/coordination.md,
    "Debounce")."""
    owner = "with_debounce"
    declaration = DebounceDeclaration(
        key_fn=key_function(owner, key),
        seconds=lifetime_option(owner, "seconds", seconds),
        max_wait=None if max_wait is None else lifetime_option(owner, "max_wait", max_wait),
    )

    def attach(target: T) -> T:
        if not (isinstance(target, type) and issubclass(target, Reactor)):
            raise DefinitionError(
                f"with_debounce applies to Reactor subclasses (it decides when a run starts), "
                f"not to {target!r}; debounce the reactor that runs this step instead",
                owner=repr(target),
                option="with_debounce",
            )
        target.debounce_config = declaration
        return target

    return attach


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
        key_fn=key_function(owner, key),
        ttl=lifetime_option(owner, "ttl", ttl),
        poison_pill_timeout=lifetime_option(owner, "poison_pill_timeout", poison_pill_timeout),
        strict=bool_option(owner, "strict", strict),
        wait=None if wait is None else wait_option(owner, "wait", wait),
    )
    return lambda target: _attach(declaration, target)
