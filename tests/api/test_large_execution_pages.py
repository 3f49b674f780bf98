"""An execution with thousands of units (a big ``map_step``) still renders as a page: the admin
shows its first rows and says how many there are, the API's detail carries the first step runs
and a count, and all of them are paged at ``executions/<id>/step-runs/``."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from reactor_app.api.serializers import DETAIL_STEP_RUNS
from reactor_app.engine.progress import ProgressStore
from reactor_app.engine.state import CompletedStep, ExecutionState
from reactor_app.models import Execution, StepRun
from reactor_app.status import ExecutionStatus, StepRunKind, StepRunStatus
from tests.api import users

pytestmark = pytest.mark.django_db

staff_client = users.staff_client
staff_user = users.staff_user

UNITS = 450
API = "/api/reactor/executions"


def big_execution() -> Execution:
    """A finished map of ``UNITS`` elements, as the engine leaves it."""
    values = [{"line": n, "sku": f"sku-{n:05d}"} for n in range(UNITS)]
    state = ExecutionState(results={"lines": values}, next_index=1)
    execution = Execution.objects.start(
        reactor="shop.InvoiceReactor",
        inputs={"lines": list(range(UNITS))},
        status=ExecutionStatus.SUCCEEDED,
        context=state.to_json(),
        result=values,
    )
    now = timezone.now()
    StepRun.objects.bulk_create(
        StepRun(
            execution=execution,
            step=f"lines[{n}]",
            kind=StepRunKind.RUN,
            attempt=1,
            status=StepRunStatus.SUCCEEDED,
            started_at=now,
            finished_at=now,
        )
        for n in range(UNITS)
    )
    return execution


def test_the_admin_page_shows_the_first_rows_and_how_many_there_are(staff_client: Client) -> None:
    execution = big_execution()
    response = staff_client.get(f"/admin/reactor_app/execution/{execution.pk}/change/")
    assert response.status_code == 200
    page = response.content.decode()
    assert f"{UNITS} step runs" in page and "the first 100 of each below" in page
    shown = {int(n) for n in re.findall(r"lines\[(\d+)\]", page)}
    assert shown == set(range(100))  # step-run rows, not all of them
    assert "sku-00099" in page and "sku-00100" not in page  # result and state cut too
    assert f"{UNITS - 100} more" in page


def test_the_admin_engine_state_shows_what_is_kept_in_progress_rows(staff_client: Client) -> None:
    """A worker's checkpoints append results and rollback-log entries as progress rows, not
    into the context: the admin's "engine state" shows them (assembled), cut to a page."""
    execution = Execution.objects.start(
        reactor="shop.InvoiceReactor", inputs={}, status=ExecutionStatus.RUNNING
    )
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    for n in range(UNITS):
        state.results[f"line{n:04d}"] = f"sku-{n:05d}"
        state.completed.append(CompletedStep(f"line{n:04d}", "step"))
        if n % 50 == 49:
            store.write(state, {}, durable=False)
    assert "results" not in Execution.objects.get(pk=execution.pk).context
    page = staff_client.get(f"/admin/reactor_app/execution/{execution.pk}/change/")
    text = page.content.decode()
    assert "sku-00000" in text and "sku-00099" in text and "sku-00100" not in text
    assert f"{UNITS - 100} more" in text


def test_the_api_detail_carries_the_first_step_runs_and_a_count(staff_client: Client) -> None:
    execution = big_execution()
    detail = staff_client.get(f"{API}/{execution.pk}/").json()
    assert detail["step_runs_count"] == UNITS
    assert len(detail["step_runs"]) == DETAIL_STEP_RUNS


def test_all_step_runs_are_paged(staff_client: Client) -> None:
    execution = big_execution()
    seen: list[str] = []
    url: Any = f"{API}/{execution.pk}/step-runs/?page_size=200"
    while url:
        body = staff_client.get(url).json()
        assert body["count"] == UNITS
        assert len(body["results"]) <= 200
        seen.extend(row["step"] for row in body["results"])
        url = body["next"]
    assert sorted(seen) == sorted(f"lines[{n}]" for n in range(UNITS))


def test_the_step_runs_of_an_unknown_execution_are_a_404(staff_client: Client) -> None:
    missing = "00000000-0000-0000-0000-000000000000"
    assert staff_client.get(f"{API}/{missing}/step-runs/").status_code == 404
    execution = big_execution()
    response = staff_client.get(f"{API}/{execution.pk}/step-runs/", {"page": "x"})
    assert response.status_code == 400
