"""The planner: turns a reactor's step specs into a checked, ordered plan.

Dependencies come from ``from_result`` sources (and a map's ``over``). The plan is built when
the reactor class is created, so an unknown step, an unknown input or a cycle fails at import.
Steps run in dependency order; among steps that are ready together, declaration order wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from reactor_app.dsl.arguments import FromInput, FromResult, Source
from reactor_app.exceptions import DefinitionError

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor
    from reactor_app.dsl.step import StepSpec


@dataclass(frozen=True)
class Plan:
    order: tuple[str, ...]
    specs: dict[str, StepSpec]
    dependencies: dict[str, frozenset[str]]


def _sources(spec: StepSpec) -> list[tuple[str, Source]]:
    sources = list(spec.arguments.items())
    over = getattr(spec, "over", None)
    if over is not None:
        sources.append(("over", over))
    return sources


def build_plan(reactor: type[Reactor], specs: dict[str, StepSpec]) -> Plan:
    name = reactor.__qualname__
    inputs = set(reactor.inputs)
    dependencies: dict[str, frozenset[str]] = {}
    for step_name, spec in specs.items():
        for arg_name, source in _sources(spec):
            if isinstance(source, FromInput) and source.name not in inputs:
                raise DefinitionError(
                    f"{name}.{step_name}: argument {arg_name!r} reads from_input({source.name!r}) "
                    f"but {name}.inputs is {tuple(reactor.inputs)}; add {source.name!r} to inputs "
                    "or fix the name",
                    owner=f"{name}.{step_name}",
                    option=arg_name,
                )
            if isinstance(source, FromResult) and source.step not in specs:
                known = ", ".join(specs) or "none"
                raise DefinitionError(
                    f"{name}.{step_name}: argument {arg_name!r} reads from_result({source.step!r}) "
                    f"but {name} has no step {source.step!r} (steps: {known})",
                    owner=f"{name}.{step_name}",
                    option=arg_name,
                )
            if isinstance(source, FromResult) and source.step == step_name:
                raise DefinitionError(
                    f"{name}.{step_name}: argument {arg_name!r} reads the step's own result",
                    owner=f"{name}.{step_name}",
                    option=arg_name,
                )
        spec.check(reactor)
        dependencies[step_name] = frozenset(spec.dependencies())

    order = _topological_order(name, list(specs), dependencies)
    returns = reactor.returns
    if returns is not None and returns not in specs:
        raise DefinitionError(
            f"{name}.returns = {returns!r} names no step (steps: {', '.join(specs) or 'none'})",
            owner=name,
            option="returns",
        )
    return Plan(order=tuple(order), specs=dict(specs), dependencies=dependencies)


def _topological_order(
    reactor_name: str, declared: list[str], dependencies: dict[str, frozenset[str]]
) -> list[str]:
    done: list[str] = []
    remaining = list(declared)
    while remaining:
        ready = [s for s in remaining if dependencies[s] <= set(done)]
        if not ready:
            raise DefinitionError(
                f"{reactor_name}: the steps {', '.join(remaining)} depend on each other in a "
                f"cycle ({_describe_cycle(remaining, dependencies)}); break it by removing one "
                "from_result(...)",
                owner=reactor_name,
                option="steps",
            )
        done.append(ready[0])
        remaining.remove(ready[0])
    return done


def _describe_cycle(remaining: list[str], dependencies: dict[str, frozenset[str]]) -> str:
    start = remaining[0]
    path = [start]
    current = start
    while True:
        current = sorted(d for d in dependencies[current] if d in remaining)[0]
        if current in path:
            cycle = [*path[path.index(current) :], current]
            return " -> ".join(cycle)
        path.append(current)
