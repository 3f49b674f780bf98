"""Live limits under concurrent operators, on real PostgreSQL/Redis with real threads (one
Redis server and a 3-master cluster where Redis is the subject):

* concurrent *first* overrides of one name — through the API, the admin and
  ``operator.limits`` — all succeed, the last write wins and every one is audited with the
  value it really replaced (``LimitOverrideQuerySet.put``);
* concurrent publishes never leave a stale set in Redis: the database's rows are read after
  the publisher's ticket and a set of an older ticket is dropped (``live_limits.publish``,
  ``lua/limits_publish.lua``).

Both at every transaction isolation level a project may configure (``tests.isolation_levels``):
at REPEATABLE READ the loser of a first override's race could not see the row the winner
committed, and concurrent changes failed to serialize — a server error in the API and the
admin, before the app ran its own transactions at READ COMMITTED (reactor_app/isolation.py).

The line's order when a limit is raised: test_live_limit_line.py.
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections
from django.test import Client

from reactor_app.coordination import live_limits
from reactor_app.managers import LimitOverrideQuerySet
from reactor_app.models import CoordinationEvent, LimitOverride
from reactor_app.operator import limits
from reactor_app.status import CoordinationEventKind
from tests.api import users
from tests.isolation_levels import LEVELS, at_level

pytestmark = pytest.mark.django_db(transaction=True)

API = "/api/reactor/limits/"
ADMIN = "/admin/reactor_app/coordination/limits/"
#: concurrent operators per limit, and limits raced per test (each name's first override is a
#: race of its own)
OPERATORS = 6
ROUNDS = 4


@pytest.fixture(autouse=True, params=LEVELS, ids=lambda level: level or "default-level")
def named(request: pytest.FixtureRequest, settings: Any, reactor_redis: Any) -> Iterator[None]:
    settings.REACTOR_LIMITS = {f"race{n}": {"limit": 1} for n in range(ROUNDS)}
    live_limits.forget_copy()
    with at_level(request.param):
        yield


def _together(actions: list[Callable[[], Any]]) -> list[Any]:
    """Run each action on its own thread, released at one barrier; what each returned or
    raised, in order."""
    barrier = threading.Barrier(len(actions))
    found: list[Any] = [None] * len(actions)

    def run(index: int) -> None:
        try:
            barrier.wait(30)
            found[index] = actions[index]()
        except BaseException as exc:  # reported by the test
            found[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(actions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "an operator never returned"
    return found


def _audit_trail(name: str) -> list[dict[str, Any]]:
    events = CoordinationEvent.objects.filter(
        kind=CoordinationEventKind.LIMIT_CHANGED, key=name
    ).order_by("id")
    return [event.detail for event in events]


def _assert_changes_chain(name: str, values: set[int]) -> None:
    """One audited change per operator, each replacing the value the previous one set; the
    row holds the last one, and Redis publishes it."""
    trail = _audit_trail(name)
    assert len(trail) == len(values), trail
    assert trail[0]["old"] is None, trail
    for before, after in itertools.pairwise(trail):
        assert after["old"] == before["new"], trail
    assert {change["new"]["limit"] for change in trail} == values
    row = LimitOverride.objects.get(primitive="semaphore", name=name)
    assert row.value == trail[-1]["new"]
    published = live_limits.read_published()[live_limits.field_name("semaphore", name)]
    assert published.value == row.value


def _api_post(client: Client, name: str, value: int) -> Callable[[], int]:
    body = json.dumps({"primitive": "semaphore", "name": name, "value": str(value)})
    return lambda: client.post(API, body, content_type="application/json").status_code


def _admin_post(client: Client, name: str, value: int) -> Callable[[], int]:
    body = {"primitive": "semaphore", "name": name, "value": str(value), "reason": "race"}
    return lambda: client.post(ADMIN, body).status_code


def _operator_call(client: Client, name: str, value: int) -> Callable[[], int]:
    def call() -> int:
        limits.set_override("semaphore", name, str(value), by="ops", reason="race")
        return 200

    return call


@pytest.mark.parametrize(
    ("through", "ok"), [(_api_post, 200), (_admin_post, 302), (_operator_call, 200)]
)
def test_concurrent_first_overrides_all_succeed_and_are_audited(
    django_user_model: Any, through: Any, ok: int
) -> None:
    """Found in review: two first overrides of one name both found no row to lock, both
    inserted, and the unique constraint made the later one a server error (500). Now the
    later insert waits for the earlier, then updates the row it committed."""
    user = users._staff(django_user_model, "limiter", "override_limit")
    clients = [users.logged_in(user) for _ in range(OPERATORS)]
    for round_ in range(ROUNDS):
        name = f"race{round_}"
        values = {2 + n for n in range(OPERATORS)}
        answers = _together(
            [through(client, name, value) for client, value in zip(clients, values, strict=True)]
        )
        assert answers == [ok] * OPERATORS, answers
        _assert_changes_chain(name, values)


@pytest.fixture
def slow_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A database that answers the publishers' reads slowly (a few ms, each its own): a
    publisher's write to Redis then lands long after its read, as on a loaded database."""
    read = LimitOverrideQuerySet.published

    def slowly(self: LimitOverrideQuerySet) -> dict[str, Any]:
        found = read(self)
        time.sleep(random.uniform(0, 0.03))
        return found

    monkeypatch.setattr(LimitOverrideQuerySet, "published", slowly)


