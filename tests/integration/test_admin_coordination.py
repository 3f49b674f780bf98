"""The admin's operator views: Coordination page, timeline, parked executions, staff actions.

Live holds are real (a reactor waits inside its step in a thread, real Redis). SC-010: the
operator sees the step, the key and the holder; a parked execution reads as parked, not failed.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    Admitted,
    Holder,
    LockClaim,
    PeriodClaim,
    RateLimitClaim,
    RateWindow,
    SemaphoreClaim,
)
from reactor_app.coordination.renewal import Renewal
from reactor_app.exceptions import LeaseLost
from reactor_app.models import ContentionState, CoordinationEvent, Execution
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from reactor_app.testing import (
    assert_locked,
    assert_not_locked,
    assert_ordered_lock,
    coordination_state,
    within_freshness_bound,
)
from tests.api import users
from tests.api.holding import FragileReactor, PaymentReactor, ShopSyncReactor, running

# the shared user fixtures (tests/api/users.py), bound here so pytest finds them
plain_user, plain_client = users.plain_user, users.plain_client
staff_user, staff_client = users.staff_user, users.staff_client
operator_user, operator_client = users.operator_user, users.operator_client

COORDINATION = "/admin/reactor_app/coordination/"
FORCE_RELEASE = COORDINATION + "force-release/"
TIMELINE = COORDINATION + "timeline/"


def text(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def row_of(html: str, key: str) -> str:
    """The ``<tr>`` of the holds table whose data-key is ``key``."""
    match = re.search(rf'<tr class="hold[^"]*" data-key="{re.escape(key)}".*?</tr>', html, re.S)
    assert match, f"no hold row for {key}"
    return match.group(0)


def make_execution(status: str, **fields: Any) -> Execution:
    fields.setdefault("reactor", "demo_project.shop.reactors.PaymentReactor")
    return Execution.objects.start(inputs={"account_id": 9}, status=status, **fields)


# -- the Coordination page --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_coordination_page_shows_step_key_and_holder(staff_client: Client) -> None:
    with (
        running(PaymentReactor, "admin-step", account_id=11) as payment,
        running(ShopSyncReactor, "admin-reactor", shop_id=5) as shop,
    ):
        html = text(staff_client.get(COORDINATION))

        step_row = row_of(html, "acct:11")
        assert "<code>charge</code>" in step_row
        assert 'data-step="charge"' in step_row
        change_url = reverse("admin:reactor_app_execution_change", args=[payment.execution_id])
        assert f'href="{change_url}"' in step_row
        assert "reactor-level-step" in step_row
        assert f"{TIMELINE}?key=acct%3A11" in step_row

        reactor_row = row_of(html, "shop:5")
        assert "<em>reactor</em>" in reactor_row and "reactor-level-reactor" in reactor_row
        shop_url = reverse("admin:reactor_app_execution_change", args=[shop.execution_id])
        assert f'href="{shop_url}"' in reactor_row
        assert re.search(r"<strong>1</strong> step-level, <strong>1</strong> reactor-level", html)

        # the holder's execution page names the key and the step in its events
        # (events are written behind the work: they show within the freshness bound)
        def page_with_events() -> str:
            page = text(staff_client.get(change_url))
            return page if "acct:11" in page else ""

        execution_page = within_freshness_bound(page_with_events)
        assert "acct:11" in execution_page and "charge" in execution_page
    payment.finish()
    shop.finish()
    assert "No live holds." in text(staff_client.get(COORDINATION))


@pytest.mark.django_db
def test_coordination_page_is_linked_from_the_app_index(staff_client: Client) -> None:
    html = text(staff_client.get("/admin/reactor_app/"))
    assert f'href="{COORDINATION}"' in html
    assert "Parked executions" in html


@pytest.mark.django_db
def test_coordination_page_needs_staff(plain_client: Client, client: Client) -> None:
    for refused in (plain_client, client):
        response = refused.get(COORDINATION)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]


@pytest.mark.django_db
def test_inspect_rate_limit_period_and_ordered_lock(staff_client: Client) -> None:
    coordinator = Coordinator()
    holder = Holder(owner="op-test", step="report")
    window = RateWindow(seconds=60, limit=5, label="minute")
    for _ in range(3):
        admitted = coordinator.admit([RateLimitClaim("api:9", (window,))], holder)
        coordinator.release(admitted, "success")
    marked = coordinator.admit([PeriodClaim("digest:9", "hour")], holder)
    coordinator.release(marked, "success")
    running = Holder(owner="op-test", execution_id="exec-9", step="report")
    assert isinstance(coordinator.admit([PeriodClaim("digest:9", "day")], running), Admitted)
    for owner in ("first", "second"):
        coordinator.assign_position("line:9", Holder(owner=owner, step="ship"))

    def inspect(primitive: str, key: str) -> str:
        return text(staff_client.get(COORDINATION, {"primitive": primitive, "key": key}))

    rate = inspect("rate_limit", "api:9")
    # the window and its limit were stored by the admissions: nothing to type
    assert re.search(r"<td>minute</td><td>3</td><td>5</td>", rate)
    assert "<td>hour</td>" not in rate  # only the windows the key was admitted with
    period = inspect("period", "digest:9")
    assert re.search(r"<td>hour</td><td>op-test</td><td>—</td>", period)
    assert re.search(r"<td>day</td><td>—</td><td>exec-9 \(step report\)</td>", period)
    ordered = inspect("ordered_lock", "line:9")
    assert re.search(r"Head \(may run now\)</th><td>1</td>", ordered)
    assert re.search(r"Next position to assign</th><td>3</td>", ordered)


# -- timeline ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_timeline_draws_holds_and_parks_of_a_key(staff_client: Client) -> None:
    with running(PaymentReactor, "admin-timeline", account_id=12) as payment:
        pass
    assert payment.outcome["result"].ok
    parked = make_execution(ExecutionStatus.PARKED)
    CoordinationEvent.objects.create(
        execution=parked,
        step="charge",
        primitive="lock",
        key="acct:12",
        kind=CoordinationEventKind.PARKED,
        owner=str(parked.pk),
        at=timezone.now() - timedelta(seconds=1),
    )
    html = text(staff_client.get(TIMELINE, {"key": "acct:12", "minutes": 15}))
    start = html.index('<svg xmlns="http://www.w3.org/2000/svg" class="reactor-timeline"')
    svg = html[start : html.index("</svg>", start)]
    assert svg.count('class="bar hold"') == 1
    assert svg.count('class="bar park"') == 1
    assert "lock · step charge" in svg
    assert payment.execution_id[:8] in svg
    assert 'id="timeline-key">acct:12<' in html
    assert "acquired" in html and "released" in html  # the event table

    assert "no holds or parks" in text(staff_client.get(TIMELINE, {"key": "nothing:here"}))
    bad = text(staff_client.get(TIMELINE, {"key": "acct:12", "minutes": "0"}))
    assert 'class="reactor-timeline"' not in bad and "errorlist" in bad


# -- parked executions: never a failure --------------------------------------------------------


@pytest.mark.django_db
def test_parked_execution_reads_as_parked_with_its_blocker(staff_client: Client) -> None:
    holder = make_execution(ExecutionStatus.RUNNING, current_step="charge")
    parked = make_execution(ExecutionStatus.PARKED, current_step="charge")
    contention = ContentionState.objects.create(
        execution=parked,
        step="charge",
        primitive="lock",
        key="acct:13",
        attempts=3,
        next_attempt_at=timezone.now() + timedelta(seconds=5),
        blocker={
            "owner": str(holder.pk),
            "execution": str(holder.pk),
            "step": "charge",
            "since": timezone.now().timestamp() - 4,
            "ttl": 26.0,
        },
    )
    parked_list = text(staff_client.get("/admin/reactor_app/parkedexecution/"))
    holder_url = reverse("admin:reactor_app_execution_change", args=[holder.pk])
    parked_url = reverse("admin:reactor_app_execution_change", args=[parked.pk])
    assert f'href="{parked_url}"' in parked_list
    assert f'href="{holder_url}"' in parked_list  # the blocker, linked
    assert "acct:13" in parked_list and "<code>charge</code>" in parked_list
    assert "reactor-status-parked" in parked_list and "TTL left 2" in parked_list

    failed = text(staff_client.get("/admin/reactor_app/execution/", {"status__exact": "failed"}))
    assert str(parked.pk) not in failed
    parked_only = text(
        staff_client.get("/admin/reactor_app/execution/", {"status__exact": "parked"})
    )
    assert str(parked.pk) in parked_only and "reactor-status-parked" in parked_only
    detail = text(staff_client.get(parked_url))
    assert "not a failure" in detail and "lock acct:13 (charge)" in detail
    why = text(staff_client.get(f"/admin/reactor_app/parkedexecution/{contention.pk}/change/"))
    assert f'href="{holder_url}"' in why and "was 26.0s when it parked" in why


@pytest.mark.django_db
def test_execution_search_by_key_and_by_id(staff_client: Client) -> None:
    keyed = make_execution(ExecutionStatus.SUCCEEDED)
    other = make_execution(ExecutionStatus.SUCCEEDED)
    CoordinationEvent.objects.create(
        execution=keyed,
        primitive="lock",
        key="acct:14",
        kind="acquired",
        owner=str(keyed.pk),
        at=timezone.now(),
    )
    found = text(staff_client.get("/admin/reactor_app/execution/", {"q": "acct:14"}))
    assert str(keyed.pk) in found and str(other.pk) not in found
    by_id = text(staff_client.get("/admin/reactor_app/execution/", {"q": str(other.pk)[:8]}))
    assert str(other.pk) in by_id and str(keyed.pk) not in by_id


# -- staff actions ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_force_release_is_refused_without_staff_or_permission(
    plain_client: Client, staff_client: Client, client: Client
) -> None:
    with running(PaymentReactor, "admin-refuse", account_id=15) as payment:
        params = {"primitive": "lock", "key": "acct:15"}
        for anonymous_or_plain in (client, plain_client):
            response = anonymous_or_plain.post(FORCE_RELEASE, params)
            assert response.status_code == 302 and "/admin/login/" in response["Location"]
        # staff, but without reactor_app.force_release
        assert staff_client.get(FORCE_RELEASE, params).status_code == 403
        assert staff_client.post(FORCE_RELEASE, params).status_code == 403
        assert_locked("acct:15", by_execution=payment.execution_id)
        assert "force release" not in text(staff_client.get(COORDINATION))
    assert not CoordinationEvent.objects.filter(kind=CoordinationEventKind.FORCED_RELEASE).exists()


@pytest.mark.django_db(transaction=True)
def test_force_release_by_an_operator_frees_the_key_and_the_holder_loses_its_lease(
    operator_client: Client,
) -> None:
    with running(FragileReactor, "admin-force", account_id=16) as fragile:
        page = text(operator_client.get(COORDINATION))
        assert "force release" in row_of(page, "lease:16")
        params = {"primitive": "lock", "key": "lease:16", "owner": fragile.execution_id}
        confirm = text(operator_client.get(FORCE_RELEASE, params))
        assert "LeaseLost" in confirm and fragile.execution_id in confirm
        assert_locked("lease:16")  # GET changed nothing

        response = operator_client.post(FORCE_RELEASE, params)
        assert response.status_code == 302
        assert_not_locked("lease:16")

        # the holder's next renewal finds the lock gone: LeaseLost at its next checkpoint
        assert fragile.gate.lost.wait(5), "the holder never noticed"
        assert isinstance(fragile.gate.seen["lost"], LeaseLost)
    result = fragile.outcome["result"]
    assert result.status == "failed" and isinstance(result.error, LeaseLost)

    audit = CoordinationEvent.objects.get(kind=CoordinationEventKind.FORCED_RELEASE)
    assert (audit.key, audit.primitive, audit.step) == ("lease:16", "lock", "work")
    assert str(audit.execution_id) == fragile.execution_id
    assert audit.owner == fragile.execution_id
    assert audit.token == fragile.gate.seen["token"]
    assert audit.detail["by"] == "operator"
    assert CoordinationEvent.objects.filter(
        kind=CoordinationEventKind.LEASE_LOST, key="lease:16"
    ).exists()


@pytest.mark.django_db
def test_a_force_release_is_audited_whatever_the_tracking_level(
    operator_client: Client, settings: Any
) -> None:
    settings.REACTOR_TRACKING = "executions"  # no coordination events... but audits
    holder = Holder(owner="stuck-owner", step="charge", reactor="shop.Pay")
    assert isinstance(Coordinator().admit([LockClaim("acct:audit", ttl=60)], holder), Admitted)
    params = {"primitive": "lock", "key": "acct:audit", "owner": ""}
    assert operator_client.post(FORCE_RELEASE, params).status_code == 302
    assert_not_locked("acct:audit")
    audit = CoordinationEvent.objects.get(kind=CoordinationEventKind.FORCED_RELEASE)
    assert (audit.key, audit.owner, audit.step) == ("acct:audit", "stuck-owner", "charge")
    assert not CoordinationEvent.objects.exclude(pk=audit.pk).exists()  # nothing else written


@pytest.mark.django_db
def test_a_force_release_whose_audit_row_cannot_be_written_never_reports_success(
    operator_client: Client, monkeypatch: Any
) -> None:
    from django.db import DatabaseError

    from reactor_app.operator import operations

    claim = LockClaim("acct:unaudited", ttl=60)
    assert isinstance(Coordinator().admit([claim], Holder(owner="o")), Admitted)
    # a parked execution waits for the key: the forced release grants it the key
    assert not isinstance(Coordinator().admit([claim], Holder("w"), waiter_id="w-exec"), Admitted)
    woken: list[list[str]] = []
    monkeypatch.setattr(operations, "wake", lambda ids: woken.append(list(ids)))

    def unwritable(**fields: Any) -> Any:
        raise DatabaseError("the audit table is gone")

    monkeypatch.setattr(CoordinationEvent.objects, "create", unwritable)
    params = {"primitive": "lock", "key": "acct:unaudited", "owner": ""}
    response = operator_client.post(FORCE_RELEASE, params, follow=True)
    page = text(response)
    assert "audit row could not be written" in page and "the audit table is gone" in page
    assert "held by o" not in page  # no success message
    # the waiter it was granted to is re-enqueued all the same, not left to its backoff
    assert woken == [["w-exec"]]


@pytest.mark.django_db
def test_a_key_with_spaces_at_its_ends_is_force_released_as_it_is(
    operator_client: Client,
) -> None:
    """Keys are exact text: the form must not trim " acct:1 " into another key."""
    coordinator = Coordinator()
    assert isinstance(
        coordinator.admit([LockClaim(" acct:1 ", ttl=60)], Holder(owner="a")), Admitted
    )
    assert isinstance(coordinator.admit([LockClaim("acct:1", ttl=60)], Holder(owner="b")), Admitted)
    params = {"primitive": "lock", "key": " acct:1 ", "owner": ""}
    assert operator_client.post(FORCE_RELEASE, params).status_code == 302
    assert_not_locked(" acct:1 ")
    assert_locked("acct:1")


@pytest.mark.django_db
def test_force_released_hold_reports_lease_lost_at_the_next_renewal(
    operator_client: Client,
) -> None:
    """The same claim at the coordination layer: a renewal after a forced release is lost."""
    coordinator = Coordinator()
    holder = Holder(owner="holder-1", step="charge")
    admitted = coordinator.admit([LockClaim("acct:17", ttl=30)], holder)
    assert_locked("acct:17")

    response = operator_client.post(FORCE_RELEASE, {"primitive": "lock", "key": "acct:17"})
    assert response.status_code == 302

    renewal = Renewal(admitted, coordinator=coordinator, interval=0.02).start()
    deadline = time.monotonic() + 5
    while renewal.lost is None and time.monotonic() < deadline:
        time.sleep(0.01)
    renewal.stop()
    assert isinstance(renewal.lost, LeaseLost)
    assert renewal.lost.key == "acct:17"
    event = CoordinationEvent.objects.get(kind=CoordinationEventKind.FORCED_RELEASE)
    assert event.owner == "holder-1" and event.step == "charge"


@pytest.mark.django_db
def test_an_ordered_reset_whose_audit_row_cannot_be_written_says_so(
    operator_client: Client, monkeypatch: Any
) -> None:
    from django.db import DatabaseError

    Coordinator().assign_position("line:19", Holder(owner="first", step="ship"))

    def unwritable(**fields: Any) -> Any:
        raise DatabaseError("the audit table is gone")

    monkeypatch.setattr(CoordinationEvent.objects, "create", unwritable)
    reset = COORDINATION + "ordered-reset/"
    page = text(operator_client.post(reset, {"key": "line:19"}, follow=True))
    assert "audit row could not be written" in page and "the audit table is gone" in page
    assert coordination_state().ordered_lock("line:19").positions == []  # it was applied


@pytest.mark.django_db
def test_ordered_lock_skip_and_reset(
    operator_client: Client, staff_client: Client, plain_client: Client
) -> None:
    coordinator = Coordinator()
    first = make_execution(ExecutionStatus.PARKED)
    coordinator.assign_position(
        "line:18", Holder(owner=str(first.pk), execution_id=str(first.pk), step="ship")
    )
    coordinator.assign_position("line:18", Holder(owner="second", step="ship"))
    skip, reset = COORDINATION + "ordered-skip/", COORDINATION + "ordered-reset/"

    assert plain_client.post(skip, {"key": "line:18"}).status_code == 302
    assert staff_client.post(skip, {"key": "line:18"}).status_code == 403
    assert_ordered_lock("line:18", last_completed=0)

    confirm = text(operator_client.get(skip, {"key": "line:18"}))
    assert "position 1" in confirm and "Yes, I\u2019m sure" in confirm
    assert operator_client.post(skip, {"key": "line:18"}).status_code == 302
    assert_ordered_lock("line:18", last_completed=1)
    skipped = CoordinationEvent.objects.get(kind=CoordinationEventKind.ORDERED_SKIPPED)
    assert skipped.detail["nonce"] == 1 and skipped.execution_id == first.pk
    assert skipped.step == "ship" and skipped.detail["by"] == "operator"

    assert operator_client.post(reset, {"key": "line:18"}).status_code == 302
    after = coordination_state().ordered_lock("line:18")
    assert after.positions == [] and after.head is None
    audit = CoordinationEvent.objects.get(kind=CoordinationEventKind.ORDERED_RESET)
    assert audit.detail["previous"]["waiting"] == [2] and audit.detail["by"] == "operator"

    # the dashboard lists the key among recently active ones, with its line state
    page = text(operator_client.get(COORDINATION))
    assert 'data-key="line:18"' in page and "ordered-skip/?key=line%3A18" in page


@pytest.mark.django_db
def test_semaphore_occupancy_and_releasing_one_slot(operator_client: Client) -> None:
    coordinator = Coordinator()
    first = make_execution(ExecutionStatus.RUNNING)
    second = make_execution(ExecutionStatus.RUNNING)
    for execution in (first, second):
        holder = Holder(owner=str(execution.pk), execution_id=str(execution.pk), step="export")
        admitted = coordinator.admit([SemaphoreClaim("pool:19", limit=3)], holder)
        assert admitted.holds

    page = text(operator_client.get(COORDINATION))
    occupancy = page[page.index('id="semaphores"') : page.index('id="inspect"')]
    assert re.search(r'pool:19</td><td>2</td><td class="semaphore-limit">3</td>', occupancy)
    # the limit was stored by the admissions: no need to type it to see the free slots
    inspected = text(
        operator_client.get(COORDINATION, {"primitive": "semaphore", "key": "pool:19"})
    )
    assert "2 held of 3 (1 free)" in inspected
    api = operator_client.get("/api/reactor/holds/", {"primitive": "semaphore"}).json()
    assert {h["execution"] for h in api["results"]} == {str(first.pk), str(second.pk)}
    assert {h["step"] for h in api["results"]} == {"export"}
    assert {h["limit"] for h in api["results"]} == {3}

    params = {"primitive": "semaphore", "key": "pool:19", "owner": str(first.pk)}
    assert operator_client.post(FORCE_RELEASE, params).status_code == 302
    remaining = operator_client.get("/api/reactor/holds/", {"key": "pool:19"}).json()
    assert [h["execution"] for h in remaining["results"]] == [str(second.pk)]
    audit = CoordinationEvent.objects.get(kind=CoordinationEventKind.FORCED_RELEASE)
    assert (audit.primitive, audit.execution_id, audit.step) == ("semaphore", first.pk, "export")


@pytest.mark.django_db
def test_pages_say_when_redis_is_unreachable(staff_client: Client, settings: Any) -> None:
    settings.REACTOR_REDIS_URL = "redis://127.0.0.1:1/0"
    page = text(staff_client.get(COORDINATION))
    assert "Coordination store unreachable" in page
    timeline_page = text(staff_client.get(TIMELINE, {"key": "acct:1"}))
    assert "Coordination store unreachable" in timeline_page


@pytest.mark.django_db
def test_coordination_page_pages_and_searches_the_live_holds(staff_client: Client) -> None:
    coordinator = Coordinator()
    for n in range(120):
        holder = Holder(owner=f"owner-{n}", step="sync" if n % 2 else None, reactor="shop.Sync")
        claim = LockClaim(f"k:{n:03d}", ttl=60) if n % 4 else SemaphoreClaim(f"k:{n:03d}", 2)
        assert isinstance(coordinator.admit([claim], holder), Admitted)

    def keys_of(html: str) -> list[str]:
        table = html[html.index('id="holds-table"') : html.index('id="hold-pages"')]
        return re.findall(r'<tr class="hold hold-\w+" data-key="([^"]+)"', table)

    first = text(staff_client.get(COORDINATION))
    assert re.search(
        r'<strong id="hold-count">120</strong> live holds\s+\(90 locks, 30 semaphores\)', first
    )
    listed = keys_of(first)
    assert len(listed) == 50
    seen = list(listed)
    html = first
    while 'id="holds-next"' in html:
        link = re.search(r'<a href="([^"]+)" id="holds-next"', html)
        assert link is not None
        html = text(staff_client.get(COORDINATION + link.group(1).replace("&amp;", "&")))
        seen += keys_of(html)
    assert sorted(seen) == [f"k:{n:03d}" for n in range(120)]  # every hold once, 3 pages

    found = text(staff_client.get(COORDINATION, {"q": "k:042"}))
    assert keys_of(found) == ["k:042"]
    assert re.search(r'<strong id="hold-matching">1</strong> matching', found)
    by_step = keys_of(text(staff_client.get(COORDINATION, {"q": "k:00", "h_step": "sync"})))
    assert by_step == ["k:001", "k:003", "k:005", "k:007", "k:009"]
    semaphores = keys_of(text(staff_client.get(COORDINATION, {"h_primitive": "semaphore"})))
    assert len(semaphores) == 30 and all(int(k[2:]) % 4 == 0 for k in semaphores)
    reactor_level = text(staff_client.get(COORDINATION, {"h_level": "reactor", "q": "k:01"}))
    assert keys_of(reactor_level) == ["k:010", "k:012", "k:014", "k:016", "k:018"]
    assert len(first.encode()) < 200 * 1024

    # order links: newest first, time left either way (semaphores' leases: 60 s, locks' 60 s)
    assert re.search(r'id="hold-order">Order: <strong>oldest first</strong>', first)
    newest = text(staff_client.get(COORDINATION, {"h_order": "-acquired"}))
    assert keys_of(newest)[:3] == ["k:119", "k:118", "k:117"]
    link = re.search(r'<a href="\?([^"]*h_order=ttl[^"]*)#holds">least time left</a>', newest)
    assert link is not None
    least = text(staff_client.get(COORDINATION + "?" + link.group(1).replace("&amp;", "&")))
    assert keys_of(least)[:3] == ["k:000", "k:001", "k:002"]
    assert re.search(r"<strong>least time left</strong>", least)
    most = [*keys_of(text(staff_client.get(COORDINATION, {"h_order": "-ttl"})))]
    assert most[:3] == ["k:119", "k:118", "k:117"]
    # a key search lists by key whatever the order asked
    searched = text(staff_client.get(COORDINATION, {"q": "k:00", "h_order": "-ttl"}))
    assert keys_of(searched)[:3] == ["k:000", "k:001", "k:002"]
    assert "by key (searching by key)" in searched


@pytest.mark.django_db
def test_the_timeline_opens_zoomed_to_the_keys_events(staff_client: Client) -> None:
    burst = timezone.now() - timedelta(hours=3)
    for kind, seconds in ((CoordinationEventKind.ACQUIRED, 0), (CoordinationEventKind.RELEASED, 8)):
        CoordinationEvent.objects.create(
            kind=kind,
            primitive="lock",
            key="zoom:1",
            owner="o",
            step="s",
            at=burst + timedelta(seconds=seconds),
        )
    html = text(staff_client.get(TIMELINE, {"key": "zoom:1"}))
    assert 'id="timeline-zoomed"' in html
    start = (burst - timedelta(seconds=1)).strftime("%Y-%m-%d %H:%M:%S")
    end = (burst + timedelta(seconds=9)).strftime("%H:%M:%S")
    assert f'<span id="timeline-start">{start}</span>' in html
    assert f'<span id="timeline-end">{end}</span>' in html
    assert "no holds or parks" not in html  # the 8-second hold is drawn
    # a period link shows the last hour instead, where the burst is not
    widened = text(staff_client.get(TIMELINE, {"key": "zoom:1", "minutes": 60}))
    assert 'id="timeline-zoomed"' not in widened and "no holds or parks" in widened
