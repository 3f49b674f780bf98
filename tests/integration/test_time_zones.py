"""Projects with ``USE_TZ = False`` and with ``USE_TZ = True`` (``reactor_app.datetimes``).

Both run in ``TIME_ZONE = "Asia/Kolkata"`` (UTC+05:30: a time shown in UTC, or a naive UTC
time read as local, is off by five and a half hours, never by a whole number of them).

Before, with ``USE_TZ = False``: the parked executions page and the key timeline were a 500
(``timezone.localtime`` of a naive datetime), the demo's report stopped on the timeline, a
task deferred with an aware ``run_after`` (which the task API accepts there) raised a
``TypeError`` from comparing it with the naive clock, the API showed a hold's ``acquired_at``
as naive UTC beside rows in local time, and an API filter given an aware time compared it as
naive UTC with local times. The properties: every operator page and API listing answers, and
every time they show, and every time a caller gives, names the right instant in either mode.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone as django_timezone
from django_tasks.exceptions import InvalidTaskError
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reactor_app.engine.dispatch import deliver
from reactor_app.engine.enqueueing import run_async
from reactor_app.exceptions import InputValidationError
from reactor_app.models import ContentionState, Execution
from reactor_app.status import ExecutionStatus
from reactor_app.write_behind import flush
from tests.api.holding import PaymentReactor, running
from tests.integration.echo import EchoReactor
from tests.integration.pages import operator_pages
from tests.worker import task_functions as tasks

ZONE = "Asia/Kolkata"
KOLKATA = ZoneInfo(ZONE)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=[True, False], ids=["USE_TZ", "no USE_TZ"])
def use_tz(request: Any) -> Iterator[bool]:
    with override_settings(USE_TZ=request.param, TIME_ZONE=ZONE):
        yield request.param


@pytest.fixture
def superuser_client(use_tz: bool, django_user_model: Any) -> Client:
    client = Client()
    client.force_login(django_user_model.objects.create_superuser("tz-admin", password="pw"))
    return client


def wall_clock(moment: datetime | float) -> datetime:
    """The Kolkata wall clock of an instant (epoch seconds, or an aware datetime), naive."""
    if isinstance(moment, datetime):
        return moment.astimezone(KOLKATA).replace(tzinfo=None)
    return datetime.fromtimestamp(moment, KOLKATA).replace(tzinfo=None)


def as_wall_clock(shown: str) -> datetime:
    """A time the API shows: an aware one converted, a naive one read as the project's local
    time — what a client of a project without ``USE_TZ`` must do."""
    moment = datetime.fromisoformat(shown.replace("Z", "+00:00"))
    return wall_clock(moment) if moment.tzinfo else moment


def clock_of(text: str, label: str) -> str:
    """The ``HH:MM:SS`` after ``label`` in a page."""
    match = re.search(re.escape(label) + r"\s*(\d\d:\d\d:\d\d)", text)
    assert match, f"no time after {label!r}"
    return match.group(1)


def near(shown: str, expected: datetime, seconds: float = 30.0) -> bool:
    """Whether the ``HH:MM:SS`` ``shown`` is within ``seconds`` of ``expected``'s clock."""
    at = datetime.combine(expected.date(), datetime.strptime(shown, "%H:%M:%S").time())
    return min(abs((at + timedelta(days=d) - expected).total_seconds()) for d in (-1, 0, 1)) < (
        seconds
    )


def test_every_operator_page_answers_and_shows_the_projects_local_time(
    use_tz: bool, superuser_client: Client
) -> None:
    account = int(uuid.uuid4().int % 10**8)
    key = f"acct:{account}"
    with running(PaymentReactor, f"tz-{use_tz}", account_id=account):
        held_at = time.time()
        holds = superuser_client.get("/api/reactor/holds/", {"key": key})
        assert holds.status_code == 200, holds.content
        (hold,) = holds.json()["results"]
        # the hold's acquisition, shown as the project shows its rows' times
        shown = as_wall_clock(hold["acquired_at"])
        assert abs((shown - wall_clock(held_at)).total_seconds()) < 30, (hold, use_tz)
        coordination = superuser_client.get(reverse("admin:reactor_app_coordination_changelist"))
        assert coordination.status_code == 200 and key in coordination.content.decode()
    flush()

    # a parked execution, next attempt in 5 s, blocked by a hold taken 4 s ago
    holder = Execution.objects.start(reactor=EchoReactor.path(), inputs={"x": 1})
    parked = Execution.objects.start(
        reactor=EchoReactor.path(), inputs={"x": 2}, status=ExecutionStatus.PARKED
    )
    now = time.time()
    ContentionState.objects.create(
        execution=parked,
        step="echo",
        primitive="lock",
        key=key,
        attempts=1,
        next_attempt_at=django_timezone.now() + timedelta(seconds=5),
        blocker={"owner": str(holder.pk), "execution": str(holder.pk), "since": now - 4},
    )
    page = superuser_client.get(reverse("admin:reactor_app_parkedexecution_changelist"))
    assert page.status_code == 200
    html = page.content.decode()
    assert near(clock_of(html, 'class="field-next_attempt">'), wall_clock(now + 5))
    assert near(clock_of(html, "since"), wall_clock(now - 4))

    timeline = superuser_client.get(
        reverse("admin:reactor_app_coordination_timeline"), {"key": key, "minutes": 15}
    )
    assert timeline.status_code == 200
    svg = timeline.content.decode()
    assert 'class="bar hold"' in svg
    # the chart's span ends now, on the project's clock
    span = re.search(re.escape(f"holds and parks of {key}, ") + r"(\S+) to (\S+)</title>", svg)
    assert span, svg[:500]
    assert near(span.group(2), wall_clock(time.time()), 120)

    # every page of the app's admin and of the API
    pages = operator_pages(parked.pk)
    for url in pages:
        response = superuser_client.get(url)
        assert response.status_code == 200, (url, response.status_code)


