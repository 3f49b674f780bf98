"""Counterexamples the saga model found on real Celery workers, kept as named regression tests
(the minimal generated case spelled out; their shapes are in ``REGRESSION_SHAPES``, which every
worker process builds at import)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.engine.dispatch import wake
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.sagas.checker import Case, check_run
from tests.sagas.driver import WORKER_TIMEOUT, Outside, run_case, tree_ledger, watch
from tests.sagas.model_reactors import (
    SagaScript,
    ledger,
    note_outside,
    reactor_for,
    write_script,
)
from tests.worker.helpers import wait_until

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

#: how long after a cancel request a body may still start: the flag is polled every
#: REACTOR_CANCEL_POLL (0.05 s) at most, plus a loaded machine's scheduling delays
POLL_TOLERANCE_NS = 200_000_000

WORKER_SETTINGS = {
    "REACTOR_CONTENTION_BACKOFF": [0.2, 1.0],
    "REACTOR_CONTENTION_CEILING": 200,
    "REACTOR_EXECUTION_CLAIM_TTL": 6,
    "REACTOR_SWEEP_AFTER": 3,
}


def test_an_async_step_nobody_reads_is_undone_in_its_place_not_first(worker: Any) -> None:
    """An ``async_step`` (undo) that no later step reads completes first; a plain step (undo)
    completes after it; the last step fails for good. Newest first means the plain step is
    undone before the async one. Found by the model: the async step's completion enters the
    rollback log only when the rollback settles it (``engine.settling.settle_children`` →
    ``settle_child`` appends it last), so it is undone first, whenever it completed."""
    case = Case(
        shape=("aux", "tux", "tux"),
        items=1,
        script=SagaScript(fail={"s3": [1, 2]}, work={"s2": 2.0}),
    )
    report = run_case(case, worker=True)
    assert report.statuses == [ExecutionStatus.FAILED], report.explain(case)
    done = [e["label"] for e in report.events if e["kind"] == "do"]
    assert done == ["s1", "s2"], report.explain(case)  # the async body ends while s2 works
    undone = [e["label"] for e in report.events if e["kind"] == "undo"]
    assert undone == ["s2", "s1"], report.explain(case)
    assert not report.problems, report.explain(case)


def test_an_async_step_nobody_reads_that_ends_last_is_undone_first(worker: Any) -> None:
    """The other side of the test above: the ``async_step`` works past the plain step after
    it, so it completed last and is undone first (its place in the rollback log is by
    completion, not by its place in the plan)."""
    case = Case(
        shape=("aux", "tux", "tux"),
        items=1,
        script=SagaScript(fail={"s3": [1, 2]}, work={"s1": 1.5}),
    )
    report = run_case(case, worker=True)
    assert report.statuses == [ExecutionStatus.FAILED], report.explain(case)
    done = [e["label"] for e in report.events if e["kind"] == "do"]
    assert done == ["s2", "s1"], report.explain(case)  # the async body ends after s2
    undone = [e["label"] for e in report.events if e["kind"] == "undo"]
    assert undone == ["s1", "s2"], report.explain(case)
    assert not report.problems, report.explain(case)


def test_a_dispatched_childs_context_names_its_trees_root(worker: Any) -> None:
    """``context.root_execution_id`` in the body of a parallel map element (its own delivery,
    a child row whose ``root`` is the tree's root) names the tree's root, as in every other
    body. Found by the model: it names the element's own execution (the element's run is built
    with no parent, so ``ExecutionRun.root`` is itself) — and the cancel poll of a running
    element reads ``(context.root_execution_id, context.execution_id)``, so a cancel of the
    tree is never seen at the element's checkpoints."""
    case = Case(shape=("tux", "pux", "tux"), items=2)
    report = run_case(case, worker=True)
    assert report.statuses == [ExecutionStatus.SUCCEEDED], report.explain(case)
    root = report.roots[0]
    elements = [e for e in ledger_of(report) if e["label"].startswith("s2[")]
    assert elements, report.explain(case)
    assert {e["execution"] for e in elements} != {root}  # each element runs as its own row
    assert all(str(Execution.objects.get(pk=e["execution"]).root_id) == root for e in elements)
    assert {e["context_root"] for e in elements} == {root}, elements


