"""The API's live limits: ``GET limits/`` (effective value and origin), ``POST limits/`` and
``POST limits/remove/`` (the ``override_limit`` permission; audited). A body that is not a
valid override is a 400 naming the field, never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from reactor_app.coordination import live_limits
from reactor_app.models import CoordinationEvent, LimitOverride
from reactor_app.status import CoordinationEventKind
from tests.api import users

pytestmark = pytest.mark.django_db

LIMITS = "/api/reactor/limits/"


@pytest.fixture(autouse=True)
def named(settings: Any, reactor_redis: Any) -> None:
    settings.REACTOR_LIMITS = {"partner": {"limit": 2}}
    settings.REACTOR_RATE_LIMITS = {"sms": {"limit": 10, "period": "minute"}}


@pytest.fixture
def limiter_client(django_user_model: Any) -> Client:
    return users.logged_in(users._staff(django_user_model, "limiter", "override_limit"))


def _post(client: Client, path: str, body: Any) -> Any:
    return client.post(path, json.dumps(body), content_type="application/json")


def _by_name(response: Any) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in response.json()}


def test_the_named_limits_are_listed_with_their_origin(staff_client: Client) -> None:
    response = staff_client.get(LIMITS)
    assert response.status_code == 200
    rows = _by_name(response)
    assert rows["partner"]["effective"] == {"limit": 2} and rows["partner"]["origin"] == "settings"
    assert rows["sms"]["effective_text"] == "10/minute"


def test_an_override_needs_its_permission(staff_client: Client, operator_client: Client) -> None:
    for client in (staff_client, operator_client):
        body = {"primitive": "semaphore", "name": "partner", "value": "5"}
        assert _post(client, LIMITS, body).status_code == 403
        assert _post(client, f"{LIMITS}remove/", body).status_code == 403
    assert not LimitOverride.objects.exists()


def test_set_and_remove_an_override(limiter_client: Client) -> None:
    body = {"primitive": "semaphore", "name": "partner", "value": "5", "reason": "quota"}
    response = _post(limiter_client, LIMITS, body)
    assert response.status_code == 200, response.content
    assert response.json()["effective"] == {"limit": 5}
    assert response.json()["origin"].startswith("override by limiter at ")
    assert live_limits.semaphore_limit("partner") == 5
    event = CoordinationEvent.objects.get(kind=CoordinationEventKind.LIMIT_CHANGED)
    assert event.detail["by"] == "limiter" and event.detail["new"] == {"limit": 5}

    response = _post(
        limiter_client, f"{LIMITS}remove/", {"primitive": "semaphore", "name": "partner"}
    )
    assert response.status_code == 200
    assert response.json()["origin"] == "settings"
    assert live_limits.semaphore_limit("partner") == 2


def test_an_override_of_a_name_settings_dropped_can_still_be_removed(
    limiter_client: Client, settings: Any
) -> None:
    """Found in review: the list shows an override whose name settings no longer declare,
    but removing it was a 400 ("unknown named limit") — and once the name came back to
    settings, the forgotten override was in force again instead of the settings value."""
    body = {"primitive": "semaphore", "name": "partner", "value": "5"}
    assert _post(limiter_client, LIMITS, body).status_code == 200
    settings.REACTOR_LIMITS = {}  # a deploy drops the name
    assert _by_name(limiter_client.get(LIMITS))["partner"]["settings"] is None

    removal = {"primitive": "semaphore", "name": "partner"}
    response = _post(limiter_client, f"{LIMITS}remove/", removal)
    assert response.status_code == 200, response.content
    assert not LimitOverride.objects.exists()
    settings.REACTOR_LIMITS = {"partner": {"limit": 2}}  # and a later one brings it back
    assert live_limits.semaphore_limit("partner") == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"primitive": "semaphore", "name": "partner"}, "value"),
        ({"primitive": "semaphore", "name": "partner", "value": True}, "value"),
        ({"primitive": "semaphore", "name": "partner", "value": ["5"]}, "value"),
        ({"primitive": "semaphore", "name": "partner", "value": "0"}, "value"),
        # found in review: a digit int() does not read was a 500, a huge limit was taken
        ({"primitive": "semaphore", "name": "partner", "value": "\u00b2"}, "value"),
        ({"primitive": "semaphore", "name": "partner", "value": "9" * 30}, "value"),
        ({"primitive": "rate_limit", "name": "sms", "value": "9" * 30 + "/minute"}, "value"),
        ({"primitive": "semaphore", "name": "nobody", "value": "5"}, "name"),
        ({"primitive": "lock", "name": "partner", "value": "5"}, "primitive"),
        ({"primitive": "semaphore", "name": "partner", "value": "5", "extra": 1}, "extra"),
        ({"primitive": "rate_limit", "name": "sms", "value": "5/fortnight"}, "value"),
        ({"primitive": "rate_limit", "name": "sms", "value": "5/minute, 6/minute"}, "value"),
        ({"name": "partner", "value": "5"}, "primitive"),
        ([1, 2], None),
        ("5", None),
    ],
)
def test_a_bad_body_is_a_400_naming_the_field(
    limiter_client: Client, body: Any, field: str | None
) -> None:
    response = _post(limiter_client, LIMITS, body)
    assert response.status_code == 400, response.content
    if field is not None:
        assert field in response.json(), response.json()
    assert not LimitOverride.objects.exists()
