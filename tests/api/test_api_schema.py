"""Property-based API check: schemathesis drives every operation of the OpenAPI schema, with
valid and invalid parameters, through the real WSGI application, and no answer is a 5xx.

Bounded in time: a fixed number of examples per operation, no example database, no shrinking
past the deadline. Runs as a staff user (session cookie), over real Redis for ``holds/``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import hypothesis
import pytest
import schemathesis
from django.conf import settings
from django.core.wsgi import get_wsgi_application
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.config import GenerationConfig, ProjectConfig, SchemathesisConfig

from reactor_app.models import ContentionState, CoordinationEvent, Execution
from reactor_app.status import CoordinationEventKind, ExecutionStatus

SCHEMA_PATH = "/api/reactor/schema/?format=json"
#: examples per operation (positive and negative modes together): enough to hit each
#: parameter's edge cases, small enough for the suite (seven operations)
MAX_EXAMPLES = 40


def _seed_rows() -> None:
    """A few rows of each kind, so listings serialize real data, not only empty pages."""
    holder = Execution.objects.start(
        reactor="shop.PaymentReactor", inputs={"a": 1}, status="running"
    )
    parked = Execution.objects.start(
        reactor="shop.PaymentReactor", inputs={"a": 2}, status=ExecutionStatus.PARKED
    )
    ContentionState.objects.create(
        execution=parked,
        step="charge",
        primitive="lock",
        key="acct:1",
        attempts=1,
        next_attempt_at=timezone.now() + timedelta(seconds=5),
        blocker={
            "owner": str(holder.pk),
            "execution": str(holder.pk),
            "step": "charge",
            "since": timezone.now().timestamp(),
            "ttl": 20.0,
        },
    )
    for kind in (CoordinationEventKind.ACQUIRED, CoordinationEventKind.PARKED):
        CoordinationEvent.objects.create(
            execution=holder,
            step="charge",
            primitive="lock",
            key="acct:1",
            kind=kind,
            owner=str(holder.pk),
            token=1,
            at=timezone.now(),
        )


@pytest.mark.django_db(transaction=True)
def test_no_operation_answers_a_server_error(staff_user: Any) -> None:
    _seed_rows()
    client = Client()
    client.force_login(staff_user)
    cookies = {settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value}

    config = SchemathesisConfig()
    config.projects.default = ProjectConfig(
        generation=GenerationConfig(
            modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
            max_examples=MAX_EXAMPLES,
            allow_x00=True,
        )
    )
    schema = schemathesis.openapi.from_wsgi(SCHEMA_PATH, get_wsgi_application(), config=config)
    operations = [result.ok() for result in schema.get_all_operations()]
    labels = {op.label for op in operations}
    for listing in ("executions", "holds", "events", "contention"):
        assert f"GET /api/reactor/{listing}/" in labels, labels

    failures: list[str] = []
    for operation in operations:

        @hypothesis.settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @hypothesis.given(case=operation.as_strategy())
        def exercise(case: Any) -> None:
            response = case.call(cookies=cookies)
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path} {case.query} -> "
                    f"{response.status_code}: {response.text[:300]}"
                )
            case.validate_response(response, checks=[not_a_server_error])

        exercise()

    assert not failures, "\n".join(failures)


def test_schema_generates_without_warnings(client: Client) -> None:
    """The app's own schema view, with no DEFAULT_SCHEMA_CLASS or SPECTACULAR_SETTINGS in the
    project (the demo sets neither): valid OpenAPI 3, no generator warning, mounted paths."""
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.validation import validate_schema

    assert "DEFAULT_SCHEMA_CLASS" not in getattr(settings, "REST_FRAMEWORK", {})
    assert not hasattr(settings, "SPECTACULAR_SETTINGS")
    GENERATOR_STATS.reset()
    response = client.get(SCHEMA_PATH)
    assert response.status_code == 200, response.content[:500]
    schema = response.json()
    validate_schema(schema)
    assert not GENERATOR_STATS, f"warnings: {dict(GENERATOR_STATS._warn_cache)}"
    for listing in ("executions", "holds", "events", "contention"):
        assert f"/api/reactor/{listing}/" in schema["paths"]
    assert schema["info"]["title"] == "reactor_app API"


@pytest.mark.django_db
def test_api_root_links_every_listing(client: Client, django_user_model: Any) -> None:
    staff = django_user_model.objects.create_user("root-staff", password="x", is_staff=True)
    assert client.get("/api/reactor/").status_code == 403
    client.force_login(staff)
    response = client.get("/api/reactor/")
    assert response.status_code == 200
    links = response.json()
    assert set(links) == {"executions", "holds", "events", "contention", "limits", "schema"}
    assert links["executions"] == "http://testserver/api/reactor/executions/"
    assert client.get(links["schema"] + "?format=json").status_code == 200


def test_a_project_wide_schema_needs_no_settings_either(tmp_path: Any) -> None:
    """A project that generates one schema for all its views (drf-spectacular's command or its
    deploy check) gets reactor_app's operations without warnings and without our settings."""
    from django.core.management import call_command

    target = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    text = target.read_text()
    for listing in ("executions", "holds", "events", "contention"):
        assert f"/api/reactor/{listing}/:" in text
    assert "ExecutionStatusEnum:" in text and "StepRunStatusEnum:" in text
