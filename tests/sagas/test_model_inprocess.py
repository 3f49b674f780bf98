"""The saga promise, checked by its model on generated workflows run in this process.

Each example is a random reactor (3 to 8 steps: plain steps, composed children, sequential and
``parallel=True`` maps — the latter run one element after another here — with undo, compensate,
both or neither, step locks and semaphores, ``where``-suppressed steps), a script of failures
at random attempts, a halt, and a cancel a body requests before or during its work, or that
another thread requests just after it (once or twice), then up to two retries from the failed
step or a random one. About half the examples also get a cancel from outside at a moment no body
chose (a delay after the first run or its retry started: between steps, in a backoff, during a
rollback, after the end). ``checker`` states what must hold after each run and after the retry
chain (see its docstring).
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
from tests.sagas.strategies import cases, outside_cancels

pytestmark = pytest.mark.django_db(transaction=True)

#: totals over the test, printed at its end (the closing note quotes them)
TOTALS: Counter[str] = Counter()


def test_the_saga_promise_holds_in_process(capsys: Any) -> None:
    @saga_settings("inprocess")
    @given(st.data())
    def example(data: Any) -> None:
        case: Case = data.draw(cases())
        outside = data.draw(st.none() | outside_cancels(case))
        report = run_case(case, outside=outside)
        TOTALS["workflows"] += 1
        TOTALS["actions"] += report.actions
        TOTALS.update(f"runs {status}" for status in report.statuses)
        assert not unignored(report), report.explain(case)

    batches = run_batches("inprocess", example)
    with capsys.disabled():
        print(
            f"\nsaga model in-process: {TOTALS['workflows']} workflows, "
            f"{TOTALS['actions']} operator actions, {batches} batch(es); "
            + ", ".join(f"{k}: {v}" for k, v in sorted(TOTALS.items()) if k.startswith("runs"))
        )
