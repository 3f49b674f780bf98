"""Live limits in the admin: the Limits page overrides a named limit (permission-checked,
audited), the Coordination page shows the effective value and its origin, and bad input is a
form error (400), never a server error. The override is read back through the real Redis
(``coordination.live_limits``); that running workers obey it:
tests/worker/test_worker_live_limits.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from reactor_app.coordination import live_limits
from reactor_app.coordination.rate_limit import named_windows
from reactor_app.models import CoordinationEvent, LimitOverride
from reactor_app.status import CoordinationEventKind
from tests.api import users

pytestmark = pytest.mark.django_db

staff_client = users.staff_client
staff_user = users.staff_user
operator_client = users.operator_client
operator_user = users.operator_user

LIMITS = "/admin/reactor_app/coordination/limits/"
COORDINATION = "/admin/reactor_app/coordination/"


@pytest.fixture(autouse=True)
def named(settings: Any, reactor_redis: Any) -> None:
    settings.REACTOR_LIMITS = {"partner": {"limit": 2}}
    settings.REACTOR_RATE_LIMITS = {
        "sms": {"limit": 10, "period": "minute"},
        "api": {"limits": {"second": 3, "hour": 100}},
    }


@pytest.fixture
def limiter_client(django_user_model: Any) -> Client:
    """Staff with the live-limit permission (and not the force-release one)."""
    return users.logged_in(users._staff(django_user_model, "limiter", "override_limit"))


def _row(page: str, name: str) -> str:
    start = page.index(f'data-name="{name}"')
    return page[start : page.index("</tr>", start)]


def test_an_override_needs_its_permission(staff_client: Client, operator_client: Client) -> None:
    for client in (staff_client, operator_client):  # view-only staff; force-release operator
        response = client.post(LIMITS, {"primitive": "semaphore", "name": "partner", "value": "5"})
        assert response.status_code == 403
        page = client.get(LIMITS).content.decode()
        assert 'id="limit-form"' not in page and "needs the <code>" in page
    assert not LimitOverride.objects.exists()
    assert live_limits.semaphore_limit("partner") == 2


def test_an_override_is_applied_audited_shown_and_removed(limiter_client: Client) -> None:
    page = limiter_client.get(COORDINATION).content.decode()
    assert "<strong>2</strong>" in _row(page, "partner") and "settings" in _row(page, "partner")

    response = limiter_client.post(
        LIMITS,
        {"primitive": "semaphore", "name": "partner", "value": "5", "reason": "quota raised"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert live_limits.semaphore_limit("partner") == 5
    event = CoordinationEvent.objects.get(kind=CoordinationEventKind.LIMIT_CHANGED)
    assert (event.primitive, event.key) == ("semaphore", "partner")
    assert event.detail["by"] == "limiter" and event.detail["reason"] == "quota raised"
    assert (event.detail["old"], event.detail["new"]) == (None, {"limit": 5})
    assert event.detail["settings"] == {"limit": 2}

    row = _row(limiter_client.get(COORDINATION).content.decode(), "partner")
    assert "<strong>5</strong>" in row and "override by limiter at" in row

    response = limiter_client.post(
        LIMITS, {"primitive": "semaphore", "name": "partner", "action": "remove"}
    )
    assert response.status_code == 302
    assert live_limits.semaphore_limit("partner") == 2
    assert not LimitOverride.objects.exists()
    removed = CoordinationEvent.objects.filter(kind=CoordinationEventKind.LIMIT_CHANGED).first()
    assert removed is not None and removed.detail["action"] == "removed"
    assert (removed.detail["old"], removed.detail["new"]) == ({"limit": 5}, {"limit": 2})
    row = _row(limiter_client.get(LIMITS).content.decode(), "partner")
    assert "<strong>2</strong>" in row and "settings" in row


def test_a_rate_limit_override_changes_the_named_windows(limiter_client: Client) -> None:
    assert [(w.seconds, w.limit) for w in named_windows("api")] == [(1.0, 3), (3600.0, 100)]
    response = limiter_client.post(
        LIMITS, {"primitive": "rate_limit", "name": "api", "value": "1/second, 50/hour"}
    )
    assert response.status_code == 302
    assert [(w.seconds, w.limit) for w in named_windows("api")] == [(1.0, 1), (3600.0, 50)]
    # one window: the number alone keeps the configured period
    limiter_client.post(LIMITS, {"primitive": "rate_limit", "name": "sms", "value": "4"})
    assert [(w.seconds, w.limit) for w in named_windows("sms")] == [(60.0, 4)]
    row = _row(limiter_client.get(COORDINATION).content.decode(), "sms")
    assert "4/minute" in row and "10/minute" in row  # effective, and what settings say


def test_an_override_of_a_name_settings_dropped_can_still_be_removed(
    limiter_client: Client, settings: Any
) -> None:
    """Found in review: the page lists an override whose name settings no longer declare,
    but its remove button answered 400 ("unknown named limit"); once the name came back to
    settings, the forgotten override was in force again instead of the settings value."""
    form = {"primitive": "semaphore", "name": "partner", "value": "5"}
    assert limiter_client.post(LIMITS, form).status_code == 302
    settings.REACTOR_LIMITS = {}  # a deploy drops the name
    assert 'data-name="partner"' in limiter_client.get(LIMITS).content.decode()

    removal = {"primitive": "semaphore", "name": "partner", "action": "remove"}
    assert limiter_client.post(LIMITS, removal).status_code == 302
    assert not LimitOverride.objects.exists()
    settings.REACTOR_LIMITS = {"partner": {"limit": 2}}  # and a later one brings it back
    assert live_limits.semaphore_limit("partner") == 2


@pytest.mark.parametrize(
    "form",
    [
        {"primitive": "semaphore", "name": "partner", "value": "abc"},
        {"primitive": "semaphore", "name": "partner", "value": "0"},
        {"primitive": "semaphore", "name": "partner", "value": "-3"},
        {"primitive": "semaphore", "name": "partner", "value": ""},
        {"primitive": "semaphore", "name": "partner", "value": "9" * 400},
        # found in review: a digit int() does not read was a 500, a huge limit was taken
        {"primitive": "semaphore", "name": "partner", "value": "\u00b2"},
        {"primitive": "semaphore", "name": "partner", "value": "9" * 30},
        {"primitive": "rate_limit", "name": "sms", "value": "9" * 30 + "/minute"},
        {"primitive": "semaphore", "name": "nobody", "value": "3"},
        {"primitive": "semaphore", "name": "nobody", "action": "remove"},
        {"primitive": "lock", "name": "partner", "value": "3"},
        {"primitive": "semaphore", "name": "", "value": "3"},
        {"primitive": "semaphore", "name": "partner", "value": "3", "action": "explode"},
        {"primitive": "rate_limit", "name": "api", "value": "5"},  # two windows: say which
        {"primitive": "rate_limit", "name": "sms", "value": "5/fortnight"},
        {"primitive": "rate_limit", "name": "sms", "value": "5/minute, 6/minute"},
        {"primitive": "rate_limit", "name": "sms", "value": "0/minute"},
        {"primitive": "rate_limit", "name": "sms", "value": "\x00"},
        {},
    ],
)
def test_bad_input_is_a_form_error_not_a_server_error(
    limiter_client: Client, form: dict[str, str]
) -> None:
    response = limiter_client.post(LIMITS, form)
    assert response.status_code == 400, response.status_code
    assert "errorlist" in response.content.decode()
    assert not LimitOverride.objects.exists()
    assert not CoordinationEvent.objects.filter(kind=CoordinationEventKind.LIMIT_CHANGED).exists()
