"""Step kinds beyond a plain step: composed, mapped, asynchronous and interrupt steps.

``compose(ChildReactor, **arguments)`` runs a child reactor inside this execution tree (same
root owner, fully part of rollback). ``map_step(StepOrReactor, over=source, **arguments)`` runs
once per element of ``over``; ``element()`` reads the current element, and each iteration is
coordinated on its own arguments. ``map_step(Step, ..., parallel=True)`` fans the elements out
as worker deliveries when the execution runs on a worker (``engine.mapping``).

``async_step(StepClass, ...)`` and ``async_reactor(ChildReactor, ...)`` hand work to a Celery
worker (``engine.dispatch``); ``interrupt(...)`` pauses the execution until it is resumed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from reactor_app import bounds
from reactor_app.dsl.arguments import Source
from reactor_app.dsl.declarations import Declaration
from reactor_app.dsl.reactor import Reactor
from reactor_app.dsl.step import Step, StepSpec
from reactor_app.exceptions import DefinitionError


def _is_reactor(target: Any) -> bool:
    return isinstance(target, type) and issubclass(target, Reactor)


def _check_child_arguments(spec: StepSpec, reactor: type[Reactor]) -> None:
    """A child reactor's arguments (``compose``, ``async_reactor``) must be its inputs."""
    where = f"{reactor.__qualname__}.{spec.name}"
    unknown = sorted(set(spec.arguments) - set(spec.target.inputs))
    if unknown:
        raise DefinitionError(
            f"{where}: {spec.target.__qualname__} has inputs {tuple(spec.target.inputs)} but "
            f"is given {unknown}",
            owner=where,
            option=unknown[0],
        )


class ComposeSpec(StepSpec):
    kind: ClassVar[str] = "compose"

    def step_class(self) -> type[Step] | None:
        return None

    def check(self, reactor: type[Reactor]) -> None:
        super().check(reactor)
        _check_child_arguments(self, reactor)


class MapSpec(StepSpec):
    kind: ClassVar[str] = "map"

    def __init__(
        self,
        target: Any,
        over: Source,
        arguments: dict[str, Any],
        where: Any,
        parallel: bool = False,
    ) -> None:
        super().__init__(target, arguments, where)
        self.over = over
        self.parallel = parallel

    def dependencies(self) -> set[str]:
        deps = super().dependencies()
        over_dep = self.over.step_dependency()
        return deps | ({over_dep} if over_dep else set())

    @property
    def is_reactor(self) -> bool:
        return _is_reactor(self.target)

    def step_class(self) -> type[Step] | None:
        return None if self.is_reactor else super().step_class()


def compose(child: Any, /, *, where: Any = None, **arguments: Any) -> ComposeSpec:
    """Run ``child`` (a Reactor subclass) as part of this execution and of its rollback."""
    if not _is_reactor(child):
        raise DefinitionError(
            f"compose() takes a Reactor subclass, got {child!r}; use step() for a Step",
            option="target",
        )
    return ComposeSpec(child, arguments, where)


def map_step(
    target: Any,
    /,
    *,
    over: Source | None = None,
    where: Any = None,
    parallel: bool = False,
    **arguments: Any,
) -> MapSpec:
    """Run ``target`` (a Step or Reactor subclass) once per element of ``over``.

    ``parallel=True`` (a Step target only): on a worker, the elements run concurrently, each as
    its own worker delivery (a child execution, like an ``async_step``), coordinated on its own
    arguments and owned by its own execution — so a lock keyed on the element serializes equal
    elements and a semaphore on the step bounds the fan-out. The parent parks, holding nothing
    of the elements, until they have all ended; the results are joined in element order. A
    failed element fails the step once the others have ended: the elements that completed are
    undone, newest first, then the parent rolls back its earlier steps as for any failure. In
    the caller's process (``Reactor.run`` of a reactor that is not ``background``) the elements
    run one after another, exactly as without ``parallel``. ``parallel`` is therefore not
    available as an argument name of the mapped step (pass ``parallel=value(...)`` for that).
    """
    if not (_is_reactor(target) or (isinstance(target, type) and issubclass(target, Step))):
        raise DefinitionError(
            f"map_step() takes a Step or Reactor subclass, got {target!r}", option="target"
        )
    if isinstance(parallel, Source):
        # ``parallel=value(...)``: an argument of the mapped step that happens to be named so
        arguments["parallel"] = parallel
        parallel = False
    if not isinstance(parallel, bool):
        raise DefinitionError(
            f"map_step(parallel=...) must be True or False, got {parallel!r}", option="parallel"
        )
    if parallel and _is_reactor(target):
        raise DefinitionError(
            f"map_step({target.__qualname__}, parallel=True): parallel maps fan out Step "
            "elements only; a reactor element belongs to this execution's tree and rollback "
            "(compose semantics) and runs in its delivery. Map a Step, or drop parallel=True",
            option="parallel",
        )
    if not isinstance(over, Source):
        raise DefinitionError(
            "map_step() needs over=from_input(...) or over=from_result(...) naming the list to "
            f"map over, got {over!r}",
            option="over",
        )
    return MapSpec(target, over, arguments, where, parallel=parallel)


# --------------------------------------------------------------------------------------------
# Kinds that leave the process: async_step, async_reactor; and the interrupt that pauses.


