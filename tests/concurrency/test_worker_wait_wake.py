"""A caller waiting in-process is woken only when the release names it, in queue order.

Real Redis, real threads, ``Coordinator.admit_waiting`` as ``Gate._admit_or_park``
calls it. A release that frees a lock grants it to the head waiter and names it in the wake
message; the waiters further back keep sleeping (they ask Redis nothing) until their turn — or
until the grant would have lapsed unused, when they ask again. Synchronous callers
(``admit_waiting`` without a waiter id of their own) queue the same way and leave the line
when their wait runs out, handing on a key that was just handed to them.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import Any

import pytest

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim, Refused

KEY = "acct:wake"


class CountingCoordinator(Coordinator):
    """Counts the admissions each waiter asks for, and when it asked (monotonic)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: dict[str | None, int] = {}
        self.asked_at: dict[str | None, list[float]] = {}
        self._guard = threading.Lock()

    def admit(self, claims: Any, holder: Holder, *, waiter_id: str | None = None) -> Any:
        with self._guard:
            self.asked[waiter_id] = self.asked.get(waiter_id, 0) + 1
            self.asked_at.setdefault(waiter_id, []).append(time.monotonic())
        return super().admit(claims, holder, waiter_id=waiter_id)


def hold(owner: str) -> Admitted:
    admitted = Coordinator().admit([LockClaim(KEY, ttl=30)], Holder(owner=owner))
    assert isinstance(admitted, Admitted), admitted
    return admitted


def wait_until(condition: Any, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(message)
        time.sleep(0.01)


class Waiter(threading.Thread):
    """One caller waiting its turn on ``KEY``; once admitted it holds the key ``hold_for``
    seconds, records when it entered and left (and its name in ``log``), and releases it.

    Given a ``coordinator`` it is a worker delivery, as ``Gate._admit_or_park`` waits: refused
    first, then ``admit_waiting`` under its own waiter id (``wait:<name>``) through that
    coordinator (a counting one, say). Without, it is a synchronous caller (``Step.call`` with
    ``wait=``): ``admit_waiting`` with no waiter id of its own, through a coordinator of its own.
    """

    def __init__(
        self,
        name: str,
        hold_for: float,
        budget: float,
        *,
        coordinator: Coordinator | None = None,
        log: list[str] | None = None,
    ):
        super().__init__(daemon=True)
        self.coordinator = coordinator
        self.waiter_id = f"wait:{name}" if coordinator is not None else None
        self.holder = Holder(owner=name)
        self.hold_for = hold_for
        self.budget = budget
        self.log = log if log is not None else []
        self.entered: float | None = None
        self.left: float | None = None
        self.answer: Any = None

    def run(self) -> None:
        coordinator = self.coordinator or Coordinator()
        claims = [LockClaim(KEY, ttl=30)]
        refused = None
        if self.waiter_id is not None:
            refused = coordinator.admit(claims, self.holder, waiter_id=self.waiter_id)
            assert isinstance(refused, Refused), refused
        self.answer = coordinator.admit_waiting(
            claims, self.holder, self.budget, waiter_id=self.waiter_id, refused=refused
        )
        if isinstance(self.answer, Admitted):
            self.entered = time.monotonic()
            self.log.append(self.holder.owner)
            time.sleep(self.hold_for)
            self.left = time.monotonic()
            Coordinator().release(self.answer, "success")


def test_the_release_wakes_the_waiter_it_names_and_only_that_one() -> None:
    holder = hold("holder")
    coordinator = CountingCoordinator()
    # the first holds for less than its grant lasts (WAITING_GRANT_MS): the second is woken
    # by the first's release, not by the grant's end
    first = Waiter("first", hold_for=0.3, budget=20, coordinator=coordinator)
    second = Waiter("second", hold_for=0.0, budget=20, coordinator=coordinator)
    first.start()
    wait_until(lambda: Coordinator().waiters(LockClaim(KEY)) == ["wait:first"], 5, "no first")
    second.start()
    wait_until(
        lambda: Coordinator().waiters(LockClaim(KEY)) == ["wait:first", "wait:second"],
        5,
        "the second never queued",
    )
    # both subscribed and asked once more after subscribing, then sleep
    wait_until(lambda: coordinator.asked.get("wait:second") == 2, 5, "second never settled")
    time.sleep(0.2)
    before = dict(coordinator.asked)

    released_at = time.monotonic()
    Coordinator().release(holder, "success")
    wait_until(lambda: first.entered is not None, 5, "the named waiter was not woken")
    assert first.entered - released_at < 1.0  # woken by the release, not by a timeout

    second.join(10)
    first.join(10)
    assert isinstance(second.answer, Admitted)
    assert first.left is not None and second.entered is not None
    # the second was not named: it slept through the holder's release and asked nothing
    # while the first held the key (judged by when it asked, not by a sleep of this thread)
    asked_meanwhile = [t for t in coordinator.asked_at["wait:second"] if released_at <= t]
    assert all(t >= first.left for t in asked_meanwhile), (asked_meanwhile, first.left)
    assert second.entered >= first.left  # no overlap
    assert second.entered - first.left < 1.0  # woken by the first's release
    assert coordinator.asked["wait:second"] == before["wait:second"] + 1


def test_a_waiter_asks_again_when_a_grant_to_another_lapses_unused() -> None:
    """The head waiter is gone (its delivery died): the next one is not stranded until its
    budget ends; it asks again when the grant lapses (_lock.lua: WAITING_GRANT_MS)."""
    holder = hold("holder")
    claim = LockClaim(KEY, ttl=30)
    assert Coordinator().register_waiter(claim, "wait:gone")
    coordinator = CountingCoordinator()
    survivor = Waiter("survivor", hold_for=0.0, budget=20, coordinator=coordinator)
    survivor.start()
    wait_until(
        lambda: Coordinator().waiters(claim) == ["wait:gone", "wait:survivor"],
        5,
        "the survivor never queued",
    )
    wait_until(lambda: coordinator.asked.get("wait:survivor") == 2, 5, "never settled")

    pubsub = Coordinator().client.pubsub()
    channel = Coordinator().wake_channel(claim)
    pubsub.subscribe(channel)
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    released_at = time.monotonic()
    Coordinator().release(holder, "success")
    message = pubsub.get_message(timeout=5)
    pubsub.close()
    # the wake message names the waiter the key was granted to; a waiter waiting in-process
    # gets a short grant (a parked one's must cover its re-enqueue and redelivery)
    wake = json.loads(message["data"])
    assert wake["to"] == "wait:gone" and 0 < wake["grant_ms"] <= 1000

    survivor.join(20)
    assert isinstance(survivor.answer, Admitted), survivor.answer
    waited = survivor.entered - released_at
    grant = wake["grant_ms"] / 1000
    # not before the grant lapsed, and long before its 20 s budget would have ended
    assert grant - 0.05 <= waited < grant + 2.0, waited


def test_synchronous_waiters_are_admitted_in_the_order_they_queued() -> None:
    """Five callers wait on one held key, queued one after another: each release hands the key
    to the next in line, so they run in that order, one at a time, and none polls."""
    holder = hold("holder")
    log: list[str] = []
    waiters = [Waiter(f"caller-{n}", hold_for=0.05, budget=30, log=log) for n in range(5)]
    for n, waiter in enumerate(waiters):
        waiter.start()
        # queued: registered under its own "wait:" id after its first refusal
        wait_until(lambda n=n: len(Coordinator().waiters(LockClaim(KEY))) == n + 1, 5, "no queue")
    assert all(w.startswith("wait:") for w in Coordinator().waiters(LockClaim(KEY)))
    released_at = time.monotonic()
    Coordinator().release(holder, "success")
    for waiter in waiters:
        waiter.join(20)
    assert log == [f"caller-{n}" for n in range(5)]
    spans = sorted((w.entered, w.left) for w in waiters if w.entered and w.left)
    assert len(spans) == 5
    # no overlap
    assert all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(spans))
    # each hand-off went to a waiter already woken by name, not to one polling on a timer
    assert spans[-1][1] - released_at < 5 * 0.05 + 2.0
    assert Coordinator().waiters(LockClaim(KEY)) == []