def ledger_of(report: Any) -> list[dict[str, Any]]:
    """The raw ledger (roots as the bodies' contexts named them, before ``tree_ledger``)."""
    scenario = report.scenario
    return [dict(e, context_root=e["root"]) for e in ledger(scenario)]


def test_cancelling_a_parked_parallel_map_starts_none_of_its_waiting_elements(
    worker: Any,
) -> None:
    """Issue 30 (c): a parallel map of three elements sharing one step lock (one runs, the
    others wait for the lock); the tree is cancelled while the first works (2 s, checking
    ``checkpoint()``). The waiting elements are cancelled without starting (today they start
    after the cancel and are then undone), and the working one stops at its next checkpoint
    (today it never sees the tree's cancel: see the test above) — nothing to undo."""
    case = Case(shape=("tux", "pul"), items=3, script=SagaScript(work={"s2[0]": 2.0}))
    report = run_case(case, worker=True, outside=Outside(label="s2[0]", action="cancel"))
    assert report.statuses == [ExecutionStatus.CANCELLED], report.explain(case)
    (asked,) = [e["t"] for e in report.events if e["kind"] == "cancel"]
    # a body may still start within a cancel poll (REACTOR_CANCEL_POLL, 0.05 s) of the request
    late = {
        e["label"]: round((e["t"] - asked) / 1e9, 2)
        for e in report.events
        if e["kind"] == "enter" and e["t"] > asked + POLL_TOLERANCE_NS
    }
    assert late == {}, report.explain(case)
    assert "s2[0]" not in {e["label"] for e in report.events if e["kind"] == "do"}
    assert not report.problems, report.explain(case)


def test_a_composed_child_killed_mid_body_is_continued_not_left_running(worker: Any) -> None:
    """Found by the model (kill variant): the worker child is SIGKILLed inside the first step
    of a composed child. The redelivery completes the root, but through a *second* child row:
    the first stays ``running`` for ever. ``engine.children.run_child`` records the new child's
    id in the parent's state (``state.children.composed``) in memory only and runs the child
    before the parent is checkpointed, so the redelivery does not know the child exists."""
    case = Case(shape=("tux", "cux", "tux"), items=1, script=SagaScript(work={"s2/c1": 1.5}))
    report = run_case(case, worker=True, outside=Outside(label="s2/c1", action="kill"))
    assert report.statuses == [ExecutionStatus.SUCCEEDED], report.explain(case)
    children = Execution.objects.filter(parent_id=report.roots[0])
    assert [c.status for c in children] == [ExecutionStatus.SUCCEEDED], report.explain(case)
    assert not report.problems, report.explain(case)


def test_a_composed_childs_completed_step_stands_once_after_a_kill(worker: Any) -> None:
    """The same cause, seen as an effect: killed inside the child's second step, the
    redelivery starts a new child that runs the first step again; the first run of it is never
    reused nor undone, so its effect stands twice in a succeeded run."""
    case = Case(shape=("tux", "cux", "tux"), items=1, script=SagaScript(work={"s2/c2": 1.5}))
    report = run_case(case, worker=True, outside=Outside(label="s2/c2", action="kill"))
    assert report.statuses == [ExecutionStatus.SUCCEEDED], report.explain(case)
    done = [e["label"] for e in report.events if e["kind"] == "do"]
    assert done.count("s2/c1") == 1, report.explain(case)
    assert not report.problems, report.explain(case)


def test_the_default_retry_is_not_refused_when_an_unread_async_step_failed_too(
    worker: Any,
) -> None:
    """Found by the model: an ``async_step`` nobody reads fails for good, and so does the last
    step. The run's error is the last step's (the async failure is only seen when the rollback
    settles it), so ``retry()`` — the default, "from the failed step" — starts at ``s3`` and is
    refused because ``s1`` before it has no recorded result: a failed execution whose default
    retry is refused. (``engine.retry.retry`` takes ``error.step`` as the default start; the
    earliest step without a result, or the first undone one, is where it can restart.)"""
    case = Case(
        shape=("aux", "tux", "tux"),
        items=1,
        script=SagaScript(fail={"s1": [1, 2], "s3": [1, 2]}),
        retries=((None, SagaScript()),),
    )
    report = run_case(case, worker=True)
    assert report.refusals == [], report.explain(case)
    assert report.statuses == [ExecutionStatus.FAILED, ExecutionStatus.SUCCEEDED]
    assert not report.problems, report.explain(case)


