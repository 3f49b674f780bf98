"""The API's live limits: ``GET limits/`` (effective value and origin), ``POST limits/`` and
``POST limits/remove/`` (the ``override_limit`` permission; audited). A body that is not a
valid override is a 400 naming the field, never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from reactor_app import Step, Success, with_semaphore
from reactor_app.bounds import LARGEST_COUNT
from reactor_app.coordination import live_limits
from reactor_app.models import CoordinationEvent, LimitOverride
from reactor_app.operator import limits
from reactor_app.operator.live import inspect_key
from reactor_app.status import CoordinationEventKind
from reactor_app.storable import text_problem
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


# -- the range of an override, and who and why -----------------------------------------------


@hypothesis_settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    limit=st.one_of(
        st.sampled_from([1, 10**12, 10**12 + 1, LARGEST_COUNT, LARGEST_COUNT + 1, 10**30]),
        st.integers(min_value=-5, max_value=10 * LARGEST_COUNT),
    )
)
def test_an_override_takes_exactly_the_limits_a_declaration_takes(
    limiter_client: Client, limit: int
) -> None:
    """Before, an operator's override stopped at 10**12, below what a declaration may give
    (10**15, ``reactor_app.bounds``): a limit declared at 2 * 10**12 could not be set back to
    its own value by an operator."""
    LimitOverride.objects.all().delete()
    body = {"primitive": "semaphore", "name": "partner", "value": str(limit)}
    response = _post(limiter_client, LIMITS, body)
    if 1 <= limit <= LARGEST_COUNT:
        assert response.status_code == 200, response.content
        assert response.json()["effective"] == {"limit": limit}
        assert live_limits.semaphore_limit("partner") == limit
        remove = {"primitive": "semaphore", "name": "partner"}
        assert _post(limiter_client, f"{LIMITS}remove/", remove).status_code == 200
    else:
        assert response.status_code == 400, response.content
        assert "value" in response.json()
        assert not LimitOverride.objects.exists()


@with_semaphore(lambda args: "partner:largest", limit="partner")
class UnderPartnerLimit(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(inspect_key("semaphore", "partner:largest")["semaphore"])


def test_the_largest_override_reaches_the_script_as_the_same_number(
    limiter_client: Client, reactor_redis: Any
) -> None:
    body = {"primitive": "semaphore", "name": "partner", "value": str(LARGEST_COUNT)}
    assert _post(limiter_client, LIMITS, body).status_code == 200
    outcome = UnderPartnerLimit.call()
    assert outcome.ok, outcome
    # what the admission script stored as the key's limit, read back from Redis
    assert outcome.value["limit"] == LARGEST_COUNT and outcome.value["held"] == 1, outcome.value


any_text = st.text(alphabet=st.characters(blacklist_categories=()), max_size=160)


@hypothesis_settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(by=any_text, reason=st.one_of(any_text, st.just("r" * 5000)), removing=st.booleans())
@example(by="b" * 151, reason="", removing=False)
@example(by="x\x00y", reason="", removing=False)
@example(by="ops", reason="\ud800", removing=False)
@example(by="\udfff", reason="", removing=True)
def test_who_and_why_are_stored_as_given_or_refused_before_anything_is(
    by: str, reason: str, removing: bool
) -> None:
    """``set_override`` / ``remove_override`` called directly (docs/coordination.md): a ``by``
    longer than the row's column, or text with a NUL or a lone surrogate, reached the
    ``INSERT`` and failed it with a ``DataError`` (PostgreSQL) or a ``UnicodeEncodeError``."""
    LimitOverride.objects.all().delete()
    CoordinationEvent.objects.filter(kind=CoordinationEventKind.LIMIT_CHANGED).delete()
    if removing:
        limits.set_override("semaphore", "partner", "3", by="setup")
    storable = text_problem(by) is None and text_problem(reason) is None and len(by) <= 150
    verb = limits.remove_override if removing else limits.set_override
    arguments = () if removing else ("4",)
    changes = CoordinationEvent.objects.filter(kind=CoordinationEventKind.LIMIT_CHANGED)
    before = changes.count()
    if not storable:
        with pytest.raises(limits.InvalidLimit, match=r"^(by|reason) "):
            verb("semaphore", "partner", *arguments, by=by, reason=reason)
        assert LimitOverride.objects.exists() == removing  # nothing changed
        assert changes.count() == before  # and nothing was audited
        return
    verb("semaphore", "partner", *arguments, by=by, reason=reason)
    event = CoordinationEvent.objects.filter(kind=CoordinationEventKind.LIMIT_CHANGED).latest("id")
    assert event.detail["by"] == by and event.detail["reason"] == reason
    if not removing:
        row = LimitOverride.objects.get()
        assert (row.set_by, row.reason) == (by, reason)


@pytest.mark.parametrize("by", [object(), 5, None], ids=["object", "int", "none"])
def test_regression_who_must_be_text(by: Any) -> None:
    with pytest.raises(limits.InvalidLimit, match="by must be text"):
        limits.set_override("semaphore", "partner", "3", by=by)
    assert not LimitOverride.objects.exists()
