"""A project whose ``DATABASE_ROUTERS`` send reads to a replica (``reactor_app.databases``).

Before, the app's managers read where the router sent reads. With the primary/replica router
of Django's documentation, a delivery looked for the row ``run_async`` had just written on the
replica, found nothing and reported the execution "missing" — as did every delivery the
sweeper sent after it, so the run never ran; the admin's execution page read the row's parent
there too. Here the replica is an alias the settings do not have (``tests/integration/
routers.py``): a read of the app's rows sent there fails at once. The property: every way a run
is started, run, waited for, failed, retried, cancelled, swept and shown reads its rows where
they are written. And a router that *writes* the app's rows elsewhere than ``default`` is
refused by ``manage.py check`` (``reactor_app.E050``) — those writes would miss the
transactions and ``on_commit`` hooks of ``default`` that the outbox relies on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.apps import apps
from django.test import Client, override_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from reactor_app import Failure, Reactor, Step, from_input, step
from reactor_app.checks import check_write_database
from reactor_app.engine.dispatch import deliver
from reactor_app.engine.sweeper import sweep
from reactor_app.models import Execution, StepRun
from reactor_app.retention import purge_finished
from reactor_app.status import ExecutionStatus
from tests.integration.echo import EchoReactor
from tests.integration.pages import operator_pages
from tests.integration.routers import ReadsFromAReplica, WritesElsewhere

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def replica_router(nobody_queue: str) -> Iterator[None]:
    with override_settings(DATABASE_ROUTERS=[ReadsFromAReplica()]):
        yield


def test_a_run_reads_its_rows_where_they_are_written(
    replica_router: None, django_user_model: Any
) -> None:
    assert EchoReactor.run(x=1).value == 1  # in this process

    execution = EchoReactor.run_async(x=2)  # on a worker: the delivery is the worker's body
    assert deliver(str(execution.pk))["outcome"] == "succeeded"
    assert execution.wait(timeout=5).value == 2
    assert execution.step_runs.get(step="echo").status == "succeeded"

    cancelled = EchoReactor.run_async(x=3)
    cancelled.cancel("no longer wanted", by="ops")
    deliver(str(cancelled.pk))
    assert Execution.objects.get(pk=cancelled.pk).status == ExecutionStatus.CANCELLED

    sweep()
    assert purge_finished(0, dry_run=True).executions >= 2

    client = Client()
    client.force_login(django_user_model.objects.create_superuser("router", password="pw"))
    for url in operator_pages(execution.pk):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)


class Refuse(Step):
    inputs = ("x",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Failure(f"refused {args['x']}")


class RefusingReactor(Reactor):
    inputs = ("x",)
    refuse = step(Refuse, x=from_input("x"))


def test_a_failed_run_is_retried_and_read_where_it_is_written(replica_router: None) -> None:
    failed = RefusingReactor.run_async(x=1)
    deliver(str(failed.pk))
    failed.refresh_from_db()
    assert failed.status == ExecutionStatus.FAILED
    retried = failed.retry(by="ops")
    assert retried.retry_of == failed  # the forward relation, read through the app's manager
    assert StepRun.objects.filter(execution=failed).exists()


MODELS = sorted(model._meta.label for model in apps.get_app_config("reactor_app").get_models())


@settings(max_examples=30, deadline=None)
@given(routed=st.sets(st.sampled_from(MODELS)))
def test_a_router_that_writes_the_apps_rows_elsewhere_is_refused_by_name(
    routed: set[str],
) -> None:
    with override_settings(DATABASE_ROUTERS=[WritesElsewhere(routed)]):
        problems = check_write_database()
    if not routed:
        assert problems == []
        return
    (problem,) = problems
    assert problem.id == "reactor_app.E050"
    named = set(problem.msg.split(": ", 1)[1].replace(" -> 'elsewhere'", "").split(", "))
    assert named == routed


def test_a_replica_for_reads_passes_the_check() -> None:
    with override_settings(DATABASE_ROUTERS=[ReadsFromAReplica()]):
        assert check_write_database() == []