def test_a_halt_leaves_no_async_child_behind(worker: Any) -> None:
    """Found by the model (soak): an ``async_step`` is still working when a later step halts.
    The root ends ``halted`` at once and its async child is left ``pending``/``running`` (its
    body goes on after the run has ended). A failure waits for such children before its
    rollback (``engine.settling.settle_children``); the halt path of
    ``ExecutionRun._run_steps`` (``engine.executor``) returns without settling them."""
    case = Case(
        shape=("aux", "tux", "tux"),
        items=1,
        script=SagaScript(halt="s2", work={"s1": 1.5}),
    )
    report = run_case(case, worker=True)
    assert report.statuses == [ExecutionStatus.HALTED], report.explain(case)
    assert not report.problems, report.explain(case)


def test_an_async_step_that_ends_inside_a_cancelled_composed_child_is_undone_in_between(
    worker: Any,
) -> None:
    """Issue 30: an ``async_step`` (undo) completes after the first step of the composed child
    that follows it and before the second, in whose body the tree is cancelled. Newest first by
    completion is the async step, then the child's first step. Found by the model (shape
    ``('abx', 'cbs', 'pbl', 'pcs', 'tcs')``, a cancel during ``s2/c2``): the child rolled
    itself back at once, and only then did its parent wait for the async step and undo it —
    undone by kind, not by completion. The bodies are ordered by events (``after``)."""
    case = Case(
        shape=("aux", "cux", "tux"),
        items=1,
        script=SagaScript(
            cancel="s2/c2",
            cancel_mode="during",
            after={"s1": "s2/c2:enter", "s2/c2": "s1:ended"},
        ),
    )
    report = run_case(case, worker=True)
    assert report.statuses == [ExecutionStatus.CANCELLED], report.explain(case)
    done = [e["label"] for e in report.events if e["kind"] == "do"]
    assert done == ["s2/c1", "s1"], report.explain(case)
    undone = [e["label"] for e in report.events if e["kind"] == "undo"]
    assert undone == ["s1", "s2/c1"], report.explain(case)
    assert not report.problems, report.explain(case)


def test_an_async_step_that_ended_inside_a_composed_child_is_undone_in_between(
    worker: Any,
) -> None:
    """The same order when the composed child succeeded and a later step fails for good: the
    child's entry in its parent's log is one, its steps are in its own log, and the async step
    that ended between them is undone between them (it was undone after the whole child)."""
    case = Case(
        shape=("aux", "cux", "tux"),
        items=1,
        script=SagaScript(fail={"s3": [1, 2]}, after={"s1": "s2/c2:enter", "s2/c2": "s1:ended"}),
    )
    report = run_case(case, worker=True)
    assert report.statuses == [ExecutionStatus.FAILED], report.explain(case)
    done = [e["label"] for e in report.events if e["kind"] == "do"]
    assert done == ["s2/c1", "s1", "s2/c2"], report.explain(case)
    undone = [e["label"] for e in report.events if e["kind"] == "undo"]
    assert undone == ["s2/c2", "s1", "s2/c1"], report.explain(case)
    assert not report.problems, report.explain(case)


def test_an_async_step_that_ended_between_two_map_elements_is_undone_between_them(
    worker: Any,
) -> None:
    """The same for a map's elements (one entry in the log, the elements inside it). Found by
    the model's soak once the shapes were drawn again (a parallel map after an async step that
    retried): the async step was undone after every element of the map, though it completed
    before the last ones."""
    case = Case(
        shape=("aux", "mux", "tux"),
        items=3,
        script=SagaScript(fail={"s3": [1, 2]}, after={"s1": "s2[1]:enter", "s2[1]": "s1:ended"}),
    )
    report = run_case(case, worker=True)
    assert report.statuses == [ExecutionStatus.FAILED], report.explain(case)
    done = [e["label"] for e in report.events if e["kind"] == "do"]
    assert done == ["s2[0]", "s1", "s2[1]", "s2[2]"], report.explain(case)
    undone = [e["label"] for e in report.events if e["kind"] == "undo"]
    assert undone == ["s2[2]", "s2[1]", "s1", "s2[0]"], report.explain(case)
    assert not report.problems, report.explain(case)


