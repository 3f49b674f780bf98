"""The admin answers a query string or a form it did not produce with its own error pages — a
redirect to the list's "bad filter" view, a 404, a message — never a server error."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.api import users

pytestmark = pytest.mark.django_db

staff_client = users.staff_client
superuser_client = users.superuser_client
staff_user = users.staff_user
superuser = users.superuser

EXECUTIONS = "/admin/reactor_app/execution/"
EVENTS = "/admin/reactor_app/coordinationevent/"
PARKED = "/admin/reactor_app/parkedexecution/"


@pytest.mark.parametrize(
    ("page", "query"),
    [
        # a NUL character: PostgreSQL text cannot hold one
        (EXECUTIONS, {"status": "\x00"}),
        (EXECUTIONS, {"reactor__exact": "\x00"}),
        (EVENTS, {"kind": "\x00"}),
        (PARKED, {"primitive": "\x00"}),
        # a date drill-down whose period ends past the calendar
        (EXECUTIONS, {"created_at__year": "9999"}),
        (EXECUTIONS, {"created_at__year": "9999", "created_at__month": "12"}),
        (EVENTS, {"at__year": "9999", "at__month": "12", "at__day": "31"}),
    ],
)
def test_a_filter_value_the_database_cannot_take_is_a_bad_filter_not_a_500(
    staff_client: Client, page: str, query: dict[str, str]
) -> None:
    response = staff_client.get(page, query)
    assert response.status_code == 302 and response["Location"].endswith("?e=1"), (
        response.status_code
    )


@pytest.mark.parametrize("object_id", ["not-a-uuid", "a/b", "\x00"])
def test_the_cancel_page_of_something_that_is_not_an_execution_is_a_404(
    superuser_client: Client, object_id: str
) -> None:
    assert superuser_client.get(f"{EXECUTIONS}{object_id}/cancel/").status_code == 404
    assert superuser_client.post(f"{EXECUTIONS}{object_id}/cancel/").status_code == 404


@pytest.mark.parametrize("action", ["cancel_selected", "retry_failed"])
def test_an_action_on_a_selection_that_is_not_execution_ids_is_refused_with_a_message(
    superuser_client: Client, action: Any
) -> None:
    from django.contrib.messages import get_messages

    real = Execution.objects.create(reactor="x.Y", inputs={}, status=ExecutionStatus.RUNNING)
    response = superuser_client.post(
        EXECUTIONS,
        {"action": action, "index": 0, "_selected_action": [str(real.pk), "not-a-uuid"]},
    )
    assert response.status_code == 302
    said = [str(message) for message in get_messages(response.wsgi_request)]
    assert said == ["not an execution: 'not-a-uuid'"]
    real.refresh_from_db()
    assert real.status == ExecutionStatus.RUNNING  # nothing done to any of them
