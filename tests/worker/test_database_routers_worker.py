"""Real workers in a project whose router sends reads to a replica (``reactor_app.databases``).

The worker and this process both run with ``tests.integration.routers.ReadsFromAReplica``, the
primary/replica router of Django's documentation for this app's models, whose replica is an
alias the settings do not have: a read of the app's rows sent there fails at once. Before,
every delivery read its row there. Here a contended run parks and completes, parked waiters
are woken by the release, and a task's result is read back — every read where the rows are
written. tests/integration/test_database_routers.py has the rest in this process.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django_tasks import TaskResultStatus

from tests.worker import scenarios
from tests.worker import task_functions as tasks
from tests.worker.helpers import finished

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = {
    "DATABASE_ROUTERS": ["tests.integration.routers.ReadsFromAReplica"],
    "REACTOR_CONTENTION_CEILING": 500,
    # parked waiters are woken by the release long before their backoff requeue
    "REACTOR_CONTENTION_BACKOFF": [15.0, 30.0],
    "REACTOR_WORKER_WAIT": 0,
}


def test_a_contended_run_parks_and_completes_reading_where_it_writes(worker: Any) -> None:
    assert WORKER_SETTINGS["DATABASE_ROUTERS"] == settings.DATABASE_ROUTERS
    scenarios.contention_parks_then_completes(account=51)


def test_parked_waiters_are_woken_reading_where_they_write(worker: Any) -> None:
    scenarios.parked_waiters_are_woken(account=52)


def test_a_tasks_result_is_read_where_it_is_written(worker: Any) -> None:
    result = finished(tasks.add.enqueue(40))
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 42
    assert tasks.add.get_result(result.id).return_value == 42