def test_an_async_step_that_ended_before_a_map_failed_is_undone_before_its_elements(
    worker: Any,
) -> None:
    """A map's element fails for good after an async step completed that the earlier elements
    completed before. Found by the model's soak (a parallel map): the map undid its completed
    elements at once, as it failed, and only then did the run's rollback wait for the async
    step and undo it — after elements older than it. The elements now join the rollback log
    and the run's rollback undoes them in their place."""
    case = Case(
        shape=("aux", "mux", "tux"),
        items=3,
        script=SagaScript(fail={"s2[2]": [1, 2]}, after={"s1": "s2[1]:do", "s2[2]": "s1:ended"}),
    )
    report = run_case(case, worker=True)
    assert report.statuses == [ExecutionStatus.FAILED], report.explain(case)
    done = [e["label"] for e in report.events if e["kind"] == "do"]
    assert done == ["s2[0]", "s2[1]", "s1"], report.explain(case)
    undone = [e["label"] for e in report.events if e["kind"] == "undo"]
    assert undone == ["s1", "s2[1]", "s2[0]"], report.explain(case)
    assert not report.problems, report.explain(case)


def test_an_async_step_that_ended_before_a_composed_child_is_undone_after_it(
    worker: Any,
) -> None:
    """The other side: the async step completed before the child's first step, so it is
    undone after the child's steps (a cancel inside the child's second step)."""
    case = Case(
        shape=("aux", "cux", "tux"),
        items=1,
        script=SagaScript(cancel="s2/c2", cancel_mode="during", after={"s2/c1": "s1:ended"}),
    )
    report = run_case(case, worker=True)
    assert report.statuses == [ExecutionStatus.CANCELLED], report.explain(case)
    done = [e["label"] for e in report.events if e["kind"] == "do"]
    assert done == ["s1", "s2/c1"], report.explain(case)
    undone = [e["label"] for e in report.events if e["kind"] == "undo"]
    assert undone == ["s2/c1", "s1"], report.explain(case)
    assert not report.problems, report.explain(case)


def test_an_async_step_that_ended_while_a_composed_child_parked_is_undone_first(
    worker: Any,
) -> None:
    """The composed child parks before its second step (its lock is held here), the async
    step completes only then (after the child's first step), and the parked tree is cancelled:
    the rollback ends the parked child (``engine.settling.settle_composed``). Newest first is
    the async step, then the child's first step; the child was rolled back before its parent
    even waited for the async step."""
    case = Case(shape=("aux", "cul", "tux"), items=1, script=SagaScript(after={"s1": "go:signal"}))
    scenario = uuid.uuid4().hex[:12]
    root, _ = _cancel_parked_in_child(case, scenario)
    events = tree_ledger(scenario)
    explain = "\n".join(f"{e['label']} {e['kind']}" for e in events)
    assert Execution.objects.get(pk=root).status == ExecutionStatus.CANCELLED, explain
    assert [e["label"] for e in events if e["kind"] == "do"] == ["s2/c1", "s1"], explain
    assert [e["label"] for e in events if e["kind"] == "undo"] == ["s1", "s2/c1"], explain
    assert check_run(case, scenario, root, events) == [], explain


