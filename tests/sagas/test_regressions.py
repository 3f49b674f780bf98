"""Counterexamples the saga model found, kept as named regression tests (minimal cases).

Each spells out the generated case the model shrank to and asserts the model finds nothing
wrong with it, plus the specific expectation in plain words. In-process cases run here;
cases that need a worker (parallel map elements as deliveries of their own) are in
test_regressions_workers.py.
"""

from __future__ import annotations

import pytest

from reactor_app.exceptions import ExecutionNotRetryable
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.sagas.checker import Case
from tests.sagas.driver import run_case
from tests.sagas.model_reactors import SagaScript, ledger, reactor_for, write_script

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_body_that_completes_after_a_cancel_is_undone_with_the_others() -> None:
    """Issue 30 (a): reserve (undo) → charge (undo only) → email; a cancel arrives while
    ``charge``'s body runs and the body then returns Success. The charge completed: it is undone
    (newest first, before the reservation), never left standing, never "compensated"."""
    case = Case(
        shape=("tux", "tux", "tnx"),
        items=1,
        script=SagaScript(cancel="s2", cancel_mode="before"),
    )
    report = run_case(case)
    assert report.statuses == [ExecutionStatus.CANCELLED], report.explain(case)
    undone = [e["label"] for e in report.events if e["kind"] == "undo"]
    assert undone == ["s2", "s1"], report.explain(case)
    assert not report.problems, report.explain(case)


def test_a_retry_after_a_rollback_never_reuses_an_undone_result() -> None:
    """Issue 30 (b): three undoable steps, the last fails for good and the first two are
    undone. The default retry restarts at the first undone step, so the chain ends with each
    effect standing exactly once (today it reuses both undone results: they stand zero times)."""
    case = Case(
        shape=("tux", "tux", "tux"),
        items=1,
        script=SagaScript(fail={"s3": [1, 2]}),
        retries=((None, SagaScript()),),
    )
    report = run_case(case)
    assert report.statuses == [ExecutionStatus.FAILED, ExecutionStatus.SUCCEEDED]
    assert not report.problems, report.explain(case)


def test_a_retry_from_a_step_after_an_undone_one_is_refused_naming_it() -> None:
    """Issue 30 (b): ``retry(from_step="s3")`` after ``s1`` and ``s2`` were undone would reuse
    results whose effects are gone: refused, the error naming the undone steps."""
    case = Case(shape=("tux", "tux", "tux"), items=1)
    scenario = "regression-b-from-step"
    write_script(scenario, SagaScript(fail={"s3": [1, 2]}))
    result = reactor_for(case.shape).run(**case.inputs(scenario))
    assert result.status == ExecutionStatus.FAILED
    assert [e["label"] for e in ledger(scenario) if e["kind"] == "undo"] == ["s2", "s1"]
    failed = Execution.objects.get(pk=result.execution_id)
    write_script(scenario, SagaScript())
    with pytest.raises(ExecutionNotRetryable, match=r"s1.*s2|s2.*s1"):
        failed.retry(from_step="s3")


def test_a_second_cancel_keeps_the_first_reason() -> None:
    """Issue 30 (item 2): two cancels of a running execution — the first one's reason is the
    error's; the second is only recorded as an event (today the second replaces it)."""
    case = Case(
        shape=("tnx", "tnx", "tnx"),
        items=1,
        script=SagaScript(cancel="s1", cancel_mode="before", second_cancel=True),
    )
    report = run_case(case)
    assert report.statuses == [ExecutionStatus.CANCELLED], report.explain(case)
    assert Execution.objects.get(pk=report.roots[0]).error["reason"] == "first"
