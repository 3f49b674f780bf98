"""Steps: the ``Step`` base class, and ``step(...)`` which places a step in a reactor.

A step class declares ``inputs`` and ``retries`` and implements ``run`` (and optionally
``compensate`` / ``undo``). Inside a reactor, ``step(StepClass, **arguments)`` wires its
arguments; ``@step(**arguments)`` on a method makes an inline step whose rollback hooks are
added with ``@name.undo`` and ``@name.compensate``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from reactor_app.dsl import registry
from reactor_app.dsl.arguments import Element, Source
from reactor_app.dsl.declarations import (
    DECLARATIONS_ATTR,
    PRIMITIVES,
    Coordinated,
    Declaration,
    DeclarationSet,
    record_on_class,
)
from reactor_app.dsl.outcome import Outcome
from reactor_app.dsl.retries import Retries, as_retries
from reactor_app.exceptions import DefinitionError

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor
    from reactor_app.engine.context import StepContext


def declared_inputs(cls: type[Step] | type[Reactor]) -> tuple[str, ...]:
    """``cls.inputs`` as a tuple of names, checked when a step or reactor class is created.

    A bare string (``inputs = ("account_id")``, the comma forgotten) would otherwise read as
    one input per character.
    """
    if isinstance(cls.inputs, str):
        raise DefinitionError(
            f"{cls.__qualname__}.inputs must be a tuple of names, e.g. ('account_id',), "
            f"not the string {cls.inputs!r}",
            owner=cls.__qualname__,
            option="inputs",
        )
    return tuple(cls.inputs)


class Step(Coordinated):
    """Base class of step classes. Override ``run``; ``compensate`` and ``undo`` are optional."""

    #: declared inputs: every one must be present in the resolved arguments
    inputs: ClassVar[tuple[str, ...]] = ()
    #: attempts (an int) or a ``Retries`` policy
    retries: ClassVar[int | Retries] = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.inputs = declared_inputs(cls)
        cls.retry_policy = as_retries(cls.retries, cls.__qualname__)

    retry_policy: ClassVar[Retries] = Retries()

    def run(self, args: dict[str, Any], context: StepContext) -> Outcome | Any:
        raise NotImplementedError(f"{type(self).__qualname__} must implement run(args, context)")

    def compensate(self, error: BaseException, args: dict[str, Any], context: StepContext) -> Any:
        """This step failed after its body started, or its run ended while the body's result
        was unknown (a lost delivery, docs/reactors-and-steps.md): clean up whatever part of
        the effect exists, none included. Default: nothing."""

    def undo(self, result: Any, args: dict[str, Any], context: StepContext) -> Any:
        """A later step failed; reverse this step's success. Default: nothing."""

    @classmethod
    def has_compensate(cls) -> bool:
        return cls.compensate is not Step.compensate

    @classmethod
    def has_undo(cls) -> bool:
        return cls.undo is not Step.undo

    @classmethod
    def call(cls, *, context: StepContext | None = None, **args: Any) -> Outcome:
        """Run this step on its own, enforcing its inputs and its coordination.

        Contention waits up to the declared ``wait`` and then fails; a direct call is never
        retried and never parked. Called from inside a step body with that body's ``context``,
        the holds are owned by the running execution (so its own keys are re-entered).
        """
        # deferred: the DSL hands over to the engine, which imports the models; they cannot
        # load while Django reads INSTALLED_APPS, which imports this package
        from reactor_app.engine.runner import call_step

        return call_step(cls, args, parent=context)


class InlineStep(Step):
    """Base of the step classes generated for inline ``@step`` methods."""

    function: ClassVar[Callable[..., Any]]
    undo_function: ClassVar[Callable[..., Any] | None] = None
    compensate_function: ClassVar[Callable[..., Any] | None] = None

    def run(self, args: dict[str, Any], context: StepContext) -> Any:
        return type(self).function(context.reactor_instance, args, context)

    def compensate(self, error: BaseException, args: dict[str, Any], context: StepContext) -> Any:
        hook = type(self).compensate_function
        return None if hook is None else hook(context.reactor_instance, error, args, context)

    def undo(self, result: Any, args: dict[str, Any], context: StepContext) -> Any:
        hook = type(self).undo_function
        return None if hook is None else hook(context.reactor_instance, result, args, context)

    @classmethod
    def has_compensate(cls) -> bool:
        return cls.compensate_function is not None

    @classmethod
    def has_undo(cls) -> bool:
        return cls.undo_function is not None


