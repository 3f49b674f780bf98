"""A step that waited for its lock unsubscribes from the key's wake channel only after it has
released the lock (``coordination.subscriptions``, ``settle``): the UNSUBSCRIBE is not part of
the hand-off. Real Redis, a real holder on another thread."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from reactor_app import Step, Success, with_lock
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.coordination.waiting import wake_channel

pytestmark = pytest.mark.django_db(transaction=True)

#: the wake channel's subscriber count as the step's body saw it
SEEN: dict[str, int] = {}


def subscribers(coordinator: Coordinator, channel: str) -> int:
    return int(coordinator.client.pubsub_numsub(channel)[0][1])


@with_lock(lambda args: f"unsub:{args['n']}", ttl=30, wait=10)
class Waits(Step):
    inputs = ("n",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        claim = LockClaim(f"unsub:{args['n']}", ttl=30)
        coordinator = Coordinator()
        SEEN["during"] = subscribers(coordinator, str(wake_channel(coordinator, claim)))
        return Success(None)


def held_until_released_later(coordinator: Coordinator, claim: LockClaim) -> threading.Timer:
    held = coordinator.admit([claim], Holder(owner="other"))
    assert isinstance(held, Admitted)
    timer = threading.Timer(0.3, coordinator.release, (held, "success"))
    timer.start()
    return timer


def test_a_waited_step_unsubscribes_after_its_release_and_waits_again_on_the_same_key() -> None:
    coordinator = Coordinator()
    claim = LockClaim("unsub:1", ttl=30)
    channel = str(wake_channel(coordinator, claim))
    for round_ in range(2):
        timer = held_until_released_later(coordinator, claim)
        SEEN.clear()
        outcome = Waits.call(n=1)
        timer.join(10)
        assert outcome.ok, (round_, outcome)
        # the body ran while this thread's subscription was still on the channel: its
        # UNSUBSCRIBE had not been sent
        assert SEEN["during"] == 1, round_
        # sent once the step released (its confirmation left unread): the server has it soon
        deadline = time.monotonic() + 10
        while subscribers(coordinator, channel) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert subscribers(coordinator, channel) == 0, round_
        # (the second round waits on the same key with the subscription the first kept, the
        # wake message of the first step's own release still unread on it)
