"""The hand-off guard (docs/design.md §2.4): no hand-off to a worker that would wait for us.

Ownership never crosses a process hand-off, so handing an ``async_step`` or ``async_reactor`` to
a worker while this execution holds a lock (or a limit-1 semaphore) the dispatched work
declares would deadlock: the worker could never take the key its own dispatcher holds.
``guard_hand_off`` refuses that before anything is created or enqueued (for a parallel
``map_step``, per element). Keys known only once the dispatched work runs (from results, per
element) are checked there, against the owners that handed the tree off
(``guard_dispatcher_keys``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from reactor_app.coordination import primitives
from reactor_app.dsl.arguments import FromInput, Scope, Value
from reactor_app.dsl.declarations import Declaration, LockDeclaration, SemaphoreDeclaration
from reactor_app.dsl.kinds import AsyncReactorSpec, AsyncStepSpec, MapSpec
from reactor_app.dsl.step import StepSpec
from reactor_app.exceptions import HandOffRefused
from reactor_app.models import Execution
from reactor_app.status import CoordinationEventKind
from reactor_app.tracking import record_coordination

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun


def _exclusive(declaration: Declaration) -> bool:
    """Declarations that deadlock when the dispatcher holds their key: locks, limit-1 semaphores."""
    if isinstance(declaration, LockDeclaration):
        return True
    # a named limit counts as it is now (an operator may lower it to 1 live)
    return isinstance(declaration, SemaphoreDeclaration) and declaration.effective_limit() == 1


def _keys(
    declarations: Iterable[Declaration], args: dict[str, Any], reactor: str, step: str | None
) -> list[tuple[str, str, str | None]]:
    found = []
    for declaration in declarations:
        if _exclusive(declaration):
            key = declaration.compute_key(args, reactor=reactor, step=step)
            found.append((declaration.primitive, key, step))
    return found


def dispatched_keys(spec: StepSpec, args: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """``(primitive, key, declared_by)`` of the exclusive keys the dispatched work will take.

    For an ``async_step``: the step's own declarations, keyed on its arguments. For an
    ``async_reactor``: the child's reactor-level declarations (keyed on its inputs, the
    arguments) and those of its steps whose arguments come from inputs and constants alone —
    the only step keys knowable before the child runs.
    """
    if isinstance(spec, (AsyncStepSpec, MapSpec)):  # a parallel map's element is one step
        return _keys(
            spec.declarations.ordered(), args, spec.owner.path() if spec.owner else "", spec.name
        )
    assert isinstance(spec, AsyncReactorSpec)
    child = spec.target
    found = _keys(child.declarations().ordered(), args, child.path(), None)
    for name, child_spec in child.steps.items():
        step_class = child_spec.step_class()
        if step_class is None or not child_spec.declarations:
            continue
        if not all(isinstance(s, (FromInput, Value)) for s in child_spec.arguments.values()):
            continue
        scope = Scope(args, {})
        step_args = (
            {n: s.resolve(scope) for n, s in child_spec.arguments.items()}
            if child_spec.arguments
            else dict(args)
        )
        found.extend(_keys(child_spec.declarations.ordered(), step_args, child.path(), name))
    return found


def guard_hand_off(run: ExecutionRun, spec: StepSpec, args: dict[str, Any]) -> None:
    """Raise ``HandOffRefused`` if the dispatched work declares a key this execution holds."""
    for primitive, key, declared_by in dispatched_keys(spec, args):
        held = run.held_keys.holds(primitive, key)
        if not held:
            continue
        holding_steps = [s for s in held.get("steps", []) if s]
        holder_where = (
            f"its step {holding_steps[-1]!r}" if holding_steps else f"its reactor-level {primitive}"
        )
        target = spec.target.__qualname__
        in_target = ""
        if declared_by and declared_by != spec.name:
            in_target = f" (step {declared_by!r} of {target})"
        kind = _hand_off_kind(spec)
        message = (
            f"step {spec.name!r} of {run.reactor_path}: handing {target} to a worker "
            f"({kind}) would deadlock: it declares {primitive} {key!r}{in_target}, which this "
            f"execution (owner {run.owner}) already holds through {holder_where}, and ownership "
            "never crosses a process hand-off. Nothing was enqueued. Remedies: run it in this "
            f"execution instead (compose({target}, ...) for a reactor, step({target}, ...) for "
            "a step — the same owner re-enters the key), narrow one of the keys so they "
            "differ, or release the outer hold before handing off"
        )
        holder = {
            "owner": run.owner,
            "execution": run.root.execution_id,
            "step": holding_steps[-1] if holding_steps else None,
        }
        record_coordination(
            CoordinationEventKind.HANDOFF_REFUSED,
            primitive=primitive,
            key=key,
            owner=run.owner,
            step=spec.name,
            reactor=run.reactor_path,
            execution_id=run.execution_id,
            holder=holder,
            target=target,
            handoff=kind,
        )
        raise HandOffRefused(
            message,
            reactor=run.reactor_path,
            step=spec.name,
            key=key,
            primitive=primitive,
            holder=holder,
        )


def _hand_off_kind(spec: StepSpec) -> str:
    if isinstance(spec, MapSpec):
        return "map_step(parallel=True)"
    return "async_step" if isinstance(spec, AsyncStepSpec) else "async_reactor"


def dispatcher_owners(run: ExecutionRun) -> list[str]:
    """The owners of the executions that handed ``run``'s tree off through ``async_reactor``
    (nearest first); empty for every other tree. Looked up once per delivery."""
    root = run.root
    cached = getattr(root, "_dispatcher_owners", None)
    if cached is not None:
        return list(cached)
    owners: list[str] = []
    execution = root.execution
    seen: set[str] = set()
    while execution.parent_id is not None and str(execution.root_id) == str(execution.id):
        # an async_reactor child is a tree of its own whose parent is its dispatcher
        parent = Execution.objects.filter(pk=execution.parent_id).only("id", "root", "parent")
        found = parent.first()
        if found is None:
            break
        owner = str(found.root_id or found.id)
        if owner in seen:
            break
        seen.add(owner)
        owners.append(owner)
        execution = Execution.objects.filter(pk=owner).only("id", "root", "parent").first()
        if execution is None:
            break
    root._dispatcher_owners = owners
    return list(owners)


def guard_dispatcher_keys(
    run: ExecutionRun, spec: StepSpec, args: dict[str, Any], label: str
) -> None:
    """``HandOffRefused`` when a step of an ``async_reactor`` child declares an exclusive key
    its dispatcher still holds — a key that depends on a result or a map element, so the
    dispatcher's own guard (``guard_hand_off``) could not compute it. Waiting would wait for
    an execution that is itself waiting for this one."""
    exclusive = [d for d in spec.declarations.ordered() if _exclusive(d)]
    if not exclusive:
        return
    owners = dispatcher_owners(run)
    if not owners:
        return
    for primitive, key, _ in _keys(exclusive, args, run.reactor_path, label):
        holders = primitives.holding(primitive).holders(key)
        dispatcher = next((o for o in owners if o in holders), None)
        if dispatcher is None:
            continue
        holder_info = {"owner": dispatcher, "execution": dispatcher, "step": None}
        record_coordination(
            CoordinationEventKind.HANDOFF_REFUSED,
            primitive=primitive,
            key=key,
            owner=run.owner,
            step=label,
            reactor=run.reactor_path,
            execution_id=run.execution_id,
            holder=holder_info,
            target=run.reactor_path,
            handoff="async_reactor",
        )
        raise HandOffRefused(
            f"step {label!r} of {run.reactor_path}: it declares {primitive} {key!r}, which "
            f"execution {dispatcher} holds — the execution that handed this run to a worker "
            "(async_reactor). It would wait for an execution that waits for it, and ownership "
            "never crosses a process hand-off. Remedies: compose(...) the child instead (the "
            "same owner re-enters the key), narrow one of the keys so they differ, or release "
            "the outer hold before handing off",
            reactor=run.reactor_path,
            step=label,
            key=key,
            primitive=primitive,
            holder=holder_info,
        )