class StepSpec:
    """A step placed in a reactor: what runs, with which arguments, under which condition."""

    kind: ClassVar[str] = "step"

    def __init__(
        self,
        target: Any,
        arguments: Mapping[str, Any],
        where: Callable[..., Any] | bool | None = None,
    ) -> None:
        self.target = target
        self.arguments: dict[str, Source] = {}
        self.where = where
        self.name: str = ""
        self.owner: type[Reactor] | None = None
        self._declarations = DeclarationSet()
        for arg_name, source in arguments.items():
            if arg_name == "parallel" and isinstance(source, bool):
                # the option of map_step, given to a kind that has none: say so rather than
                # asking for value(True) as if it were an argument of the step
                raise DefinitionError(
                    f"parallel={source!r} is an option of map_step(...) only (it fans a map's "
                    f"elements out to workers); {type(self).__name__} has no such option. To "
                    "pass an argument named 'parallel', wrap it: parallel=value(...)",
                    option="parallel",
                )
            if not isinstance(source, Source):
                raise DefinitionError(
                    f"argument {arg_name!r}: use from_input(...), from_result(...), value(...) "
                    f"or element() as an argument source, got {source!r} "
                    f"(wrap constants in value({source!r}))",
                    option=arg_name,
                )
            self.arguments[arg_name] = source
        if where is not None and not (callable(where) or isinstance(where, bool)):
            raise DefinitionError(
                f"where= must be a callable (inputs, results) -> bool or a bool, got {where!r}",
                option="where",
            )

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    # -- coordination --------------------------------------------------------------------

    def add_declaration(self, declaration: Declaration) -> None:
        self._declarations = self._declarations.with_(declaration)

    @property
    def declarations(self) -> DeclarationSet:
        target_declarations = getattr(self.target, DECLARATIONS_ATTR, None) or DeclarationSet()
        return target_declarations.merged(self._declarations)

    def declares_coordination(self) -> bool:
        return bool(self.declarations)

    def coordination_declarations(self) -> list[Declaration]:
        return self.declarations.ordered()

    def __getattr__(self, name: str) -> Any:
        if name.endswith("_config") and name[: -len("_config")] in PRIMITIVES:
            return self.declarations.by_primitive.get(name[: -len("_config")])
        raise AttributeError(name)

    # -- definition checks ----------------------------------------------------------------

    def dependencies(self) -> set[str]:
        deps = {s.step_dependency() for s in self.arguments.values()}
        return {d for d in deps if d}

    def check(self, reactor: type[Reactor]) -> None:
        """Definition-time checks that need the whole reactor (run by the reactor's planner)."""
        where = f"{reactor.__qualname__}.{self.name}"
        for arg_name, source in self.arguments.items():
            if isinstance(source, Element) and self.kind != "map":
                raise DefinitionError(
                    f"{where}: argument {arg_name!r} uses element(), which only exists inside "
                    "map_step(...)",
                    owner=where,
                    option=arg_name,
                )
        step_class = self.step_class()
        if step_class is not None and step_class.inputs and self.arguments:
            unknown = sorted(set(self.arguments) - set(step_class.inputs))
            if unknown:
                raise DefinitionError(
                    f"{where}: {step_class.__qualname__} declares inputs {step_class.inputs} "
                    f"but is given {unknown}; add them to its inputs or remove the arguments",
                    owner=where,
                    option=unknown[0],
                )

    def step_class(self) -> type[Step] | None:
        return (
            self.target if isinstance(self.target, type) and issubclass(self.target, Step) else None
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name or '?'} {getattr(self.target, '__name__', '')}>"


class InlineStepSpec(StepSpec):
    """A step defined by a decorated reactor method."""

    def __init__(
        self,
        function: Callable[..., Any],
        arguments: Mapping[str, Any],
        where: Callable[..., Any] | bool | None = None,
        retries: int | Retries | None = None,
        inputs: tuple[str, ...] = (),
    ) -> None:
        attrs: dict[str, Any] = {
            "function": staticmethod(function),
            "inputs": tuple(inputs),
            "retries": retries if retries is not None else 1,
            "__module__": function.__module__,
            "__qualname__": f"{function.__qualname__}<step>",
        }
        generated = type(f"{function.__name__}_step", (InlineStep,), attrs)
        function_declarations = getattr(function, DECLARATIONS_ATTR, None)
        if function_declarations:
            setattr(generated, DECLARATIONS_ATTR, function_declarations)
            for declaration in function_declarations.ordered():
                setattr(generated, f"{declaration.primitive}_config", declaration)
        super().__init__(generated, arguments, where)
        self.function = function

    def undo(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: ``@charge.undo`` registers ``(self, result, args, context)`` as the undo."""
        self.target.undo_function = staticmethod(function)
        return function

    def compensate(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: ``@charge.compensate`` registers ``(self, error, args, context)``."""
        self.target.compensate_function = staticmethod(function)
        return function

    def add_declaration(self, declaration: Declaration) -> None:
        # Keep the generated class introspectable exactly like a Step subclass.
        record_on_class(declaration, self.target)


def step(target: Any = None, /, *, where: Any = None, **arguments: Any) -> Any:
    """Place a step in a reactor, or (as a decorator) define an inline step.

    ``charge = step(ChargeStep, account_id=from_input("account_id"))`` or::

        @step(account_id=from_input("account_id"))
        def charge(self, args, context): ...

    ``retries=`` and ``inputs=`` are accepted by the inline form. ``where=`` is a callable
    ``(inputs, results) -> bool`` evaluated before anything else: False skips the step.
    """
    if isinstance(target, type):
        if not issubclass(target, Step):
            if registry.is_reactor(target):
                raise DefinitionError(
                    f"step({target.__qualname__}) is a reactor: use compose({target.__qualname__}, "
                    "...) to run it in this execution, or async_reactor(...) to run it apart",
                    option="target",
                )
            raise DefinitionError(f"step() takes a Step subclass, got {target!r}", option="target")
        return StepSpec(target, arguments, where)
    if target is not None and inspect.isfunction(target):
        return InlineStepSpec(target, {}, where)
    if target is not None:
        raise DefinitionError(
            f"step() takes a Step subclass or decorates a method, got {target!r}", option="target"
        )
    retries = arguments.pop("retries", None)
    inputs = arguments.pop("inputs", ())

    def decorate(function: Callable[..., Any]) -> InlineStepSpec:
        if not inspect.isfunction(function):
            raise DefinitionError(
                f"@step(...) decorates a method (self, args, context), got {function!r}",
                option="target",
            )
        return InlineStepSpec(function, arguments, where, retries=retries, inputs=inputs)

    return decorate
