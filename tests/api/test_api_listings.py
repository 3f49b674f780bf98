"""The DRF API: who may read it, what each listing shows, filters, pagination, bad parameters.

Live holds are real: a reactor runs in a thread and waits inside its step while the test reads
``holds/`` (real Redis, no mocks). Parked executions are created through the ORM here; the
end-to-end park (a real worker-mode run refused by a real hold) is in ``test_api_contention``.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client, override_settings
from django.utils import timezone

from reactor_app.models import ContentionState, CoordinationEvent, Execution
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from tests.api.holding import PaymentReactor, ShopSyncReactor, running

API = "/api/reactor"
LISTINGS = ["executions/", "holds/", "events/", "contention/"]


def get(client: Client, path: str, **params: Any) -> Any:
    return client.get(f"{API}/{path}", params)


def make_execution(status: str = ExecutionStatus.SUCCEEDED, **fields: Any) -> Execution:
    fields.setdefault("reactor", "demo_project.shop.reactors.PaymentReactor")
    return Execution.objects.start(inputs={"account_id": 1}, status=status, **fields)


def make_parked(key: str = "acct:9", holder: Execution | None = None) -> Execution:
    """A parked execution, as the worker leaves it: status parked + a ContentionState row."""
    parked = make_execution(ExecutionStatus.PARKED, current_step="charge")
    holder = holder or make_execution(ExecutionStatus.RUNNING, current_step="charge")
    since = timezone.now() - timedelta(seconds=4)
    ContentionState.objects.create(
        execution=parked,
        step="charge",
        primitive="lock",
        key=key,
        attempts=2,
        next_attempt_at=timezone.now() + timedelta(seconds=3),
        blocker={
            "owner": str(holder.pk),
            "execution": str(holder.pk),
            "step": "charge",
            "reactor": holder.reactor,
            "since": since.timestamp(),
            "ttl": 26.0,
        },
    )
    return parked


# -- access -----------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("listing", LISTINGS)
def test_anonymous_is_refused(anonymous_client: Client, listing: str) -> None:
    response = get(anonymous_client, listing)
    assert response.status_code in (401, 403)


@pytest.mark.django_db
@pytest.mark.parametrize("listing", LISTINGS)
def test_non_staff_is_refused(plain_client: Client, listing: str) -> None:
    response = get(plain_client, listing)
    assert response.status_code == 403
    assert "staff" in response.json()["detail"]


@pytest.mark.django_db
@pytest.mark.parametrize("listing", LISTINGS)
def test_staff_may_read(staff_client: Client, listing: str) -> None:
    response = get(staff_client, listing)
    assert response.status_code == 200, response.content
    expected = {"count", "next", "previous", "results"}
    if listing == "holds/":
        expected.add("totals")  # per primitive, from the live-holds index
    assert set(response.json()) == expected


@pytest.mark.django_db
def test_permission_classes_come_from_settings(plain_client: Client) -> None:
    with override_settings(
        REACTOR_API_PERMISSION_CLASSES=["rest_framework.permissions.IsAuthenticated"]
    ):
        assert get(plain_client, "executions/").status_code == 200
    assert get(plain_client, "executions/").status_code == 403


@pytest.mark.django_db
def test_schema_is_served(anonymous_client: Client) -> None:
    response = anonymous_client.get(f"{API}/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for listing in LISTINGS:
        assert f"{API}/{listing}" in paths


# -- live holds -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_live_hold_of_a_running_step_is_listed_with_its_step_and_execution(
    staff_client: Client,
) -> None:
    with (
        running(PaymentReactor, "api-step", account_id=7) as payment,
        running(ShopSyncReactor, "api-reactor", shop_id=3) as shop,
    ):
        body = get(staff_client, "holds/").json()
        holds = {h["key"]: h for h in body["results"]}
        assert body["count"] == 2

        step_hold = holds["acct:7"]
        assert step_hold["primitive"] == "lock"
        assert step_hold["level"] == "step"
        assert step_hold["step"] == "charge"
        assert step_hold["execution"] == payment.execution_id
        assert step_hold["owner"] == payment.execution_id
        assert step_hold["execution_status"] == ExecutionStatus.RUNNING
        assert step_hold["reactor"].endswith("PaymentReactor")
        assert step_hold["count"] == 1
        assert step_hold["token"] == payment.gate.seen["token"]
        assert 0 < step_hold["ttl_left"] <= 30
        acquired = datetime.fromisoformat(step_hold["acquired_at"])
        assert abs((timezone.now() - acquired).total_seconds()) < 30

        # the reactor-level hold is listed beside it, identified as such
        reactor_hold = holds["shop:3"]
        assert reactor_hold["level"] == "reactor"
        assert reactor_hold["step"] is None
        assert reactor_hold["execution"] == shop.execution_id

        # filters
        only = get(staff_client, "holds/", key="acct:7").json()["results"]
        assert [h["key"] for h in only] == ["acct:7"]
        assert [h["key"] for h in get(staff_client, "holds/", step="charge").json()["results"]] == [
            "acct:7"
        ]
        by_level = get(staff_client, "holds/", level="reactor").json()["results"]
        assert [h["key"] for h in by_level] == ["shop:3"]
        by_execution = get(staff_client, "holds/", execution=shop.execution_id).json()
        assert [h["key"] for h in by_execution["results"]] == ["shop:3"]
        assert get(staff_client, "holds/", primitive="semaphore").json()["count"] == 0
        assert get(staff_client, "holds/", page_size=1).json()["next"] is not None

    payment.finish()
    shop.finish()
    assert get(staff_client, "holds/").json()["count"] == 0
    # and the history says what happened, step-attributed
    events = get(staff_client, "events/", key="acct:7").json()["results"]
    assert [e["kind"] for e in reversed(events)] == ["acquired", "released"]
    assert {e["step"] for e in events} == {"charge"}
    assert {e["execution"] for e in events} == {payment.execution_id}


@pytest.mark.django_db
def test_holds_answer_503_when_redis_is_unreachable(staff_client: Client) -> None:
    with override_settings(REACTOR_REDIS_URL="redis://127.0.0.1:1/0"):
        response = get(staff_client, "holds/")
    assert response.status_code == 503
    assert "unreachable" in response.json()["detail"]


# -- contention: parked is not failed ---------------------------------------------------------


@pytest.mark.django_db
def test_parked_execution_is_listed_under_contention_with_its_blocker(
    staff_client: Client,
) -> None:
    holder = make_execution(ExecutionStatus.RUNNING, current_step="charge")
    parked = make_parked("acct:9", holder)
    make_execution(ExecutionStatus.FAILED)

    rows = get(staff_client, "contention/").json()["results"]
    assert len(rows) == 1
    row = rows[0]
    assert row["execution"] == str(parked.pk)
    assert row["execution_status"] == "parked"
    assert (row["level"], row["step"], row["primitive"], row["key"]) == (
        "step",
        "charge",
        "lock",
        "acct:9",
    )
    assert row["attempts"] == 2
    assert row["next_attempt_at"] is not None
    blocker = row["blocker"]
    assert blocker["execution"] == str(holder.pk)
    assert blocker["step"] == "charge"
    assert blocker["ttl"] == 26.0
    assert datetime.fromisoformat(blocker["since"]) < timezone.now()

    # parked reads as parked, never as failed
    failed = get(staff_client, "executions/", status="failed").json()["results"]
    assert str(parked.pk) not in {e["id"] for e in failed}
    listed = get(staff_client, "executions/", status="parked").json()["results"]
    assert [(e["id"], e["status"], e["parked"]) for e in listed] == [
        (str(parked.pk), "parked", True)
    ]
    detail = get(staff_client, f"executions/{parked.pk}/").json()
    assert detail["status"] == "parked" and detail["error"] is None
    assert detail["contention"][0]["blocker"]["execution"] == str(holder.pk)

    # filters
    assert get(staff_client, "contention/", key="acct:9").json()["count"] == 1
    assert get(staff_client, "contention/", key="acct:1").json()["count"] == 0
    assert get(staff_client, "contention/", reactor="PaymentReactor").json()["count"] == 1
    assert get(staff_client, "contention/", primitive="semaphore").json()["count"] == 0

    # once resumed, it is no longer contention
    Execution.objects.filter(pk=parked.pk).update(status=ExecutionStatus.RUNNING)
    assert get(staff_client, "contention/").json()["count"] == 0


# -- executions and events --------------------------------------------------------------------


@pytest.mark.django_db
def test_execution_filters(staff_client: Client) -> None:
    old = make_execution(ExecutionStatus.SUCCEEDED)
    Execution.objects.filter(pk=old.pk).update(created_at=datetime(2020, 1, 1, tzinfo=UTC))
    new = make_execution(ExecutionStatus.FAILED, reactor="other.app.reactors.SyncReactor")

    def ids(**params: Any) -> set[str]:
        return {e["id"] for e in get(staff_client, "executions/", **params).json()["results"]}

    assert ids() == {str(old.pk), str(new.pk)}
    assert ids(status="failed") == {str(new.pk)}
    assert ids(reactor="SyncReactor") == {str(new.pk)}
    assert ids(reactor="demo_project.shop.reactors.PaymentReactor") == {str(old.pk)}
    assert ids(created_after="2021-01-01T00:00:00Z") == {str(new.pk)}
    assert ids(created_before="2021-01-01T00:00:00Z") == {str(old.pk)}
    assert ids(status="") == {str(old.pk), str(new.pk)}  # blank = no filter

    detail = get(staff_client, f"executions/{new.pk}/").json()
    assert detail["status"] == "failed" and detail["step_runs"] == []
    assert get(staff_client, f"executions/{uuid.uuid4()}/").status_code == 404


@pytest.mark.django_db
def test_event_filters(staff_client: Client) -> None:
    execution = make_execution(ExecutionStatus.RUNNING)
    now = timezone.now()

    def event(kind: str, key: str, minutes_ago: float, step: str = "charge") -> CoordinationEvent:
        return CoordinationEvent.objects.create(
            execution=execution,
            step=step,
            reactor=execution.reactor,
            primitive="lock",
            key=key,
            kind=kind,
            owner=str(execution.pk),
            token=1,
            at=now - timedelta(minutes=minutes_ago),
        )

    acquired = event(CoordinationEventKind.ACQUIRED, "acct:1", 30)
    released = event(CoordinationEventKind.RELEASED, "acct:1", 20)
    other = event(CoordinationEventKind.ACQUIRED, "acct:2", 5, step="")

    def ids(**params: Any) -> list[int]:
        return [e["id"] for e in get(staff_client, "events/", **params).json()["results"]]

    assert ids() == [other.pk, released.pk, acquired.pk]  # newest first
    assert ids(key="acct:1") == [released.pk, acquired.pk]
    assert ids(kind="acquired") == [other.pk, acquired.pk]
    assert ids(execution=str(execution.pk)) == [other.pk, released.pk, acquired.pk]
    assert ids(execution=str(uuid.uuid4())) == []
    since = (now - timedelta(minutes=25)).isoformat()
    until = (now - timedelta(minutes=10)).isoformat()
    assert ids(since=since) == [other.pk, released.pk]
    assert ids(since=since, until=until) == [released.pk]
    body = get(staff_client, "events/", key="acct:2").json()["results"][0]
    assert body["level"] == "reactor" and body["step"] == ""


# -- pagination and bad parameters ------------------------------------------------------------


@pytest.mark.django_db
def test_pagination(staff_client: Client) -> None:
    created = [make_execution() for _ in range(7)]
    first = get(staff_client, "executions/", page_size=3).json()
    assert first["count"] == 7 and len(first["results"]) == 3
    assert first["previous"] is None and "page=2" in first["next"]
    last = get(staff_client, "executions/", page_size=3, page=3).json()
    assert len(last["results"]) == 1 and last["next"] is None
    seen = [
        e["id"]
        for page in (1, 2, 3)
        for e in get(staff_client, "executions/", page_size=3, page=page).json()["results"]
    ]
    assert sorted(seen) == sorted(str(e.pk) for e in created)  # no overlap, nothing skipped


BAD_PARAMETERS = [
    ("executions/", {"status": "exploded"}, "status"),
    ("executions/", {"created_after": "yesterday"}, "created_after"),
    ("executions/", {"created_before": "2025-13-45T00:00:00Z"}, "created_before"),
    (
        "executions/",
        {"created_after": "2025-02-01T00:00:00Z", "created_before": "2025-01-01T00:00:00Z"},
        "created_after",
    ),
    ("events/", {"kind": "vanished"}, "kind"),
    ("events/", {"since": "not-a-date"}, "since"),
    ("events/", {"execution": "not-a-uuid"}, "execution"),
    ("events/", {"primitive": "mutex"}, "primitive"),
    ("holds/", {"primitive": "rate_limit"}, "primitive"),
    ("holds/", {"level": "galaxy"}, "level"),
    ("contention/", {"primitive": "mutex"}, "primitive"),
    ("executions/", {"page": "abc"}, "page"),
    ("executions/", {"page": "0"}, "page"),
    ("executions/", {"page": "99"}, "page"),
    ("executions/", {"page_size": "0"}, "page_size"),
    ("executions/", {"page_size": "many"}, "page_size"),
    ("executions/", {"page_size": "100000"}, "page_size"),
    ("events/", {"key": "a\x00b"}, "key"),
    ("executions/", {"stauts": "failed"}, "stauts"),  # a misspelt filter is not ignored
    ("contention/", {"foo": "1"}, "foo"),
    ("holds/", {"kind": "acquired"}, "kind"),  # a filter of another listing
    ("holds/", {"cursor": "not-a-cursor"}, "cursor"),
    ("holds/", {"page": "2"}, "page"),  # holds are paged by cursor
    ("holds/", {"page_size": "0"}, "page_size"),
    ("holds/", {"key_prefix": "a\x00b"}, "key_prefix"),
    ("holds/", {"ordering": "owner"}, "ordering"),
    ("holds/", {"ordering": "ttl", "key_prefix": "acct:"}, "ordering"),  # listed by key
    ("holds/", {"ordering": "-ttl", "key": "acct:1"}, "ordering"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("listing", "params", "name"), BAD_PARAMETERS)
def test_bad_parameters_are_400_with_a_message(
    staff_client: Client, listing: str, params: dict[str, str], name: str
) -> None:
    response = get(staff_client, listing, **params)
    assert response.status_code == 400, response.content
    messages = response.json()[name]
    assert messages and all(isinstance(m, str) and m for m in messages)


@pytest.mark.django_db
def test_unknown_status_message_lists_the_valid_ones(staff_client: Client) -> None:
    message = get(staff_client, "executions/", status="exploded").json()["status"][0]
    assert "exploded" in message and "parked" in message and "failed" in message


@pytest.mark.django_db
def test_holds_are_paged_by_cursor_and_filtered_by_key_prefix(staff_client: Client) -> None:
    from reactor_app.coordination.admission import Coordinator
    from reactor_app.coordination.claims import Holder, LockClaim, SemaphoreClaim

    coordinator = Coordinator()
    for n in range(25):
        holder = Holder(owner=f"o{n}", execution_id=None, step="sync", reactor="shop.Sync")
        coordinator.admit([LockClaim(f"acct:{n}", ttl=60)], holder)
    coordinator.admit([SemaphoreClaim("pool", limit=3)], Holder(owner="p", reactor="shop.Pool"))

    seen: list[str] = []
    body = get(staff_client, "holds/", page_size=10).json()
    assert body["count"] == 26 and body["totals"] == {"lock": 25, "semaphore": 1}
    while True:
        seen += [h["key"] for h in body["results"]]
        if body["next"] is None:
            break
        assert "cursor=" in body["next"] and body["previous"] is None
        body = staff_client.get(body["next"]).json()
    assert sorted(seen) == sorted([f"acct:{n}" for n in range(25)] + ["pool"])  # each once

    under = get(staff_client, "holds/", key_prefix="acct:1").json()
    assert [h["key"] for h in under["results"]] == ["acct:1", *[f"acct:1{n}" for n in range(10)]]
    assert under["count"] == 11 and under["next"] is None
    pool = get(staff_client, "holds/", reactor="Pool").json()["results"]
    assert [(h["key"], h["primitive"]) for h in pool] == [("pool", "semaphore")]
    assert get(staff_client, "holds/", primitive="semaphore").json()["count"] == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "data",
    [
        {"m": "x", "s": None},
        {"m": "x", "s": [1]},
        {"m": "x", "s": "nan"},
        {"m": "x", "s": float("nan")},
        {"m": "x", "s": True},
        {"m": "x", "s": 10**310},  # an int beyond any float
        {"m": "x", "s": 1.0, "o": "sideways"},
        {"m": 1},
        ["m"],
    ],
)
def test_a_crafted_holds_cursor_is_a_400_never_a_500(staff_client: Client, data: Any) -> None:
    import base64
    import json

    from reactor_app.coordination.admission import Coordinator
    from reactor_app.coordination.claims import Holder, LockClaim

    Coordinator().admit([LockClaim("acct:1", ttl=60)], Holder(owner="o1"))
    cursor = base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")
    response = get(staff_client, "holds/", cursor=cursor)
    assert response.status_code == 400, (response.status_code, response.content)
    assert "cursor" in response.content.decode()


@pytest.mark.django_db
def test_holds_are_ordered_by_time_left_across_cursor_pages(staff_client: Client) -> None:
    from reactor_app.coordination.admission import Coordinator
    from reactor_app.coordination.claims import Holder, LockClaim, SemaphoreClaim

    coordinator = Coordinator()
    for n in range(12):
        claim = LockClaim(f"t:{n}", ttl=100 - n) if n % 3 else SemaphoreClaim(f"t:{n}", 2, 100 - n)
        coordinator.admit([claim], Holder(owner=f"o{n}"))
        time.sleep(0.002)  # one acquisition per millisecond (ties are ordered by member)
    for ordering, expected in (
        ("ttl", [f"t:{n}" for n in reversed(range(12))]),
        ("-ttl", [f"t:{n}" for n in range(12)]),
        ("-acquired", [f"t:{n}" for n in reversed(range(12))]),
        ("acquired", [f"t:{n}" for n in range(12)]),
    ):
        seen: list[str] = []
        body = get(staff_client, "holds/", page_size=5, ordering=ordering).json()
        while True:
            seen += [h["key"] for h in body["results"]]
            if body["next"] is None:
                break
            assert f"ordering={ordering}" in body["next"]
            body = staff_client.get(body["next"]).json()
        assert seen == expected, ordering
    # a cursor of one ordering is not a cursor of another
    first = get(staff_client, "holds/", page_size=5, ordering="ttl").json()
    cursor = first["next"].split("cursor=")[1].split("&")[0]
    response = get(staff_client, "holds/", page_size=5, ordering="-ttl", cursor=cursor)
    assert response.status_code == 400 and response.json()["cursor"]