class AsyncStepSpec(StepSpec):
    """``async_step``: the step body runs in its own Celery task (its own execution row).

    The dispatcher takes no coordination: the task takes the step's holds in the worker, owned
    by the task's own execution id. The step's result is read when a later step needs it (a
    synchronous caller blocks for up to ``result_timeout`` seconds; a worker parks).
    """

    kind: ClassVar[str] = "async_step"

    def __init__(
        self, target: Any, arguments: dict[str, Any], where: Any, result_timeout: float
    ) -> None:
        super().__init__(target, arguments, where)
        self.result_timeout = result_timeout


class AsyncReactorSpec(StepSpec):
    """``async_reactor``: an independent child execution of another reactor, on a worker.

    Independent: its own owner, its own holds and its own rollback — the parent's rollback
    does not undo it. Its value becomes this step's result, read like an ``async_step``'s.
    """

    kind: ClassVar[str] = "async_reactor"

    def __init__(
        self, target: Any, arguments: dict[str, Any], where: Any, result_timeout: float
    ) -> None:
        super().__init__(target, arguments, where)
        self.result_timeout = result_timeout

    def step_class(self) -> type[Step] | None:
        return None

    def check(self, reactor: type[Reactor]) -> None:
        super().check(reactor)
        _check_child_arguments(self, reactor)  # the same rule as compose


class InterruptSpec(StepSpec):
    """``interrupt``: pause the execution until ``Reactor.resume(...)`` supplies a payload.

    Nothing runs at an interrupt, so there is nothing to coordinate: declaring a primitive on
    one raises ``DefinitionError``. Reactor-level holds are released across the pause and
    re-taken when the execution resumes.
    """

    kind: ClassVar[str] = "interrupt"

    def __init__(
        self,
        correlation_id: Callable[[dict[str, Any]], Any] | None,
        timeout: float | None,
        where: Any,
    ) -> None:
        super().__init__(None, {}, where)
        self.correlation_id = correlation_id
        self.timeout = timeout

    def step_class(self) -> type[Step] | None:
        return None

    def add_declaration(self, declaration: Declaration) -> None:
        raise DefinitionError(
            f"{declaration.primitive} cannot be declared on an interrupt step: nothing runs at "
            "an interrupt, so there is no work to protect. Declare it on the reactor instead "
            f"(@with_{declaration.primitive}(...) on the Reactor class): reactor-level holds "
            "are released across the pause and re-taken on resume",
            owner=self.name or "interrupt",
            option=declaration.primitive,
        )

    def compute_correlation_id(self, inputs: dict[str, Any]) -> str:
        if self.correlation_id is None:
            return ""
        value = self.correlation_id(inputs)
        return "" if value is None else str(value)


#: seconds a synchronous reader waits for an async step's or reactor's result by default
DEFAULT_RESULT_TIMEOUT = 300.0


def _result_timeout(where: str, value: Any) -> float:
    """Kept in the execution's state (JSON: no NaN or infinity) and added to a time: within
    ``reactor_app.bounds`` (an infinite one failed the checkpoint that stored it)."""
    try:
        return bounds.seconds_within(value, "result_timeout")
    except ValueError as exc:
        raise DefinitionError(f"{where}: {exc}", option="result_timeout") from None


def async_step(
    target: Any,
    /,
    *,
    where: Any = None,
    result_timeout: float = DEFAULT_RESULT_TIMEOUT,
    **arguments: Any,
) -> AsyncStepSpec:
    """Run ``target`` (a Step subclass) in its own Celery task; see ``AsyncStepSpec``.

    ``result_timeout`` bounds how long a synchronous caller blocks on the result.
    """
    if not (isinstance(target, type) and issubclass(target, Step)):
        hint = " (use async_reactor(...) for a reactor)" if _is_reactor(target) else ""
        raise DefinitionError(
            f"async_step() takes a Step subclass, got {target!r}{hint}", option="target"
        )
    return AsyncStepSpec(target, arguments, where, _result_timeout("async_step", result_timeout))


def async_reactor(
    child: Any,
    /,
    *,
    where: Any = None,
    result_timeout: float = DEFAULT_RESULT_TIMEOUT,
    **arguments: Any,
) -> AsyncReactorSpec:
    """Run ``child`` (a Reactor subclass) as an independent execution on a worker."""
    if not _is_reactor(child):
        raise DefinitionError(
            f"async_reactor() takes a Reactor subclass, got {child!r}; use async_step() for a Step",
            option="target",
        )
    return AsyncReactorSpec(
        child, arguments, where, _result_timeout("async_reactor", result_timeout)
    )


def interrupt(
    *,
    correlation_id: Callable[[dict[str, Any]], Any] | None = None,
    timeout: float | None = None,
    where: Any = None,
) -> InterruptSpec:
    """Pause the execution here until ``Reactor.resume(execution_id, step=..., payload=...)``.

    ``correlation_id`` (a function of the reactor's inputs) names the pause for
    ``Reactor.resume_by_correlation``; ``timeout`` (seconds, default: none) makes the sweeper
    fail the interrupt step — and roll the execution back — when no resume came in time. The
    payload of the resume becomes this step's result.
    """
    if correlation_id is not None and not callable(correlation_id):
        raise DefinitionError(
            "interrupt(correlation_id=...) takes a function of the reactor's inputs, e.g. "
            f"lambda inputs: f\"order:{{inputs['order_id']}}\", got {correlation_id!r}",
            option="correlation_id",
        )
    if timeout is not None:
        try:  # a deadline in the state: bounded as result_timeout is
            timeout = bounds.seconds_within(timeout, "interrupt(timeout=...)")
        except ValueError as exc:
            raise DefinitionError(f"{exc} (or None: no deadline)", option="timeout") from None
    return InterruptSpec(correlation_id, timeout, where)