def _cancel_parked_in_child(
    case: Case, scenario: str, kill: Outside | None = None
) -> tuple[str, frozenset[int]]:
    """Run ``case`` (shape ``('aux', 'cul', 'tux')``) until the tree parks in ``s2/c2``'s
    lock (held here), let the async ``s1`` complete only then, and cancel the tree; with
    ``kill``, SIGKILL the worker child at that ledger entry meanwhile. Returns the root and
    the pids killed."""
    write_script(scenario, case.script)
    held = Coordinator().admit(
        [LockClaim(f"saga-lock:{scenario}:s2/c2", ttl=60)], Holder(owner="test-holder")
    )
    assert isinstance(held, Admitted), held
    stop, killed = threading.Event(), set[int]()
    watcher = threading.Thread(target=watch, args=(scenario, kill, killed, stop))
    try:
        execution = reactor_for(case.shape).run_async(**case.inputs(scenario))
        root = str(execution.pk)
        wait_until(
            lambda: Execution.objects.get(pk=root).status == ExecutionStatus.PARKED,
            30,
            message="the tree never parked in s2/c2's lock",
        )
        note_outside(scenario, root, "go", "signal")
        wait_until(
            lambda: any(e["label"] == "s1" and e["kind"] == "do" for e in ledger(scenario)),
            30,
            message="s1 never completed",
        )
        if kill is not None:
            watcher.start()
        note_outside(scenario, root, "s2/c2", "cancel")
        Execution.objects.get(pk=root).cancel("first", by="saga-model")
        execution.wait(timeout=WORKER_TIMEOUT)
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join()
        wake(Coordinator().release(held, "success").woken)
    assert kill is None or killed, "the worker child was never killed"
    return root, frozenset(killed)


def test_a_delivery_killed_while_settling_a_parked_composed_child_goes_on_with_it(
    worker: Any,
) -> None:
    """The test above, with the worker child SIGKILLed inside the undo of ``s2/c1``: the
    parked child's rollback (``engine.settling.settle_composed``) undid the async ``s1`` first
    (it completed after ``s2/c1``). That rollback is recorded in the child's row and counted
    hook by hook, so the redelivery undoes only ``s2/c1`` — not ``s1`` a second time."""
    case = Case(
        shape=("aux", "cul", "tux"),
        items=1,
        script=SagaScript(after={"s1": "go:signal"}, work={"s2/c1:undo": 1.5}),
    )
    scenario = uuid.uuid4().hex[:12]
    killer = Outside(label="s2/c1", action="kill", kind="undo-enter")
    root, killed = _cancel_parked_in_child(case, scenario, kill=killer)
    events = tree_ledger(scenario)
    explain = "\n".join(f"{e['label']} {e['kind']}" for e in events)
    assert ("s2/c1", "kill") in [(e["label"], e["kind"]) for e in events], explain
    assert Execution.objects.get(pk=root).status == ExecutionStatus.CANCELLED, explain
    assert [e["label"] for e in events if e["kind"] == "undo"] == ["s1", "s2/c1"], explain
    assert check_run(case, scenario, root, events, killed_pids=killed) == [], explain


def test_an_async_step_failing_on_its_own_while_the_run_halts_is_compensated_once(
    worker: Any,
) -> None:
    """Found by the model's soak once every shape was drawn again (a checker case, not an
    engine one): a halt comes while an ``async_step`` still runs, which then fails for good.
    The halt waits for it and stands (``engine.settling.settle_on_halt``); the async step's
    own body did not complete, so its own delivery compensated it, once — that is no rollback
    of the halted run, which undoes nothing."""
    case = Case(
        shape=("acx", "tux", "tux"),
        items=1,
        script=SagaScript(fail={"s1": [1, 2]}, halt="s2", after={"s1": "s2:enter"}),
    )
    report = run_case(case, worker=True)
    assert report.statuses == [ExecutionStatus.HALTED], report.explain(case)
    kinds = [(e["label"], e["kind"]) for e in report.events if e["kind"] in ("undo", "compensate")]
    assert kinds == [("s1", "compensate")], report.explain(case)
    assert not report.problems, report.explain(case)