@pytest.mark.parametrize("form", ["Z", "+05:30", "-08:00"])
def test_an_api_filter_given_an_aware_time_compares_the_same_instant(
    use_tz: bool, superuser_client: Client, form: str
) -> None:
    execution = Execution.objects.start(reactor=EchoReactor.path(), inputs={"x": 1})
    created = Execution.objects.get(pk=execution.pk).created_at
    instant = created if use_tz else created.replace(tzinfo=KOLKATA)
    offset = timezone(timedelta(0)) if form == "Z" else datetime.strptime(form, "%z").tzinfo

    def listed(**filters: datetime) -> bool:
        query = {name: moment.astimezone(offset).isoformat() for name, moment in filters.items()}
        response = superuser_client.get("/api/reactor/executions/", query)
        assert response.status_code == 200, response.content
        return str(execution.pk) in {row["id"] for row in response.json()["results"]}

    hour = timedelta(hours=1)
    assert listed(created_after=instant - hour, created_before=instant + hour)
    assert not listed(created_after=instant + hour)
    assert not listed(created_before=instant - hour)


@pytest.mark.parametrize(
    "moment", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-12:00"], ids=["year 1", "9999"]
)
def test_regression_an_api_filter_with_no_local_time_is_a_400(
    use_tz: bool, superuser_client: Client, moment: str
) -> None:
    """An aware time whose instant has no local time in the zone's range of years: without
    ``USE_TZ`` its conversion to local time raised ``OverflowError``, a 500."""
    response = superuser_client.get("/api/reactor/executions/", {"created_after": moment})
    assert response.status_code == 400, response.content
    assert "created_after" in response.json()


#: how a caller says when: an aware time in some zone, or a naive one (the project's local time)
FORMS = st.sampled_from(["UTC", "+05:30", "-08:00", "naive"])


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(delay=st.floats(min_value=1.0, max_value=30 * 86400.0), form=FORMS)
@example(delay=3600.0, form="+05:30")
@example(delay=3600.0, form="naive")
def test_a_deferred_run_is_due_at_the_instant_given_or_refused(
    use_tz: bool, nobody_queue: str, delay: float, form: str
) -> None:
    """The engine's ``run_after`` (the task backend's): the row is due at the instant given,
    whatever the caller's zone; a naive time is refused where the project is aware."""
    due_at = time.time() + delay
    if form == "naive":
        run_after = wall_clock(due_at)  # the project's local time
    else:
        zone = UTC if form == "UTC" else datetime.strptime(form, "%z").tzinfo
        run_after = datetime.fromtimestamp(due_at, zone)
    if use_tz and form == "naive":
        with pytest.raises(InputValidationError, match="aware") as refused:
            run_async(EchoReactor, {"x": 1}, run_after=run_after)
        assert refused.value.field_errors == {"run_after": "naive datetime"}
        return
    execution = run_async(EchoReactor, {"x": 1}, run_after=run_after)
    due = Execution.objects.get(pk=execution.pk).heartbeat_at
    assert django_timezone.is_aware(due) is use_tz
    # a naive one is local time: Django made the process's zone TIME_ZONE
    assert abs(due.timestamp() - due_at) < 0.01


def test_a_task_deferred_with_an_aware_time_runs_where_the_project_keeps_local_time(
    use_tz: bool, nobody_queue: str
) -> None:
    """The task API takes an aware ``run_after`` with or without ``USE_TZ``; before, without
    it, the backend's enqueue compared it with the naive clock (``TypeError``)."""
    due_at = time.time() + 0.3
    result = tasks.add.using(run_after=datetime.fromtimestamp(due_at, KOLKATA)).enqueue(1)
    row = Execution.objects.get(pk=result.id)
    assert abs(row.heartbeat_at.timestamp() - due_at) < 0.01
    time.sleep(max(0.0, due_at - time.time()) + 0.05)
    deliver(result.id)
    assert tasks.add.get_result(result.id).return_value == 3


def test_a_task_deferred_with_anything_but_a_datetime_is_an_invalid_task(use_tz: bool) -> None:
    """Before, the task API's own check (with ``USE_TZ``) or the backend's ``isoformat``
    (without) raised an ``AttributeError`` for it."""
    with pytest.raises(InvalidTaskError, match="run_after must be a datetime, not str"):
        tasks.add.using(run_after="tomorrow").enqueue(1)
