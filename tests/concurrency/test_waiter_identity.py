"""One waiter, one entry in a key's line, whichever form it asks in.

A worker execution is in a lock's waiter line in two forms: ``<id>`` once it parked, and
``wait:<id>`` while a delivery of it waits in-process (``REACTOR_WORKER_WAIT``). They are the
same waiter: a release's grant to either form is its grant, its admission removes both, and a
line never holds both. Before, a parked ``<id>`` stayed in the line after its delivery was
admitted as ``wait:<id>`` (a later release then granted the free key to an execution that had
already run, for ``HANDOFF_GRANT_MS``), and a woken parked execution asking as ``wait:<id>``
was refused by its own grant and waited out its in-process wait.

Real Redis (the suite's), the Coordinator's own calls; each case runs through the single-lock
fast path (``lock_admit.lua``) and through the general script (``admit.lua``, a lock with a
semaphore). Last, a release through a step's gate passes over a waiter whose execution has
finished (``engine.finished_waiters``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from reactor_app import Step, Success, with_lock, with_semaphore
from reactor_app.coordination import state
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    WAITING_PREFIX,
    AdmissionResult,
    Admitted,
    Claim,
    Holder,
    LockClaim,
    Refused,
    SemaphoreClaim,
)
from reactor_app.dsl.declarations import LockDeclaration
from reactor_app.engine import enqueueing
from reactor_app.engine.gate import Gate, GateScope
from reactor_app.models import CoordinationEvent, Execution
from reactor_app.signals import coordination_event
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from reactor_app.write_behind import flush


def _lock_only(key: str, ttl: float) -> list[Claim]:
    return [LockClaim(key, ttl=ttl)]


def _lock_and_semaphore(key: str, ttl: float) -> list[Claim]:
    return [LockClaim(key, ttl=ttl), SemaphoreClaim(f"{key}:pool", limit=5, ttl=ttl)]


@pytest.fixture(params=[_lock_only, _lock_and_semaphore], ids=["lock_admit", "admit"])
def claims_for(request: pytest.FixtureRequest) -> Callable[[str, float], list[Claim]]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def coordinator(redis_prefix: str) -> Coordinator:
    return Coordinator(prefix=redis_prefix)


def _line(coordinator: Coordinator, key: str) -> list[str]:
    return coordinator.waiters(LockClaim(key))


def _wait_lapsed(coordinator: Coordinator, key: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while state.lock_state(key, prefix=coordinator.prefix).held:
        assert time.monotonic() < deadline, "the short lease never lapsed"
        time.sleep(0.02)


def test_a_parked_waiter_admitted_as_its_waiting_form_is_not_granted_the_key_later(
    coordinator: Coordinator, claims_for: Callable[[str, float], list[Claim]]
) -> None:
    """The stale waiter: parked as ``exec-b``; its holder's lease lapses (no release, so no
    grant); its next delivery is admitted as ``wait:exec-b``. Its release must not hand the
    key to ``exec-b`` — nobody would come for it — but leave it free for the next caller."""
    key = "acct:stale"
    first = coordinator.admit(claims_for(key, 0.2), Holder(owner="a"))
    assert isinstance(first, Admitted)
    parked = coordinator.admit(claims_for(key, 30), Holder(owner="b"), waiter_id="exec-b")
    assert isinstance(parked, Refused) and _line(coordinator, key) == ["exec-b"]
    _wait_lapsed(coordinator, key)

    delivery = coordinator.admit(
        claims_for(key, 30), Holder(owner="b"), waiter_id=f"{WAITING_PREFIX}exec-b"
    )
    assert isinstance(delivery, Admitted)
    assert _line(coordinator, key) == []  # both forms left the line
    released = coordinator.release(delivery, "success")
    assert list(released) == []  # nobody woken, nothing granted
    after = coordinator.admit(claims_for(key, 30), Holder(owner="c"))
    assert isinstance(after, Admitted), after


def test_a_woken_parked_waiter_is_admitted_by_its_grant_on_its_first_ask(
    coordinator: Coordinator, claims_for: Callable[[str, float], list[Claim]]
) -> None:
    """The 1 s wake: the release grants the key to the parked ``exec-b`` and wakes it; its
    delivery asks as ``wait:exec-b`` (a worker delivery always asks that way first) and is
    admitted by that grant then — not refused by its own grant to wait in-process."""
    key = "acct:wake"
    first = coordinator.admit(claims_for(key, 30), Holder(owner="a"))
    assert isinstance(first, Admitted)
    parked = coordinator.admit(claims_for(key, 30), Holder(owner="b"), waiter_id="exec-b")
    assert isinstance(parked, Refused)
    released = coordinator.release(first, "success")
    assert list(released) == ["exec-b"]

    # someone else asking meanwhile is refused: the key is granted to exec-b
    other = coordinator.admit(claims_for(key, 30), Holder(owner="c"))
    assert isinstance(other, Refused) and (other.blocker or {}).get("granted_to") == "exec-b"
    woken = coordinator.admit(
        claims_for(key, 30), Holder(owner="b"), waiter_id=f"{WAITING_PREFIX}exec-b"
    )
    assert isinstance(woken, Admitted), woken
    assert _line(coordinator, key) == []
    coordinator.release(woken, "success")


def test_a_waiting_form_granted_the_key_is_admitted_when_it_asks_as_parked(
    coordinator: Coordinator, claims_for: Callable[[str, float], list[Claim]]
) -> None:
    """The other way round: the grant names ``wait:exec-b`` (it was waiting in-process) and
    the delivery, its budget just spent, asks as the parked ``exec-b``: its grant too."""
    key = "acct:late"
    first = coordinator.admit(claims_for(key, 30), Holder(owner="a"))
    assert isinstance(first, Admitted)
    waiting = f"{WAITING_PREFIX}exec-b"
    assert isinstance(
        coordinator.admit(claims_for(key, 30), Holder(owner="b"), waiter_id=waiting), Refused
    )
    assert list(coordinator.release(first, "success")) == [waiting]
    taken = coordinator.admit(claims_for(key, 30), Holder(owner="b"), waiter_id="exec-b")
    assert isinstance(taken, Admitted), taken
    coordinator.release(taken, "success")


def test_a_waiter_asking_in_its_other_form_keeps_one_entry_and_its_place(
    coordinator: Coordinator, claims_for: Callable[[str, float], list[Claim]]
) -> None:
    key = "acct:one"
    first = coordinator.admit(claims_for(key, 30), Holder(owner="a"))
    assert isinstance(first, Admitted)
    waiting = f"{WAITING_PREFIX}exec-b"
    coordinator.admit(claims_for(key, 30), Holder(owner="b"), waiter_id=waiting)
    time.sleep(0.005)  # a later millisecond: waiters of one millisecond are ordered by id
    coordinator.admit(claims_for(key, 30), Holder(owner="c"), waiter_id="exec-c")
    assert _line(coordinator, key) == [waiting, "exec-c"]
    # exec-b's delivery parks: the same waiter, now in its parked form, still first
    coordinator.admit(claims_for(key, 30), Holder(owner="b"), waiter_id="exec-b")
    assert _line(coordinator, key) == ["exec-b", "exec-c"]
    # and waits in-process again (a redelivery): still one entry, still first
    coordinator.admit(claims_for(key, 30), Holder(owner="b"), waiter_id=waiting)
    assert _line(coordinator, key) == [waiting, "exec-c"]
    assert list(coordinator.release(first, "success")) == [waiting]


# -- a finished execution in the line --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_release_passes_the_key_over_a_waiter_whose_execution_has_finished(
    coordinator: Coordinator,
) -> None:
    """A parked entry outlived its execution (it finished by another way: cancelled, failed,
    run by a redelivery). The release that frees the key would grant it to that entry for
    ``HANDOFF_GRANT_MS`` (3 s) with nobody to come; the releasing gate passes it over instead,
    and the grant is the next waiter's at once."""
    finished = Execution.objects.start(
        reactor="tests.Finished", inputs={}, status=ExecutionStatus.SUCCEEDED
    )
    next_waiter = f"{WAITING_PREFIX}next"
    key = "acct:finished"
    registered: list[AdmissionResult] = []

    @with_lock(lambda args: key, ttl=30)
    class Holding(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            # while this step holds the key, two waiters line up behind it
            for waiter in (str(finished.id), next_waiter):
                registered.append(
                    coordinator.admit([LockClaim(key)], Holder(owner=waiter), waiter_id=waiter)
                )
            return Success("done")

    assert Holding.call().ok
    assert all(isinstance(answer, Refused) for answer in registered)
    # the finished execution's entry is gone; the key is granted to the next waiter
    assert _line(coordinator, key) == []
    # and the release's event names the waiter the key went to, not the finished one
    flush()
    released = CoordinationEvent.objects.get(key=key, kind=CoordinationEventKind.RELEASED)
    assert released.detail["handed_to"] == [next_waiter]
    other = coordinator.admit([LockClaim(key)], Holder(owner="someone"))
    assert isinstance(other, Refused)
    assert (other.blocker or {}).get("granted_to") == next_waiter
    taken = coordinator.admit([LockClaim(key)], Holder(owner="next"), waiter_id=next_waiter)
    assert isinstance(taken, Admitted)
    coordinator.release(taken, "success")


@pytest.mark.django_db(transaction=True)
def test_a_release_wakes_the_parked_waiter_before_its_own_bookkeeping(
    coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The releasing gate re-enqueues the parked waiter it handed the key to before anything
    else it does after the release script (the look-up of finished waiters — a database query
    —, the held-key registry, the events): the woken delivery's way through the broker starts
    while that is done. The ``released`` event keeps the time of the release itself, before
    the wake (the history orders it before the woken waiter's admission)."""
    parked = Execution.objects.start(reactor="tests.Parked", inputs={}, status="parked")
    key = "acct:wake-first"
    order: list[tuple[str, Any]] = []

    def sent(execution_id: Any, **options: Any) -> None:  # the broker message, not sent
        order.append(("wake", str(execution_id), time.time()))

    def recorded(sender: Any, **event: Any) -> None:
        if event.get("key") == key and event.get("kind") == CoordinationEventKind.RELEASED:
            order.append(("event", event["kind"], time.time()))

    def looked_up(ids: Any) -> dict[str, str]:
        order.append(("lookup", sorted(ids), time.time()))
        return statuses_of(ids)

    statuses_of = Execution.objects.statuses_of
    monkeypatch.setattr(enqueueing, "enqueue", sent)
    monkeypatch.setattr(Execution.objects, "statuses_of", looked_up)
    coordination_event.connect(recorded, weak=False)

    @with_lock(lambda args: key, ttl=30)
    class Holding(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            waiter = str(parked.id)
            refused = coordinator.admit([LockClaim(key)], Holder(owner=waiter), waiter_id=waiter)
            assert isinstance(refused, Refused)
            return Success("done")

    try:
        assert Holding.call().ok
    finally:
        coordination_event.disconnect(recorded)
    assert [entry[:2] for entry in order] == [
        ("wake", str(parked.id)),
        ("lookup", [str(parked.id)]),
        ("event", CoordinationEventKind.RELEASED),
    ]
    flush()
    released = CoordinationEvent.objects.get(key=key, kind=CoordinationEventKind.RELEASED)
    assert released.at.timestamp() <= order[0][2]
    assert released.detail["handed_to"] == [str(parked.id)]
    coordinator.unregister_waiter(LockClaim(key), str(parked.id))


@pytest.mark.django_db(transaction=True)
def test_a_release_passes_a_semaphore_slot_over_a_waiter_whose_execution_has_finished(
    coordinator: Coordinator,
) -> None:
    """The same for a semaphore, whose freed slot is handed to the head of its line too."""
    finished = Execution.objects.start(
        reactor="tests.Finished", inputs={}, status=ExecutionStatus.SUCCEEDED
    )
    next_waiter = f"{WAITING_PREFIX}next-slot"
    key = "pool:finished"
    pool = SemaphoreClaim(key, limit=1)
    registered: list[AdmissionResult] = []

    @with_semaphore(lambda args: key, limit=1)
    class Holding(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            for waiter in (str(finished.id), next_waiter):
                registered.append(coordinator.admit([pool], Holder(owner=waiter), waiter_id=waiter))
            return Success("done")

    assert Holding.call().ok
    assert all(isinstance(answer, Refused) for answer in registered)
    assert coordinator.waiters(pool) == []
    other = coordinator.admit([pool], Holder(owner="someone"))
    assert isinstance(other, Refused)
    assert (other.blocker or {}).get("granted_to") == next_waiter
    taken = coordinator.admit([pool], Holder(owner="next"), waiter_id=next_waiter)
    assert isinstance(taken, Admitted)
    coordinator.release(taken, "success")


# -- the worker's wake, at the gate ----------------------------------------------------------


class _Recording(Coordinator):
    """The real Coordinator, recording which of its waits a gate used."""

    def __init__(self, prefix: str) -> None:
        super().__init__(prefix=prefix)
        self.asked: list[str | None] = []
        self.waited: list[str | None] = []

    def admit(self, claims: Any, holder: Holder, *, waiter_id: str | None = None) -> Any:
        self.asked.append(waiter_id)
        return super().admit(claims, holder, waiter_id=waiter_id)

    def admit_waiting(self, claims: Any, holder: Holder, wait: float, **options: Any) -> Any:
        self.waited.append(options.get("waiter_id"))
        return super().admit_waiting(claims, holder, wait, **options)


@pytest.mark.django_db(transaction=True)
def test_a_woken_parked_delivery_is_admitted_by_its_grant_without_waiting(
    redis_prefix: str,
) -> None:
    """A worker delivery of a parked execution that a release woke (granted the key as
    ``<id>``) asks as ``wait:<id>`` first, like every worker delivery, and is admitted by that
    first ask: no in-process wait (``REACTOR_WORKER_WAIT``, here 30 s so that a wait could not
    go unnoticed), no second ask."""
    key = "acct:gate-wake"
    execution_id = str(
        Execution.objects.start(reactor="tests.Woken", inputs={}, status=ExecutionStatus.RUNNING).id
    )
    coordinator = _Recording(redis_prefix)
    first = coordinator.admit([LockClaim(key)], Holder(owner="a"))
    assert isinstance(first, Admitted)
    parked = coordinator.admit([LockClaim(key)], Holder(owner="b"), waiter_id=execution_id)
    assert isinstance(parked, Refused)
    assert list(coordinator.release(first, "success")) == [execution_id]

    gate = Gate(
        [LockDeclaration(key_fn=lambda args: key, ttl=30)],
        {},
        GateScope(
            reactor="tests.Woken",
            step="charge",
            owner=f"{execution_id}:charge",
            execution_id=execution_id,
            held_keys=None,
            waiter_id=execution_id,
            worker_wait=30.0,
        ),
        coordinator=coordinator,
    )
    coordinator.asked.clear()
    assert gate.enter(wait=None, park=True) is None  # admitted: no park, no skip
    assert coordinator.asked == [f"{WAITING_PREFIX}{execution_id}"]
    assert coordinator.waited == []
    assert gate.admitted is not None
    gate.exit("success")  # its release, and the end of the renewal its admission started


def test_a_waiter_waiting_in_process_wakes_on_a_grant_to_its_parked_form(
    redis_prefix: str,
) -> None:
    """A delivery waiting in-process as ``wait:exec-b`` while the line holds ``exec-b`` (a
    duplicate delivery of the execution asked in its parked form meanwhile) is woken by the
    release's grant to ``exec-b``, and admitted by it."""
    coordinator = _Recording(redis_prefix)
    key = "acct:wake-form"
    first = coordinator.admit([LockClaim(key, ttl=30)], Holder(owner="a"))
    assert isinstance(first, Admitted)
    waiting = f"{WAITING_PREFIX}exec-b"
    refused = coordinator.admit([LockClaim(key)], Holder(owner="b"), waiter_id=waiting)
    assert isinstance(refused, Refused)
    answers: list[AdmissionResult] = []
    waiter = threading.Thread(
        target=lambda: answers.append(
            coordinator.admit_waiting(
                [LockClaim(key)], Holder(owner="b"), 20.0, waiter_id=waiting, refused=refused
            )
        )
    )
    waiter.start()
    # it subscribes and asks once more (in the form it waits in); only then does the
    # duplicate delivery park as exec-b, the form that asked last
    deadline = time.monotonic() + 10
    while coordinator.asked.count(waiting) < 2:
        assert time.monotonic() < deadline, coordinator.asked
        time.sleep(0.01)
    assert isinstance(
        coordinator.admit([LockClaim(key)], Holder(owner="b"), waiter_id="exec-b"), Refused
    )
    assert _line(coordinator, key) == ["exec-b"]
    started = time.monotonic()
    assert list(coordinator.release(first, "success")) == ["exec-b"]
    waiter.join(15)
    assert not waiter.is_alive() and isinstance(answers[0], Admitted), answers
    # woken by the grant's message: a waiter the message does not name sleeps on until the
    # grant would lapse (HANDOFF_GRANT_MS, 3 s) and only then asks again
    assert time.monotonic() - started < 2.5
    coordinator.release(answers[0], "success")