def test_a_synchronous_waiter_that_gives_up_leaves_the_queue_and_hands_on_its_grant() -> None:
    """A caller whose wait runs out leaves the key's waiter order. And when a release had
    already handed the free key to a waiter that then leaves, the key goes on to the next
    waiter at once, not when the unused grant lapses. (The waiter that leaves is a parked
    one: its grant lasts HANDOFF_GRANT_MS, 3 s, so a stall of this test between the release
    and the leave cannot let it lapse first, as an in-process waiter's 0.5 s could.)"""
    holder = hold("holder")
    claim = LockClaim(KEY, ttl=30)
    impatient = Waiter("impatient", hold_for=0.0, budget=0.3, log=[])
    impatient.start()
    impatient.join(5)
    assert isinstance(impatient.answer, Refused)
    assert Coordinator().waiters(claim) == []  # it left when its wait ran out

    coordinator = Coordinator()
    assert coordinator.register_waiter(claim, "exec-leaving")  # queued first, then gone
    # the order is by Redis time in ms (ids break a tie): let the next waiter come strictly later
    time.sleep(0.005)
    log: list[str] = []
    patient = Waiter("patient", hold_for=0.0, budget=30, log=log)
    patient.start()
    wait_until(lambda: len(coordinator.waiters(claim)) == 2, 5, "the patient one never queued")
    leaving, patient_id = coordinator.waiters(claim)
    assert leaving == "exec-leaving" and patient_id.startswith("wait:")
    coordinator.release(holder, "success")  # grants the free key to "exec-leaving"
    time.sleep(0.05)
    assert log == []  # the patient one is not named: it sleeps
    left_at = time.monotonic()
    assert coordinator.unregister_waiter(claim, "exec-leaving") == [patient_id]
    patient.join(10)
    assert isinstance(patient.answer, Admitted), patient.answer
    # handed on at once — not when the grant lapses (HANDOFF_GRANT_MS, ~2.9 s after the leave)
    assert patient.entered is not None and patient.entered - left_at < 1.5
