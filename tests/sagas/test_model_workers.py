"""The saga promise, checked by its model on generated workflows run on real Celery workers.

The same model as test_model_inprocess.py, on the module's real worker (prefork, two
children): ``parallel=True`` map elements and ``async_step`` bodies run as deliveries of their
own. Besides the cancels a body requests, a cancel comes from this process (as the API's would)
while a random body works, or at a random moment after a run or its retry started; the kill
variant SIGKILLs the worker child inside a random body (the delivery is redelivered once its
claim lapses) and the model must still hold.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.sagas.checker import Case
from tests.sagas.driver import run_case, unignored
from tests.sagas.profile import run_batches, saga_settings
from tests.sagas.strategies import cases, outside_actions, outside_cancels

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = {
    "REACTOR_CONTENTION_BACKOFF": [0.2, 1.0],
    "REACTOR_CONTENTION_CEILING": 200,
    # a killed delivery's claim lapses quickly, so its redelivery is seconds away
    "REACTOR_EXECUTION_CLAIM_TTL": 6,
    "REACTOR_SWEEP_AFTER": 3,
    # a sequential map writes every element: with batches, a kill re-runs the unwritten ones
    # (documented, docs/operations.md "Map elements in batches"), which the model counts as an
    # effect made twice
    "REACTOR_MAP_CHECKPOINT_EVERY": 1,
}

TOTALS: Counter[str] = Counter()


def test_the_saga_promise_holds_on_workers(worker: Any, capsys: Any) -> None:
    @saga_settings("worker")
    @given(st.data())
    def example(data: Any) -> None:
        case: Case = data.draw(cases(worker=True))
        outside = None
        if case.script.cancel is None and data.draw(st.booleans()):
            outside = data.draw(
                outside_actions(case, "cancel") | outside_cancels(case, worker=True)
            )
        report = run_case(case, worker=True, outside=outside)
        TOTALS["workflows"] += 1
        TOTALS["actions"] += report.actions
        TOTALS.update(f"runs {status}" for status in report.statuses)
        assert not unignored(report), report.explain(case)

    batches = run_batches("worker", example)
    with capsys.disabled():
        print(
            f"\nsaga model on workers: {TOTALS['workflows']} workflows, "
            f"{TOTALS['actions']} operator actions, {batches} batch(es); "
            + ", ".join(f"{k}: {v}" for k, v in sorted(TOTALS.items()) if k.startswith("runs"))
        )


def test_the_saga_promise_holds_when_a_worker_child_is_killed(worker: Any, capsys: Any) -> None:
    kills: Counter[str] = Counter()

    @saga_settings("kill")
    @given(st.data())
    def example(data: Any) -> None:
        case: Case = data.draw(cases(worker=True))
        case.script.cancel = None
        outside = data.draw(outside_actions(case, "kill"))
        if outside is not None and outside.kind == "enter":
            case.script.fail.pop(outside.label, None)
            if case.script.halt == outside.label:
                case.script.halt = None
        elif outside is not None:
            case.script.halt = None  # the kill is in the rollback: nothing halts before it
        for _from_step, script in case.retries:
            # a retry that reaches the label first is killed inside that body (or hook) too,
            # never at whatever moment its pid is in then: a kill just after a body returned,
            # before its end was written, re-runs it — the documented at-least-once window
            # (docs/operations.md, "Checkpoints"), which the checker would count as done twice
            script.work.update(case.script.work)
        report = run_case(case, worker=True, outside=outside)
        kills["workflows"] += 1
        if outside is not None and any(e["kind"] == "kill" for e in report.events):
            kills[f"killed at {outside.kind}"] += 1
        assert not unignored(report), report.explain(case)

    batches = run_batches("kill", example)
    with capsys.disabled():
        print(
            f"\nsaga model with kills: {kills.pop('workflows')} workflows, {batches} batch(es); "
            + ", ".join(f"{k}: {v}" for k, v in sorted(kills.items()))
        )
