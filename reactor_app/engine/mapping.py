"""``map_step``: one step (or composed reactor) per element of a list.

Each element is its own unit, labelled ``<step>[<index>]`` and coordinated on its own
arguments (``element()`` reads the element). Progress is kept per element in
``state.extra["map_progress"]``, so a park or a redelivery continues at the element it stopped
at. A failed element rolls back the elements that completed, newest first, and fails the step;
the whole map then sits in the rollback log as one entry whose elements are undone in reverse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reactor_app.dsl.arguments import PathError
from reactor_app.dsl.kinds import MapSpec
from reactor_app.engine.children import run_child
from reactor_app.engine.context import CompletedStep
from reactor_app.engine.rollback import undo_record
from reactor_app.engine.runner import StepOutcome, resolve_arguments
from reactor_app.exceptions import ArgumentResolutionError

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun


def run_map(run: ExecutionRun, spec: MapSpec) -> StepOutcome:
    """Run ``spec`` once per element, in order; the checkpoint is per element."""

    def bad_over(problem: str) -> StepOutcome:
        # an unreadable and a non-list ``over`` fail alike, naming the argument and its source
        return StepOutcome(
            "failed",
            error=ArgumentResolutionError(
                f"map_step {spec.name!r} of {run.reactor_path}: "
                f"over={spec.over.describe()}{problem}",
                reactor=run.reactor_path,
                step=spec.name,
                argument="over",
                source=spec.over.describe(),
            ),
        )

    try:
        items = spec.over.resolve(run.scope())
    except PathError as exc:
        return bad_over(f": {exc}")
    if not isinstance(items, (list, tuple)):
        return bad_over(f" must be a list, got {type(items).__name__}")
    progress = run.state.extra.setdefault("map_progress", {}).setdefault(
        spec.name, {"elements": [], "values": [], "index": 0}
    )
    while progress["index"] < len(items):
        index = progress["index"]
        label = f"{spec.name}[{index}]"
        try:
            args = resolve_arguments(
                spec,
                run.scope(items[index], with_element=True),
                run.reactor_path,
                default_to_inputs=not spec.is_reactor,
            )
        except ArgumentResolutionError as error:
            outcome = StepOutcome("failed", error=error)
        else:
            if spec.is_reactor:
                outcome = run_child(run, spec.target, args, label=label)
            else:
                outcome = run.run_unit(spec, spec.target, args, label)
        if outcome.status == "completed":
            record = outcome.record
            progress["elements"].append(
                {
                    "label": label,
                    "args": record.args if record else args,
                    "result": outcome.value,
                    "child_execution": record.child_execution if record else None,
                }
            )
        if outcome.status in ("completed", "skipped"):
            progress["values"].append(outcome.value)
            progress["index"] += 1
            run.persist()
            continue
        if outcome.status == "failed":
            # Roll back the iterations that completed, newest first, then fail the step.
            partial = CompletedStep(step=spec.name, kind="map", elements=progress["elements"])
            failures = list(outcome.rollback_failures) + undo_record(run, partial)
            run.state.extra["map_progress"].pop(spec.name, None)
            return StepOutcome("failed", error=outcome.error, rollback_failures=failures)
        return outcome  # parked or halted: keep the progress for a resume
    run.state.extra["map_progress"].pop(spec.name, None)
    record = CompletedStep(
        step=spec.name, kind="map", elements=progress["elements"], result=progress["values"]
    )
    return StepOutcome("completed", value=progress["values"], record=record)
