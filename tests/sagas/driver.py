"""Runs one generated case — a run and its operator's actions — and checks it with the model.

``run_case(case, worker=...)`` writes the case's script, runs the reactor of its shape
(``Reactor.run`` in this process, or ``run_async`` + ``wait`` on the module's real Celery
worker), applies the operator's actions (a cancel the script has a body request, or one the
test sends when a body is entered; then each retry, from the failed step or a chosen one,
under a rewritten script) and returns every problem the checker found, with the ledger, so a
failing example prints what happened.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from reactor_app.exceptions import ExecutionNotRetryable
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.sagas.checker import Case, check_chain, check_retry, check_run
from tests.sagas.model_reactors import ledger, note_outside, reactor_for, write_script

#: seconds a worker run (or retry) gets to end
WORKER_TIMEOUT = 90.0
#: for exploring while a known bug is open (never set in CI): problems matching this regular
#: expression are dropped, so the model looks for the others
IGNORE = os.environ.get("REACTOR_SAGA_IGNORE", "")


@dataclass
class Outside:
    """An action from outside the run, once the body of ``label`` is entered: a cancel (from
    this process, as the API would) or a SIGKILL of the worker child running that body.

    ``action="cancel_at"`` is a cancel at a moment no body chose: ``delay`` seconds after the
    ``run``-th run of the chain (0: the first run, 1: its first retry) noted its first ledger
    entry — between two steps, during a retry's backoff, a rollback or a retry, or after the
    run ended (then it changes nothing, and the model must agree)."""

    label: str | None
    action: str  # "cancel" | "kill" | "cancel_at"
    delay: float = 0.0
    run: int = 0
    #: the ledger entry of ``label`` that triggers a cancel or kill: its body's ``enter``, or
    #: a hook that works for a moment (``undo-enter``, ``compensate-enter``: ``SagaScript.work``)
    kind: str = "enter"


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    roots: list[str] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    actions: int = 0
    scenario: str = ""
    outside: Outside | None = None

    def explain(self, case: Case) -> str:
        lines = [f"case: {case}", f"outside: {self.outside}"]
        lines += [f"runs: {list(zip(self.roots, self.statuses, strict=False))}"]
        lines += [f"refused: {text}" for text in self.refusals]
        lines += ["ledger:"] + [
            f"  {e['root'][:8]} {e['label']:<8} {e['kind']:<10} attempt={e['attempt']}"
            for e in self.events
        ]
        lines += ["problems:"] + [f"  - {problem}" for problem in self.problems]
        return "\n".join(lines)


def tree_ledger(scenario: str) -> list[dict[str, Any]]:
    """The scenario's ledger, each entry's ``root`` the root of its execution's tree as the
    rows say: a dispatched child (a parallel map element, an async step) runs as a run of its
    own, whose ``context.root_execution_id`` is its own id, not its tree's root."""
    events = ledger(scenario)
    ids = {e["execution"] for e in events}
    roots = {
        str(pk): str(root or pk)
        for pk, root in Execution.objects.filter(pk__in=ids).values_list("pk", "root_id")
    }
    for event in events:
        event["root"] = roots.get(event["execution"], event["root"])
    return events


def _cancel(scenario: str, root: str, label: str) -> None:
    """Note the test's cancel in the ledger, then ask for it as the API would."""
    from django.db import connection

    note_outside(scenario, root, label, "cancel")
    try:
        Execution.objects.get(pk=root).cancel("first", by="saga-model")
    except Exception:  # it may have ended meanwhile: the model judges the end
        pass
    finally:
        connection.close()


def _tree_root(execution: str, roots: dict[str, str]) -> str | None:
    """The root of ``execution``'s tree, as the rows say (see ``tree_ledger``); None while
    its row is not written yet."""
    if execution not in roots:
        row = Execution.objects.filter(pk=execution).first()
        if row is None:
            return None
        roots[execution] = str(row.root_id or row.pk)
    return roots[execution]


def _watch_at(scenario: str, outside: Outside, fired: list[str], stop: threading.Event) -> None:
    """Wait for the ``outside.run``-th run of the chain to start, then cancel it
    ``outside.delay`` seconds later (see ``Outside``)."""
    from django.db import connection

    known: dict[str, str] = {}
    order: list[str] = []
    try:
        while not stop.is_set():
            for event in ledger(scenario):
                if event.get("outside"):
                    continue
                root = _tree_root(event["execution"], known)
                if root is not None and root not in order:
                    order.append(root)
            if len(order) > outside.run:
                if not stop.wait(outside.delay):
                    _cancel(scenario, order[outside.run], "(outside)")
                    fired.append(order[outside.run])
                return
            time.sleep(0.002)
    finally:
        connection.close()


