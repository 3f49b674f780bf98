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
    selected = {"action": "retry_failed", "_selected_action": [str(failed.pk), str(succeeded.pk)]}
    # first a confirmation page listing what is reused and what runs again; nothing retried
    confirm = operator_client.post(changelist, selected)
    page_text = confirm.content.decode()
    assert confirm.status_code == 200 and 'id="confirm-retry"' in page_text
    assert '<td class="retry-reused">reserve</td>' in page_text
    assert "from <strong>charge</strong>: charge, notify" in page_text
    assert "cannot be retried" in page_text and "only a failed execution" in page_text
    assert not Execution.objects.filter(retry_of=failed).exists()
    response = operator_client.post(changelist, {**selected, "confirm": "yes"}, follow=True)
    text = response.content.decode()
    retried = Execution.objects.get(retry_of=failed)
    assert f"retrying from step &#x27;charge&#x27; as {retried.pk}" in text
    assert "only a failed execution can be retried" in text
    assert not Execution.objects.filter(retry_of=succeeded).exists()
    assert retried.context["retry"]["from_step"] == "charge"


def test_both_pages_list_the_steps_the_rollback_undid_as_running_again(
    operator_client: Client,
) -> None:
    """``PayOrder``: quote (no undo) → reserve → charge (both undone by the rollback) → email
    fails. The execution page preselects ``reserve`` and marks the undone steps; the list
    action's confirmation page says the retry reuses only ``quote``."""
    from tests.worker.promise_reactors import PayOrder
    from tests.worker.promise_reactors import set_failing as set_email_failing

    order = f"admin-{uuid.uuid4().hex[:8]}"
    set_email_failing(order, True)
    failed = Execution.objects.get(pk=PayOrder.run(order=order).execution_id)
    set_email_failing(order, False)
    confirm = operator_client.get(retry_url(failed)).content.decode()
    assert "<td>quote</td><td>result recorded (reusable)</td>" in confirm
    assert "<td>reserve</td><td>undone by the rollback (runs again)</td>" in confirm
    assert "<td>charge</td><td>undone by the rollback (runs again)</td>" in confirm
    assert '<option value="reserve" selected>' in confirm
    # a step after an undone one is refused, nothing retried
    refused = operator_client.post(retry_url(failed), {"from_step": "email"}, follow=True)
    assert "rollback undid" in refused.content.decode()
    assert not Execution.objects.filter(retry_of=failed).exists()

    changelist = reverse("admin:reactor_app_execution_changelist")
    selected = {"action": "retry_failed", "_selected_action": [str(failed.pk)]}
    listing = operator_client.post(changelist, selected).content.decode()
    assert '<td class="retry-reused">quote</td>' in listing
    assert "from <strong>reserve</strong>: reserve, charge, email" in listing
    assert "(undone by the rollback: reserve, charge)" in listing
    operator_client.post(changelist, {**selected, "confirm": "yes"})
    retried = Execution.objects.get(retry_of=failed)
    assert retried.context["retry"]["from_step"] == "reserve"
