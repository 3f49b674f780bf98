"""The order a rollback undoes in, across a tree's logs (``engine.undo_order``), and where a
settled async step enters a log (``engine.async_order.enter_settled``), on plain run objects:
the rule itself, without workers (tests/sagas/test_regressions_workers.py has it end to end).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from reactor_app.engine.async_order import enter_settled
from reactor_app.engine.state import AsyncChild, CompletedStep, ExecutionState
from reactor_app.engine.undo_order import plan_undos


class Run:
    """What the ordering reads of an ``ExecutionRun``: its state, parent, root and children."""

    def __init__(self, parent: Run | None = None) -> None:
        self.state = ExecutionState()
        self.parent = parent
        self.root: Run = parent.root if parent else self
        self.children: dict[str, Run] = {}

    def child_run(self, execution_id: str) -> Run | None:
        return self.children.get(execution_id)


def step(label: str, at: int | None, child: str | None = None) -> CompletedStep:
    return CompletedStep(step=label, kind="step", at=at, child_execution=child)


def entry(**marks: int) -> AsyncChild:
    return {"child": "e-a", "kind": "async_step", "args": {}, "timeout": 5.0, **marks}


def labels(run: Any, *, with_ancestors: bool = False) -> list[str]:
    return [undo.record.step for undo in plan_undos(run, with_ancestors=with_ancestors).undos]


def test_an_async_step_seen_ended_only_after_a_later_entry_goes_before_it() -> None:
    """Found by the saga model's soak: the async body returned before the step after it did,
    but its row was still being written when that step's entry entered the log, so nothing
    marked it; settled by the rollback, it went last and was undone first."""
    run = Run()
    run.state.completed = [step("s0", 100), step("s2", 200)]
    record = step("s1", None, child="e-a")
    enter_settled(run, entry(since=120), record, completed_at=150)
    assert [r.step for r in run.state.completed] == ["s0", "s1", "s2"]
    assert labels(run) == ["s2", "s1", "s0"]


def test_a_worker_clock_far_off_cannot_move_it_past_what_is_known() -> None:
    """Its own clock is kept between its dispatch (``since``) and when it was seen ended
    (``before_at``): a clock behind does not put it before its dispatch, nor one ahead after
    the entry it surely ended before."""
    behind, ahead = Run(), Run()
    for run in (behind, ahead):
        run.state.completed = [step("s0", 100), step("s2", 200), step("s3", 300)]
    enter_settled(behind, entry(since=150), step("s1", None, "e-a"), completed_at=5)
    enter_settled(ahead, entry(since=150, before_at=250), step("s1", None, "e-a"), 10**18)
    assert [r.step for r in behind.state.completed] == ["s0", "s1", "s2", "s3"]
    assert [r.step for r in ahead.state.completed] == ["s0", "s2", "s1", "s3"]


def test_a_log_without_stamps_keeps_its_own_order() -> None:
    run = Run()
    run.state.completed = [step("a", None), step("b", None), step("c", None)]
    assert labels(run) == ["c", "b", "a"]


STAMPS = st.lists(st.integers(1, 10**6), min_size=0, max_size=6, unique=True)


@given(parent=STAMPS, child=STAMPS, asyncs=STAMPS, split=st.integers(0, 6))
def test_a_tree_is_undone_newest_first_each_entry_once(
    parent: list[int], child: list[int], asyncs: list[int], split: int
) -> None:
    """A parent's log (plain entries, a succeeded composed child's entry, settled async steps)
    undoes the child's entries one by one, among the others by stamp; a composed child rolling
    back first takes its ancestors' async steps newer than its oldest entry, and only those."""
    child = [at for at in child if at not in parent]  # every stamp of a tree is its own
    asyncs = [at for at in asyncs if at not in set(parent) | set(child)]
    root = Run()
    composed = Run(parent=root)
    composed.state.completed = [step(f"c@{at}", at) for at in sorted(child)]
    root.children["e-child"] = composed
    plain = sorted(parent)
    before, after = plain[:split], plain[split:]
    compose_at = max(child + before, default=0) + 1
    log = [step(f"p@{at}", at) for at in before]
    log.append(CompletedStep(step="compose", kind="compose", child_execution="e-child"))
    log[-1].at = compose_at
    log += [step(f"p@{at}", at) for at in after if at > compose_at]
    log += [step(f"a@{at}", at, child=f"e-{at}") for at in asyncs]
    log.sort(key=lambda r: r.at or 0)
    root.state.completed = log
    everything = [r for r in log if r.kind != "compose"] + composed.state.completed
    expected = [r.step for r in sorted(everything, key=lambda r: r.at or 0, reverse=True)]
    assert labels(root) == expected

    # the composed child rolling back first (cancelled in it): its ancestors' async steps that
    # are newer than its oldest entry are undone among its own
    root.state.completed = [r for r in log if r.kind != "compose"]
    plan = labels(composed, with_ancestors=True)
    oldest = min(child, default=None)
    newer = [] if oldest is None else [f"a@{at}" for at in asyncs if at > oldest]
    mine = [r.step for r in composed.state.completed] + newer
    assert sorted(plan) == sorted(mine)
    assert plan == sorted(plan, key=lambda label: -int(label.split("@")[1]))


def test_a_maps_elements_are_undone_one_by_one_around_an_async_step() -> None:
    """A map's entry holds its elements, each with when its body returned; an async step that
    ended between two of them (placed before the map's entry, which is stamped when the map
    completed) is undone between them — and does not pull the earlier elements after it."""
    run = Run()
    elements = [
        {"label": f"m[{i}]", "args": {}, "result": i, "at": at}
        for i, at in enumerate((110, 130, 150))
    ]
    run.state.completed = [
        step("s0", 100),
        step("s1", 120, child="e-a"),
        CompletedStep(step="m", kind="map", elements=elements, at=160),
    ]
    undone = [
        (u.record.step if u.record.kind != "map" else u.record.elements[0]["label"])
        for u in plan_undos(run, with_ancestors=False).undos
    ]
    assert undone == ["m[2]", "m[1]", "s1", "m[0]", "s0"]