def watch(scenario: str, outside: Outside, killed: set[int], stop: threading.Event) -> None:
    """Wait for ``outside.label``'s body to be entered, then cancel its root or kill its pid."""
    while not stop.is_set():
        for event in ledger(scenario):
            if event["label"] == outside.label and event["kind"] == outside.kind:
                if outside.action == "kill":
                    killed.add(event["pid"])
                    os.kill(event["pid"], signal.SIGKILL)
                    note_outside(scenario, event["root"], outside.label, "kill")
                else:
                    # the tree's root, as the rows say (see tree_ledger)
                    root = _tree_root(event["execution"], {})
                    assert root is not None, "a body ran in an execution with no row"
                    _cancel(scenario, root, outside.label)
                return
        time.sleep(0.02)


def _run(case: Case, scenario: str, *, worker: bool) -> str:
    reactor = reactor_for(case.shape)
    if worker:
        execution = reactor.run_async(**case.inputs(scenario))
        execution.wait(timeout=WORKER_TIMEOUT)
        return str(execution.pk)
    result = reactor.run(**case.inputs(scenario))
    return str(result.execution_id)


def run_case(case: Case, *, worker: bool = False, outside: Outside | None = None) -> Report:
    scenario = uuid.uuid4().hex[:12]
    report = Report(scenario=scenario, outside=outside)
    write_script(scenario, case.script)
    killed: set[int] = set()
    fired: list[str] = []
    stop = threading.Event()
    watcher = None
    if outside is not None and outside.action == "cancel_at":
        # watches the whole chain: its run may be a retry
        watcher = threading.Thread(target=_watch_at, args=(scenario, outside, fired, stop))
        watcher.start()
    elif outside is not None:
        watcher = threading.Thread(target=watch, args=(scenario, outside, killed, stop))
        watcher.start()
        report.actions += 1
    try:
        _chain(case, scenario, report, killed, worker=worker)
    finally:
        stop.set()
        if watcher is not None:
            watcher.join()
    report.actions += len(fired)
    report.events = tree_ledger(scenario)
    return report


def _chain(case: Case, scenario: str, report: Report, killed: set[int], *, worker: bool) -> None:
    """The run and its retries, each checked (into ``report``) once it ended."""
    root = _run(case, scenario, worker=worker)
    report.actions += int(case.script.cancel is not None) + int(case.script.second_cancel)
    row = Execution.objects.get(pk=root)
    report.roots.append(root)
    report.statuses.append(row.status)
    events = tree_ledger(scenario)
    report.problems += check_run(case, scenario, root, events, killed_pids=frozenset(killed))

    for from_step, script in case.retries:
        if row.status != ExecutionStatus.FAILED:
            break
        write_script(scenario, script)
        report.actions += 1
        try:
            again = row.retry(from_step=from_step, on_worker=worker)
        except ExecutionNotRetryable as refused:
            report.refusals.append(f"from_step={from_step}: {refused}")
            if from_step is None:
                report.problems.append(f"the default retry was refused: {refused}")
                break
            again = row.retry(on_worker=worker)
        if worker:
            again.wait(timeout=WORKER_TIMEOUT)
        again.refresh_from_db()
        reused = list((again.context.get("retry") or {}).get("reused", []))
        events = tree_ledger(scenario)
        report.problems += check_retry(case, events, root, reused)
        root, row = str(again.pk), again
        report.roots.append(root)
        report.statuses.append(row.status)
        report.problems += check_run(case, scenario, root, events, reused=reused)

    if len(report.roots) > 1 and row.status == ExecutionStatus.SUCCEEDED:
        report.problems += check_chain(case, report.roots, tree_ledger(scenario))


def unignored(report: Report) -> list[str]:
    """The report's problems less those ``REACTOR_SAGA_IGNORE`` matches (the generative tests
    only: a regression test always sees every problem)."""
    if not IGNORE:
        return report.problems
    return [problem for problem in report.problems if not re.search(IGNORE, problem)]
