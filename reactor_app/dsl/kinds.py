"""Step kinds beyond a plain step: composed reactors and mapped steps.

``compose(ChildReactor, **arguments)`` runs a child reactor inside this execution tree (same
root owner, fully part of rollback). ``map_step(StepOrReactor, over=source, **arguments)`` runs
once per element of ``over``; ``element()`` reads the current element, and each iteration is
coordinated on its own arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from reactor_app.dsl.arguments import Source
from reactor_app.dsl.step import Step, StepSpec
from reactor_app.exceptions import DefinitionError

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor


def _is_reactor(target: Any) -> bool:
    from reactor_app.dsl.reactor import Reactor

    return isinstance(target, type) and issubclass(target, Reactor)


class ComposeSpec(StepSpec):
    kind: ClassVar[str] = "compose"

    def step_class(self) -> type[Step] | None:
        return None

    def check(self, reactor: type[Reactor]) -> None:
        super().check(reactor)
        where = f"{reactor.__qualname__}.{self.name}"
        child_inputs = set(self.target.inputs)
        unknown = sorted(set(self.arguments) - child_inputs)
        if unknown:
            raise DefinitionError(
                f"{where}: {self.target.__qualname__} has inputs {tuple(self.target.inputs)} but "
                f"is given {unknown}",
                owner=where, option=unknown[0],
            )


class MapSpec(StepSpec):
    kind: ClassVar[str] = "map"

    def __init__(self, target: Any, over: Source, arguments: dict[str, Any], where: Any) -> None:
        super().__init__(target, arguments, where)
        self.over = over

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
    target: Any, /, *, over: Source | None = None, where: Any = None, **arguments: Any
) -> MapSpec:
    """Run ``target`` (a Step or Reactor subclass) once per element of ``over``."""
    if not (_is_reactor(target) or (isinstance(target, type) and issubclass(target, Step))):
        raise DefinitionError(
            f"map_step() takes a Step or Reactor subclass, got {target!r}", option="target"
        )
    if not isinstance(over, Source):
        raise DefinitionError(
            "map_step() needs over=from_input(...) or over=from_result(...) naming the list to "
            f"map over, got {over!r}",
            option="over",
        )
    return MapSpec(target, over, arguments, where)
