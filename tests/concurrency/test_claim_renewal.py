"""The execution claim is renewed by one thread per process, not a thread per delivery.

Real Redis (the suite's), real threads. A claim is a Redis lock on the execution id with a TTL;
while its delivery runs, the process's claim renewer (``engine.claim.ClaimRenewer``) renews it
every third of its TTL. Starting a thread for each delivery, as before, made every delivery
wait for the OS to schedule that thread before it could go on (docs/benchmarks.md, "Wake
latency"). Checked here: claims held past several TTLs stay held and are never marked lost,
many claims share the one thread, a released claim is renewed no more (its key is gone and
stays gone), and a claim whose key was taken away is marked lost at its next renewal.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.test import override_settings

from reactor_app.coordination.redis import get_client
from reactor_app.engine.claim import ExecutionClaim, _renewer
from reactor_app.engine.worker import ClaimLost

TTL = 1.2  # renewed every 0.4 s: a renewal may come 0.8 s late before a key lapses


def renewal_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("reactor-claim")]


def wait_until(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


@pytest.mark.usefixtures("redis_prefix")
def test_claims_outlive_their_ttl_while_held_on_one_thread_and_lapse_once_released() -> None:
    claims = [ExecutionClaim(uuid.uuid4(), f"delivery-{n}", ttl=TTL) for n in range(5)]
    for claim in claims:
        assert claim.acquire()
        claim.start_renewal()
    try:
        assert len(renewal_threads()) == 1
        held_since = time.monotonic()
        # several TTLs: each claim renewed several times (a lapse would drop its key)
        while time.monotonic() - held_since < 3 * TTL:
            assert all(claim.ttl_left() > 0 for claim in claims)
            time.sleep(TTL / 6)
        for claim in claims:
            claim.check()  # not lost
        assert _renewer().active() == 5
    finally:
        for claim in claims:
            claim.release()
    assert _renewer().active() == 0
    assert not any(ExecutionClaim.is_held(claim.name.rsplit(":", 1)[-1]) for claim in claims)
    assert all(not get_client().exists(claim.name) for claim in claims)
    time.sleep(TTL)  # a renewal after the release would take the keys again: none does
    assert all(not get_client().exists(claim.name) for claim in claims)
    assert len(renewal_threads()) == 1  # the thread stays for the next deliveries


@pytest.mark.usefixtures("redis_prefix")
def test_a_claim_whose_key_was_taken_away_is_marked_lost_at_its_next_renewal() -> None:
    kept = ExecutionClaim(uuid.uuid4(), "kept", ttl=TTL)
    taken = ExecutionClaim(uuid.uuid4(), "taken", ttl=TTL)
    for claim in (kept, taken):
        assert claim.acquire()
        claim.start_renewal()
    try:
        # another delivery's claim now (a restarted Redis, a lapse): not this owner's
        get_client().set(taken.name, "someone-else", px=10_000)
        assert wait_until(lambda: taken.lost, 3 * TTL), "the lost claim was never noticed"
        with pytest.raises(ClaimLost):
            taken.check()
        kept.check()
        assert kept.ttl_left() > 0
        assert _renewer().active() == 1  # the lost one is renewed no more
    finally:
        kept.release()
        taken.release()  # not ours: left alone
    assert get_client().get(taken.name) == "someone-else"


@pytest.mark.usefixtures("redis_prefix")
def test_regression_the_renewer_outlives_a_claim_ttl_setting_it_cannot_read() -> None:
    """The renewer's idle sleep was a third of ``REACTOR_EXECUTION_CLAIM_TTL``, read in its
    thread: a read that raised (here a test overriding the setting with a value the settings
    refuse, as tests/unit/test_conf.py does) ended the thread, and no claim of the process was
    renewed again — later deliveries lost their claims after one TTL."""
    first = ExecutionClaim(uuid.uuid4(), "before", ttl=TTL)
    assert first.acquire()
    first.start_renewal()
    try:
        # the thread goes idle (nothing due) while the setting cannot be read
        with override_settings(REACTOR_EXECUTION_CLAIM_TTL=0):
            time.sleep(TTL)
    finally:
        first.release()
    assert len(renewal_threads()) == 1, "the renewal thread died"
    later = ExecutionClaim(uuid.uuid4(), "after", ttl=TTL)
    assert later.acquire()
    later.start_renewal()
    try:
        time.sleep(3 * TTL)
        later.check()
        assert later.ttl_left() > 0, "the later claim was not renewed"
    finally:
        later.release()
