"""Retry from a step (issue 17, item 2): ``Execution.retry(from_step=None)``.

A failed ``RetryableReactor`` run (``reserve`` → ``charge`` fails → rolled back) is retried:
the new execution is linked to the failed one, ``reserve`` (no undo: its effect stands) is not
run again and its recorded result is what ``charge`` and ``notify`` receive, and coordination
is admitted afresh (the reactor lock and the step lock acquired by the new execution, with
newer fencing tokens).
(A result whose undo ran is never reused: tests/worker/test_promise.py.) One test runs the
retry on a real worker process (a ``background`` reactor); the others run it
in this process (a synchronous reactor), or deliver it here as a worker would.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from reactor_app.engine.dispatch import deliver
from reactor_app.exceptions import ExecutionNotRetryable
from reactor_app.models import CoordinationEvent, Execution
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from reactor_app.testing import assert_not_locked
from tests.worker.helpers import wait_until
from tests.worker.reactors import records
from tests.worker.retry_reactors import (
    AfterReserveReactor,
    BackgroundRetryableReactor,
    RetryableReactor,
    set_failing,
)

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def ran(execution: Any) -> list[dict[str, Any]]:
    return [r for r in records("ran") if r["execution"] == str(execution.pk)]


def undone(execution: Any) -> list[str]:
    return [r["step"] for r in records("undone") if r["execution"] == str(execution.pk)]


def acquired(execution: Any, key: str) -> list[int | None]:
    return list(
        CoordinationEvent.objects.filter(
            execution=execution, key=key, kind=CoordinationEventKind.ACQUIRED
        )
        .order_by("at")
        .values_list("token", flat=True)
    )


def failed_run(reactor: Any, key: int) -> Execution:
    """A run whose ``charge`` fails: ``reserve`` ran (it has no undo: its effect stands)."""
    set_failing(key, True)
    result = reactor.run(key=key)
    assert result.status == ExecutionStatus.FAILED
    failed = Execution.objects.get(pk=result.execution_id)
    assert failed.error["step"] == "charge"
    assert [r["step"] for r in ran(failed)] == ["reserve", "charge"]
    assert undone(failed) == []
    set_failing(key, False)
    return failed


def assert_retried_from_charge(failed: Execution, retried: Execution, key: int) -> None:
    assert retried.status == ExecutionStatus.SUCCEEDED, retried.error
    assert retried.pk != failed.pk and retried.retry_of_id == failed.pk
    assert list(failed.retries.all()) == [retried]
    reservation = ran(failed)[0]["value"]
    # reserve not re-run: its recorded result is what the later steps got
    steps = ran(retried)
    assert [r["step"] for r in steps] == ["charge", "notify"]
    assert steps[0]["reservation"] == reservation
    assert steps[1]["reservation"] == reservation
    assert steps[1]["charge"] == f"charged:{reservation}"
    assert retried.to_result().value == f"charged:{reservation}"
    assert retried.context["retry"] == {
        "of": str(failed.pk),
        "from_step": "charge",
        "reused": ["reserve"],
        "by": retried.context["retry"]["by"],
    }
    # coordination taken afresh: both locks acquired by the new execution, newer tokens
    for lock in (f"order:{key}", f"charge:{key}"):
        [old] = acquired(failed, lock)
        [new] = acquired(retried, lock)
        assert new is not None and old is not None and new > old
        assert_not_locked(lock)
    # the failed row is left as it was
    failed.refresh_from_db()
    assert failed.status == ExecutionStatus.FAILED


def test_a_failed_run_is_retried_in_process_from_the_failed_step() -> None:
    failed = failed_run(RetryableReactor, 1)
    retried = failed.retry()
    assert_retried_from_charge(failed, retried, 1)


def test_a_retry_that_fails_again_rolls_back_only_what_it_ran() -> None:
    failed = failed_run(RetryableReactor, 2)
    set_failing(2, True)
    retried = failed.retry()
    assert retried.status == ExecutionStatus.FAILED
    assert [r["step"] for r in ran(retried)] == ["charge"]
    # the retry never ran reserve (reused), so never undoes it; charge failed (no undo)
    assert undone(retried) == []
    # and the failed retry can be retried in turn (the original cannot: it was retried)
    set_failing(2, False)
    again = retried.retry()
    assert again.status == ExecutionStatus.SUCCEEDED
    assert again.retry_of_id == retried.pk
    with pytest.raises(ExecutionNotRetryable, match="already retried"):
        failed.retry()


def test_a_named_step_reruns_from_there() -> None:
    failed = failed_run(RetryableReactor, 3)
    retried = failed.retry(from_step="reserve")
    assert retried.status == ExecutionStatus.SUCCEEDED
    assert [r["step"] for r in ran(retried)] == ["reserve", "charge", "notify"]
    assert ran(retried)[0]["value"] != ran(failed)[0]["value"]
    assert retried.context["retry"]["reused"] == []


def test_only_a_failed_execution_and_a_known_step_can_be_retried() -> None:
    failed = failed_run(RetryableReactor, 4)
    steps = "its steps are: reserve, charge, notify"
    with pytest.raises(ExecutionNotRetryable, match=rf"has no step 'refund'; {steps}"):
        failed.retry(from_step="refund")
    # notify never ran in the failed run: charge has no recorded result to reuse
    with pytest.raises(ExecutionNotRetryable, match="'charge' before it has no recorded result"):
        failed.retry(from_step="notify")
    assert not failed.retries.exists()
    succeeded = Execution.objects.get(pk=RetryableReactor.run(key=5).execution_id)
    with pytest.raises(ExecutionNotRetryable, match="only a failed execution"):
        succeeded.retry()


@pytest.fixture
def in_process(settings: Any) -> Iterator[None]:
    """Deliveries run here; what they enqueue goes to a queue nobody reads."""
    settings.REACTOR_CELERY_QUEUE = f"reactor-nobody-{uuid.uuid4().hex[:8]}"
    yield


def test_a_retry_on_a_worker_is_a_pending_outbox_row_a_delivery_runs(in_process: None) -> None:
    failed = failed_run(RetryableReactor, 6)
    retried = failed.retry(on_worker=True, by="operator")
    assert retried.status == ExecutionStatus.PENDING
    assert ran(retried) == []
    assert retried.context["retry"]["by"] == "operator"
    assert deliver(str(retried.pk))["outcome"] == "succeeded"
    retried.refresh_from_db()
    assert_retried_from_charge(failed, retried, 6)


def test_a_retry_runs_where_the_reactor_would_run_that_step(in_process: None) -> None:
    """``background = "after:reserve"``: from ``charge`` on a worker; from ``reserve`` here,
    handing off after it as a first run does."""
    set_failing(8, True)
    first = AfterReserveReactor.run(key=8)
    assert first.status == "handed_off"
    assert deliver(first.execution_id)["outcome"] == "failed"
    failed = Execution.objects.get(pk=first.execution_id)
    set_failing(8, False)

    retried = failed.retry()
    assert retried.status == ExecutionStatus.PENDING and ran(retried) == []
    assert deliver(str(retried.pk))["outcome"] == "succeeded"
    assert [r["step"] for r in ran(retried)] == ["charge", "notify"]

    set_failing(9, True)
    first = AfterReserveReactor.run(key=9)
    assert deliver(first.execution_id)["outcome"] == "failed"
    failed = Execution.objects.get(pk=first.execution_id)
    set_failing(9, False)
    again = failed.retry(from_step="reserve")
    # reserve ran here, in the call; the rest waits for a worker
    assert again.status == ExecutionStatus.PENDING
    assert [(r["step"], r["pid"]) for r in ran(again)] == [("reserve", os.getpid())]
    assert deliver(str(again.pk))["outcome"] == "succeeded"
    assert [r["step"] for r in ran(again)] == ["reserve", "charge", "notify"]


def test_a_background_reactor_is_retried_on_a_worker(worker: Any) -> None:
    set_failing(7, True)
    first = BackgroundRetryableReactor.run_async(key=7)
    result = first.wait(timeout=30)
    assert result.status == ExecutionStatus.FAILED
    first.refresh_from_db()
    assert [r["step"] for r in ran(first)] == ["reserve", "charge"]
    set_failing(7, False)

    retried = first.retry()
    assert retried.retry_of_id == first.pk
    wait_until(lambda: Execution.objects.get(pk=retried.pk).status == ExecutionStatus.SUCCEEDED, 30)
    retried.refresh_from_db()
    assert_retried_from_charge(first, retried, 7)
    # it ran in the worker process, not here
    assert os.getpid() not in {r["pid"] for r in ran(retried)}
