"""The ``django.tasks`` backend (``reactor_app.tasks_backend``) on real Celery workers.

Task functions (``tests.worker.task_functions``) are enqueued through the task API itself
(``.enqueue()``, ``get_result``) against ``TASKS = {"default": {"BACKEND":
"reactor_app.tasks_backend.ReactorTaskBackend"}}`` (the demo settings): each call becomes a
tracked execution that a worker process runs, and the coordination decorators stacked on
``@task`` hold for the task's arguments.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from django_tasks import TaskResultStatus
from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist

from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from reactor_app.testing import assert_not_locked
from tests.worker import scenarios
from tests.worker import task_functions as tasks
from tests.worker.helpers import finished, overlapping
from tests.worker.reactors import records

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = {
    "REACTOR_CONTENTION_CEILING": 500,
    "REACTOR_CONTENTION_BACKOFF": [0.1, 0.5],
    # a run_after of a few seconds is then sent in hops (engine.countdowns)
    "REACTOR_LONGEST_COUNTDOWN": 1.0,
}


def test_an_enqueued_task_runs_on_a_worker_as_a_tracked_execution(worker: Any) -> None:
    result = tasks.add.enqueue(40)
    assert result.status == TaskResultStatus.READY
    execution = Execution.objects.get(pk=result.id)
    assert execution.reactor == "tests.worker.task_functions.add.reactor"
    assert execution.inputs["arguments"] == {"x": 40, "y": 2}

    finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42
    assert result.attempts == 1
    assert result.errors == []
    assert result.started_at is not None and result.finished_at >= result.started_at

    fetched = tasks.add.get_result(result.id)  # the task API's own lookup, from the row
    assert (fetched.status, fetched.return_value, fetched.kwargs) == (
        TaskResultStatus.SUCCESSFUL,
        42,
        {"x": 40, "y": 2},
    )
    assert Execution.objects.get(pk=result.id).status == ExecutionStatus.SUCCEEDED


def test_a_raising_task_reports_its_exception_class_and_traceback(worker: Any) -> None:
    result = finished(tasks.fails.enqueue("no such account"))
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1
    [error] = result.errors
    assert error.exception_class is ValueError
    assert "no such account" in error.traceback and "Traceback" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value


def test_positional_keyword_and_context_arguments_reach_the_function(worker: Any) -> None:
    shaped = finished(tasks.shaped.enqueue(1, "two", flag=True))
    assert shaped.return_value == {"values": [1, "two"], "named": {"flag": True}, "tuple": [1, 2]}

    context = finished(tasks.with_context.enqueue(n=3))
    assert context.return_value == {"id": context.id, "attempt": 1, "n": 3}


def test_run_after_defers_the_run_and_the_sweeper_cannot_send_it_early(worker: Any) -> None:
    due = timezone.now() + timedelta(seconds=3)
    result = tasks.stamped.using(run_after=due).enqueue("later")
    execution = Execution.objects.get(pk=result.id)
    # the row's heartbeat is its due time: the sweeper only re-sends rows stale since then
    assert execution.heartbeat_at >= due - timedelta(milliseconds=1)

    finished(result, timeout=60)
    [stamp] = records("stamped")
    assert stamp["at"] >= due.timestamp() * 1e9
    assert result.started_at >= due
    assert result.task.run_after == due
    assert result.task.priority == 10


def test_a_run_after_longer_than_a_broker_holds_arrives_in_hops(worker: Any) -> None:
    scenarios.a_long_countdown_arrives_in_hops(worker)


def test_a_lock_stacked_on_task_serializes_one_accounts_calls(worker: Any) -> None:
    results = [tasks.locked.enqueue(account_id=5, hold=0.1) for _ in range(6)]
    results += [tasks.locked.enqueue(account_id=6, hold=0.1) for _ in range(2)]
    for result in results:
        assert finished(result, timeout=120).status == TaskResultStatus.SUCCESSFUL

    runs = records("locked")
    assert len(runs) == 8
    assert overlapping([r for r in runs if r["account_id"] == 5]) == []
    assert len({r["pid"] for r in runs}) >= 1
    assert_not_locked("task-acct:5")
    assert_not_locked("task-acct:6")


def test_a_semaphore_under_task_admits_at_most_its_limit(worker: Any) -> None:
    results = [tasks.limited.enqueue(hold=0.15) for _ in range(5)]
    for result in results:
        assert finished(result, timeout=120).status == TaskResultStatus.SUCCESSFUL
    runs = sorted(records("limited"), key=lambda r: r["start"])
    assert len(runs) == 5
    # never three at once (the worker has two processes, so two may overlap)
    for index, run in enumerate(runs):
        concurrent = [o for o in runs[index + 1 :] if o["start"] < run["end"]]
        assert len(concurrent) <= 1


def test_bad_calls_fail_at_enqueue_and_unknown_results_are_not_found(worker: Any) -> None:
    with pytest.raises(InvalidTaskError, match="add"):
        tasks.add.enqueue(1, 2, 3)
    with pytest.raises(InvalidTaskError, match="Unsupported type"):
        tasks.add.enqueue(1, object())
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result("not-a-uuid")
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result("00000000-0000-0000-0000-000000000000")
    assert Execution.objects.count() == 0  # nothing was stored, nothing sent