def test_a_map_element_cancelled_in_its_failing_attempt_is_compensated_and_its_sibling_undone(
    worker: Any,
) -> None:
    """Found by the model's soak (shape ``mux pcx mbl aux``, the first two suppressed): a
    sequential map whose elements hold a step lock; element 1 asks for the run's cancel and
    fails its first attempt. The release after a failure does not read the cancel (only the
    one after a success does), so the attempt was put off for a retry, parked, and the next
    pass ended the run at its start — with no rollback at all: the map's completed element 0
    sat in the map's progress, which only a run with completed steps settled. Now the failed
    attempt is the final one (the cancel is read after a failed attempt before a retry is
    planned): compensated under its lock, then element 0 is undone."""
    case = Case(
        shape=("mbl",),
        items=2,
        script=SagaScript(fail={"s1[1]": [1]}, cancel="s1[1]", cancel_mode="before"),
    )
    report = run_case(case, worker=True)
    assert report.statuses == [ExecutionStatus.CANCELLED], report.explain(case)
    kinds = [(e["label"], e["kind"]) for e in report.events if e["kind"] in ("undo", "compensate")]
    assert kinds == [("s1[1]", "compensate"), ("s1[0]", "undo")], report.explain(case)
    assert [e["attempt"] for e in report.events if e["label"] == "s1[1]"] == [1, 1, 1, 1]
    assert not report.problems, report.explain(case)


def test_a_delivery_killed_inside_an_undo_goes_on_with_the_rollback(worker: Any) -> None:
    """Found by extending the model's kills into the rollback: ``s3`` fails for good, ``s2``
    is undone, and the worker child is SIGKILLed inside ``s1``'s undo. The redelivery resumed
    from the last checkpoint, which knew nothing of the rollback: it ran ``s3``'s body again
    (after the run had decided to fail) and, when it failed again, undid ``s2`` a second time;
    had the body succeeded, the run would have ended ``succeeded`` with ``s2`` undone. Now the
    rollback is recorded before it starts and counted hook by hook
    (``engine.rollback_progress``): the redelivery undoes only ``s1`` (its undo had not
    returned: it runs again, at least once) and ends ``failed`` with ``s3``'s error."""
    case = Case(
        shape=("tux", "tux", "tux"),
        items=1,
        script=SagaScript(fail={"s3": [1, 2]}, work={"s1:undo": 1.5}),
    )
    killer = Outside(label="s1", action="kill", kind="undo-enter")
    report = run_case(case, worker=True, outside=killer)
    assert report.statuses == [ExecutionStatus.FAILED], report.explain(case)
    kinds = [(e["label"], e["kind"]) for e in report.events]
    assert ("s1", "kill") in kinds, report.explain(case)
    assert kinds.count(("s3", "enter")) == 2, report.explain(case)  # never run again
    assert [label for label, kind in kinds if kind == "undo"] == ["s2", "s1"]
    row = Execution.objects.get(pk=report.roots[0])
    assert (row.error or {}).get("step") == "s3", row.error
    assert "rolling_back" not in (row.context or {}), row.context  # done: the record is gone
    assert not report.problems, report.explain(case)


def test_a_delivery_killed_inside_a_composed_childs_undo_goes_on_with_its_rollback(
    worker: Any,
) -> None:
    """Found by the model right after the test above was fixed (shape ``('pus', 'anx',
    'cbx')``, shrunk here): the composed child's second step fails for good and is
    compensated, and the worker child is SIGKILLed inside the undo of the child's first step.
    The child rolls itself back before its parent, and only the root's rollback was recorded:
    the redelivery continued the child from its checkpoint, ran the failed step's body again
    and compensated it a second time. A composed child now records its own rollback in its own
    row (``engine.rollback_progress``)."""
    case = Case(
        shape=("tux", "cbx", "tux"),
        items=1,
        script=SagaScript(fail={"s2/c2": [1, 2]}, work={"s2/c1:undo": 1.5}),
    )
    killer = Outside(label="s2/c1", action="kill", kind="undo-enter")
    report = run_case(case, worker=True, outside=killer)
    assert report.statuses == [ExecutionStatus.FAILED], report.explain(case)
    kinds = [(e["label"], e["kind"]) for e in report.events]
    assert ("s2/c1", "kill") in kinds, report.explain(case)
    assert kinds.count(("s2/c2", "enter")) == 2, report.explain(case)  # never run again
    assert kinds.count(("s2/c2", "compensate")) == 1, report.explain(case)
    assert [label for label, kind in kinds if kind == "undo"] == ["s2/c1", "s1"]
    assert not report.problems, report.explain(case)
