"""Reactors: workflows of steps.

A ``Reactor`` subclass declares ``inputs``, its steps as class attributes (``step``,
``compose``, ``map_step``... or inline ``@step`` methods), optionally ``returns`` and
reactor-level coordination decorators. The class is planned (and checked) when it is created.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from reactor_app.dsl import registry
from reactor_app.dsl.declarations import Coordinated
from reactor_app.dsl.step import StepSpec, declared_inputs
from reactor_app.engine.planner import Plan, build_plan
from reactor_app.exceptions import DefinitionError

if TYPE_CHECKING:
    from reactor_app.engine.result import Result
    from reactor_app.models import Execution


class Reactor(Coordinated):
    """Base class of reactors. See the module docstring."""

    inputs: ClassVar[tuple[str, ...]] = ()
    #: the step whose result is the run's value; default: a dict of every step's result
    returns: ClassVar[str | None] = None
    #: ``True`` hands the whole run to a worker; ``"after:<step>"`` hands off after that step
    background: ClassVar[bool | str] = False

    steps: ClassVar[dict[str, StepSpec]] = {}
    plan: ClassVar[Plan]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.inputs = declared_inputs(cls)
        cls._check_input_names()
        specs: dict[str, StepSpec] = {}
        for base in reversed(cls.__mro__[1:]):
            specs.update(getattr(base, "steps", {}) if base is not Reactor else {})
        for name, attribute in list(vars(cls).items()):
            if isinstance(attribute, StepSpec):
                attribute.name = name
                attribute.owner = cls
                specs[name] = attribute
        cls.steps = specs
        cls.plan = build_plan(cls, specs)
        cls._check_background()
        registry.register(cls)

    #: keyword arguments of ``run`` / ``run_async`` themselves, so never an input's name
    RESERVED_INPUTS: ClassVar[frozenset[str]] = frozenset(
        {"priority", "idempotency_key", "debounce"}
    )

    @classmethod
    def _check_input_names(cls) -> None:
        taken = sorted(cls.RESERVED_INPUTS.intersection(cls.inputs or ()))
        if taken:
            raise DefinitionError(
                f"{cls.__qualname__}.inputs names {', '.join(map(repr, taken))}, which "
                "run() and run_async() take as their own options; rename the input "
                f"(reserved: {', '.join(sorted(cls.RESERVED_INPUTS))})",
                owner=cls.__qualname__,
                option="inputs",
            )

    @classmethod
    def _check_background(cls) -> None:
        value = cls.background
        if isinstance(value, bool):
            return
        if isinstance(value, str) and value.startswith("after:"):
            step = value[len("after:") :]
            if step in cls.steps:
                return
            raise DefinitionError(
                f"{cls.__qualname__}.background = {value!r} names no step "
                f"(steps: {', '.join(cls.steps) or 'none'})",
                owner=cls.__qualname__,
                option="background",
            )
        raise DefinitionError(
            f"{cls.__qualname__}.background must be True, False or 'after:<step>', got {value!r}",
            owner=cls.__qualname__,
            option="background",
        )

    @classmethod
    def path(cls) -> str:
        """The dotted path executions record for this reactor."""
        return registry.path_of(cls)

    @classmethod
    def run(cls, *, priority: int | None = None, **inputs: Any) -> Result:
        """Run the reactor in this process and return its ``Result``.

        A ``background = True`` reactor is handed to a worker at once (``status ==
        "handed_off"``); ``background = "after:<step>"`` runs up to that step here.

        ``priority`` (-100 to 100, default 0) is ``run_async``'s: where a unit of this run
        waits in a contended key's line (``wait=``), a higher priority is admitted first,
        first come, first served within one, within the same bounded head start.
        """
        # deferred: the DSL hands over to the engine, which imports the models; they cannot
        # load while Django reads INSTALLED_APPS, which imports this package
        from reactor_app.engine.in_process import run_reactor

        return run_reactor(cls, inputs, priority=priority)

    @classmethod
    def run_async(
        cls,
        *,
        idempotency_key: str | None = None,
        debounce: tuple[str, float] | None = None,
        priority: int | None = None,
        **inputs: Any,
    ) -> Execution:
        """Run the reactor on a Celery worker; returns the (pending) ``Execution`` row.

        An outbox: the row is committed before the task is sent, and broker trouble never
        raises here (the sweeper enqueues a row whose send failed), so a returned row always
        runs exactly once. A second call with the same ``idempotency_key`` returns the first
        call's row instead of starting another run. Invalid inputs, and inputs a worker could
        not read back as the same values, raise at the call (``InputValidationError``,
        ``InputNotSerializable``). ``execution.wait(timeout)`` blocks until it is finished and
        returns its ``Result``.

        ``debounce=(key, seconds)`` (or the reactor's ``with_debounce``) makes this start one of
        a burst: the run starts once ``seconds`` pass with no other start of ``key``, with the
        last start's inputs; the earlier starts end ``superseded`` (``wait()`` on one waits
        for the run that replaced it).

        ``priority`` (-100 to 100, default 0): where a contended key has a line of waiters,
        a higher priority is admitted first — first come, first served within a priority, and
        never more than a bounded head start over a lower one (docs/coordination.md,
        "Priority and fair sharing"); also the Celery message's priority, for brokers that
        order by it.
        """
        # deferred: the DSL hands over to the engine, which imports the models; they cannot
        # load while Django reads INSTALLED_APPS, which imports this package
        from reactor_app.engine.enqueueing import run_async

        return run_async(
            cls, inputs, idempotency_key=idempotency_key, debounce=debounce, priority=priority
        )

    @classmethod
    def resume(cls, execution_id: Any, *, step: str | None = None, payload: Any = None) -> Result:
        """Continue an execution paused at interrupt ``step``; ``payload`` is its result.

        Inline (or on a worker for a ``background`` reactor: ``status == "handed_off"``).
        Raises ``ExecutionNotResumable`` if it is not waiting there — e.g. a second resume.
        """
        # deferred: the DSL hands over to the engine, which imports the models; they cannot
        # load while Django reads INSTALLED_APPS, which imports this package
        from reactor_app.engine.interrupt_delivery import resume

        return resume(cls, execution_id, step=step, payload=payload)

    @classmethod
    def resume_by_correlation(
        cls, correlation_id: str, *, step: str | None = None, payload: Any = None
    ) -> Result:
        """``resume`` the execution of this reactor paused under ``correlation_id``."""
        # deferred: the DSL hands over to the engine, which imports the models; they cannot
        # load while Django reads INSTALLED_APPS, which imports this package
        from reactor_app.engine.interrupt_delivery import resume_by_correlation

        return resume_by_correlation(cls, correlation_id, step=step, payload=payload)


registry.register_base(Reactor)
