"""Hypothesis strategies of the saga model: workflows (shapes, inputs) and operator actions."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.sagas.checker import Case
from tests.sagas.driver import Outside
from tests.sagas.model_reactors import COORDS, HOOKS, WORKER_SHAPES, SagaScript

#: what the failures of an effect look like: the first attempt only (the retry succeeds), or
#: every attempt (the step fails for good)
FAILURES = ([1], [1, 2])


def slot(kinds: str) -> st.SearchStrategy[str]:
    return st.tuples(st.sampled_from(kinds), st.sampled_from(HOOKS), st.sampled_from(COORDS)).map(
        "".join
    )


@st.composite
def scripts(draw: Any, labels: list[str], cancellable: list[str]) -> SagaScript:
    """A script over the plan's effect ``labels``; a body requests a cancel only among
    ``cancellable`` (bodies run in their root's own delivery)."""
    fail = draw(
        st.dictionaries(st.sampled_from(labels), st.sampled_from(FAILURES), max_size=2)
        if labels
        else st.just({})
    )
    cancel = draw(st.none() | st.sampled_from(cancellable)) if cancellable else None
    halt = draw(st.none() | st.none() | st.sampled_from(labels)) if labels else None
    return SagaScript(
        fail=fail,
        cancel=cancel,
        cancel_mode=draw(st.sampled_from(["before", "during", "later"])),
        second_cancel=draw(st.booleans()) if cancel else False,
        halt=halt,
    )


@st.composite
def retry_scripts(draw: Any, labels: list[str]) -> SagaScript:
    """The script a retry runs under: usually nothing fails any more, sometimes one body does."""
    fail = draw(
        st.just({})
        | st.dictionaries(st.sampled_from(labels), st.sampled_from(FAILURES), max_size=1)
    )
    return SagaScript(fail=fail)


@st.composite
def cases(draw: Any, *, worker: bool = False) -> Case:
    if worker:
        shape = draw(st.sampled_from(WORKER_SHAPES))
    else:
        shape = tuple(draw(st.lists(slot("tcmp"), min_size=3, max_size=8)))
    slots = [f"s{index}" for index in range(1, len(shape) + 1)]
    items = draw(st.integers(1, 3))
    suppress = tuple(draw(st.lists(st.sampled_from(slots), unique=True, max_size=2)))
    case = Case(shape=shape, items=items, suppress=suppress)
    labels = [effect.label for effect in case.plan()]
    # a body of a parallel map element or of an async step runs in a delivery of its own: its
    # root parks meanwhile, and a cancel requested from inside would wait for that very body
    own_delivery = {s for s, code in zip(slots, shape, strict=True) if worker and code[0] in "pa"}
    cancellable = [e.label for e in case.plan() if e.slot not in own_delivery]
    case.script = draw(scripts(labels, cancellable))
    from_steps = st.none() | st.sampled_from(slots)
    case.retries = tuple(
        draw(st.lists(st.tuples(from_steps, retry_scripts(labels)), max_size=2)) if labels else []
    )
    return case


@st.composite
def outside_actions(draw: Any, case: Case, action: str) -> Outside | None:
    """A cancel (or a kill) from outside while one body works for a moment — or, for a kill,
    while an undo or a compensate works (the rollback's own hooks), the case made to roll
    back there: a later effect fails for good, or the compensated one does."""
    plan = case.plan()
    if not plan:
        return None
    kind = "enter"
    if action == "kill":
        kind = draw(st.sampled_from(["enter", "enter", "undo-enter", "compensate-enter"]))
    hooked = (
        [e for e in plan if (e.undoable if kind == "undo-enter" else e.compensable)]
        if kind != "enter"
        else plan
    )
    if not hooked:
        kind, hooked = "enter", plan
    effect = draw(st.sampled_from(hooked))
    label = effect.label
    if kind == "enter":
        case.script.work[label] = 0.6 if action == "cancel" else 1.5
        return Outside(label=label, action=action)
    case.script.work[f"{label}:{kind.removesuffix('-enter')}"] = 1.5
    # nothing else fails, so the run reaches that hook: the kill lands inside the rollback
    case.script.fail.clear()
    if kind == "compensate-enter":
        case.script.fail[label] = [1, 2]
    else:
        later = [e.label for e in plan[plan.index(effect) + 1 :]]
        if later:
            case.script.fail[draw(st.sampled_from(later))] = [1, 2]
    return Outside(label=label, action=action, kind=kind)


#: seconds after a run's first ledger entry that a ``cancel_at`` comes, in this process (a
#: run takes milliseconds, a failed attempt's backoff ``RETRY_DELAY``) and on a worker (a
#: run takes a second or more: deliveries, parks, requeues)
CANCEL_DELAYS = {
    False: (0.0, 0.001, 0.005, 0.02, 0.05, 0.1, 0.2, 0.3),
    True: (0.0, 0.05, 0.2, 0.5, 1.0, 2.0),
}


@st.composite
def outside_cancels(draw: Any, case: Case, *, worker: bool = False) -> Outside:
    """A cancel from outside at a moment no body chose (``Outside``, ``cancel_at``): a fixed
    delay or any in between, after the first run or, when the case retries, its first retry."""
    delays = CANCEL_DELAYS[worker]
    delay = draw(st.sampled_from(delays) | st.floats(0.0, max(delays)))
    run = draw(st.sampled_from([0, 0, 1])) if case.retries else 0
    return Outside(label=None, action="cancel_at", delay=delay, run=run)