@pytest.mark.usefixtures("slow_reads")
def test_concurrent_publishes_never_leave_an_older_value(redis_topology: str) -> None:
    """Found in review: each publish wrote whatever its database read found, in whatever
    order the writes arrived, so a set read before the last change could land after the
    set that had it — a stale limit every process obeyed until the next change."""
    name = "race0"
    limits.set_override("semaphore", name, "2", by="ops")
    for round_ in range(ROUNDS):
        values = {10 * (round_ + 1) + n for n in range(OPERATORS)}
        answers = _together(
            [
                _operator_call(Client(), name, value)
                for value in sorted(values, key=lambda _: random.random())
            ]
        )
        assert answers == [200] * OPERATORS, answers
        row = LimitOverride.objects.get(primitive="semaphore", name=name)
        published = live_limits.read_published()[live_limits.field_name("semaphore", name)]
        assert published.value == row.value, f"{redis_topology}: round {round_}"
        live_limits.forget_copy()
        assert live_limits.semaphore_limit(name) == row.value["limit"]


def test_an_older_set_is_never_published_over_a_newer_one(redis_topology: str) -> None:
    """The order itself: the set read under the later ticket stays, the one of the earlier
    ticket is dropped although it is written last."""

    def one(limit: int) -> dict[str, live_limits.Override]:
        return {
            live_limits.field_name("semaphore", "race0"): live_limits.Override(
                primitive="semaphore", name="race0", value={"limit": limit}, by="ops"
            )
        }

    late_reader_done = threading.Event()

    def slow_reader() -> dict[str, live_limits.Override]:
        # took its ticket first; reads (an older set) and writes only after the other did
        late_reader_done.wait(30)
        return one(3)

    first = threading.Thread(target=lambda: answers.append(live_limits.publish(slow_reader)))
    answers: list[bool] = []
    first.start()
    deadline = time.monotonic() + 30
    while not _ticket_taken():
        assert time.monotonic() < deadline, "the first publisher never took its ticket"
        time.sleep(0.005)
    assert live_limits.publish(one(5)) is True
    late_reader_done.set()
    first.join(30)
    assert answers == [False]
    assert live_limits.read_published()["semaphore:race0"].value == {"limit": 5}


def _ticket_taken() -> bool:
    from reactor_app.coordination.redis import get_client

    return get_client().hget(live_limits.hash_key(), live_limits.SEQUENCE_FIELD) is not None
