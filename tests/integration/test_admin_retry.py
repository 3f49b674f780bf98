"""The admin's retry from a step (issue 17, item 2): the button on the execution page, the
confirm page, the list action; permission-checked and audited. The retry goes to a worker
queue nobody reads, and is delivered in this process (as a worker would) to see it run."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse

from reactor_app.engine.dispatch import deliver
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.api import users
from tests.worker.reactors import records
from tests.worker.retry_reactors import RetryableReactor, set_failing

staff_user, staff_client = users.staff_user, users.staff_client
operator_user, operator_client = users.operator_user, users.operator_client

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def nobody_reads_the_queue(settings: Any) -> Iterator[None]:
    settings.REACTOR_CELERY_QUEUE = f"reactor-nobody-{uuid.uuid4().hex[:8]}"
    yield


def failed_run(key: int) -> Execution:
    set_failing(key, True)
    result = RetryableReactor.run(key=key)
    set_failing(key, False)
    assert result.status == ExecutionStatus.FAILED
    return Execution.objects.get(pk=result.execution_id)


def page(execution: Any) -> str:
    return reverse("admin:reactor_app_execution_change", args=[execution.pk])


def retry_url(execution: Any) -> str:
    return reverse("admin:reactor_app_execution_retry", args=[execution.pk])


def steps_ran(execution: Any) -> list[str]:
    return [r["step"] for r in records("ran") if r["execution"] == str(execution.pk)]


def test_the_execution_page_retries_from_the_failed_step_on_a_worker(
    operator_client: Client, operator_user: Any
) -> None:
    failed = failed_run(11)
    html = operator_client.get(page(failed)).content.decode()
    assert 'id="retry-execution"' in html and retry_url(failed) in html

    confirm = operator_client.get(retry_url(failed)).content.decode()
    assert "<td>reserve</td><td>result recorded (reusable)</td>" in confirm
    assert "<td>charge</td><td>failed here</td>" in confirm
    assert '<option value="charge" selected>' in confirm

    response = operator_client.post(retry_url(failed), {"from_step": "charge"})
    retried = Execution.objects.get(retry_of=failed)
    assert response.status_code == 302 and response["Location"] == page(retried)
    assert retried.status == ExecutionStatus.PENDING  # enqueued, not run in the request
    assert retried.context["retry"]["by"] == operator_user.get_username()
    entry = LogEntry.objects.get(object_id=str(failed.pk))
    assert entry.user == operator_user
    assert f"as {retried.pk}" in entry.get_change_message()

    assert deliver(str(retried.pk))["outcome"] == "succeeded"
    assert steps_ran(retried) == ["charge", "notify"]
    # both pages link the other; the original offers no second retry
    html = operator_client.get(page(failed)).content.decode()
    assert str(retried.pk) in html and 'id="retry-execution"' not in html
    assert str(failed.pk) in operator_client.get(page(retried)).content.decode()


def test_retry_needs_the_operator_permission(staff_client: Client) -> None:
    failed = failed_run(12)
    assert staff_client.get(retry_url(failed)).status_code == 403
    assert staff_client.post(retry_url(failed), {"from_step": "charge"}).status_code == 403
    changelist = staff_client.get(reverse("admin:reactor_app_execution_changelist"))
    assert "retry_failed" not in changelist.content.decode()
    assert not Execution.objects.filter(retry_of=failed).exists()


def test_the_list_action_retries_the_failed_and_reports_the_rest(
    operator_client: Client,
) -> None:
    failed = failed_run(13)
    succeeded = Execution.objects.get(pk=RetryableReactor.run(key=14).execution_id)
    changelist = reverse("admin:reactor_app_execution_changelist")
    assert "retry_failed" in operator_client.get(changelist).content.decode()
    response = operator_client.post(
        changelist,
        {"action": "retry_failed", "_selected_action": [str(failed.pk), str(succeeded.pk)]},
        follow=True,
    )
    text = response.content.decode()
    retried = Execution.objects.get(retry_of=failed)
    assert f"retrying as {retried.pk}" in text
    assert "only a failed execution can be retried" in text
    assert not Execution.objects.filter(retry_of=succeeded).exists()
    assert retried.context["retry"]["from_step"] == "charge"
