"""The child process of ``test_background_threads.py``: a soft limit at every line of a
background thread's first start, each followed by a use that needs the thread.

Run as ``python -m tests.integration.cut_background <thread>`` in a fresh process (no thread of
the kind runs yet, as in a worker's first delivery), with the test's database and key space.
For each line ``n`` the first use of a *fresh* owner (renewer, writer) is cut off at its
``n``-th traced line — that owner's module and ``reactor_app/background.py`` — and a second,
uncut use must then get its work done by the owner's thread. Prints one JSON object: every
line a cut landed on, and the ones after which the thread never did the work.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import django

django.setup()

from celery.exceptions import SoftTimeLimitExceeded  # noqa: E402
from django.conf import settings  # noqa: E402

import reactor_app.background  # noqa: E402
from reactor_app import Step, Success, with_lock, write_behind  # noqa: E402
from reactor_app.coordination import renewal  # noqa: E402
from reactor_app.engine import claim  # noqa: E402
from reactor_app.models import CoordinationEvent  # noqa: E402
from tests.integration.test_soft_limit_anywhere import SoftLimitAt  # noqa: E402

#: seconds the thread has to do the second use's work (a renewal is due every 20 ms)
PATIENCE = 10.0


def _within(predicate: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


#: a lease whose renewals come every 20 ms: the checks wait for one. Short on purpose; nothing
#: here needs the lease kept (a renewal that comes too late still counts as the thread's work)
LEASE = 0.06
#: renewal rounds seen by ``KeptLock`` bodies, read whatever their outcome
ROUNDS: list[int] = []


@with_lock(lambda args: args["key"], ttl=LEASE)
class QuickLock(Step):
    """A step holding a renewed lock on ``args['key']`` for no time: two tracking events."""

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(None)


@with_lock(lambda args: args["key"], ttl=LEASE)
class KeptLock(Step):
    """A step holding a renewed lock on ``args['key']`` until its process's scheduler has
    run a renewal round (or ``PATIENCE`` ran out); notes the rounds in ``ROUNDS``."""

    def run(self, args: dict[str, Any], context: Any) -> Any:
        start = renewal.scheduler().rounds
        _within(lambda: renewal.scheduler().rounds > start)
        ROUNDS.append(renewal.scheduler().rounds - start)
        return Success(None)


class CountedClaim(claim.ExecutionClaim):
    """An execution claim that counts the renewer thread's renewals of it."""

    renewals = 0

    def renew(self) -> bool:
        self.renewals += 1
        return super().renew()


def _call(step: type[Step], key: str) -> None:
    # the cut may leave the call as its exception, or as a failed outcome
    with contextlib.suppress(SoftTimeLimitExceeded):
        step.call(key=key)


def hold_renewer(n: int, cut: SoftLimitAt) -> bool:
    """A lock's renewal: after the cut, another call's hold is renewed."""
    renewal._scheduler = None  # the next hold makes a fresh scheduler, with no thread yet
    with cut:
        _call(QuickLock, f"cut:renewal:{n}")
    if cut.fired_in is None:
        return True
    ROUNDS.clear()
    KeptLock.call(key=f"cut:renewal:{n}:after")
    return bool(ROUNDS) and ROUNDS[-1] >= 1


def claim_renewer(n: int, cut: SoftLimitAt) -> bool:
    """An execution claim's renewal: after the cut, another claim is renewed."""
    claim._the_renewer = None  # the next claim makes a fresh renewer, with no thread yet
    first = CountedClaim(uuid.uuid4(), f"cut-{n}", ttl=LEASE)
    assert first.acquire()
    try:
        with cut, contextlib.suppress(SoftTimeLimitExceeded):
            first.start_renewal()
    finally:
        first.release()
    if cut.fired_in is None:
        return True
    second = CountedClaim(uuid.uuid4(), f"cut-{n}-after", ttl=LEASE)
    assert second.acquire()
    try:
        second.start_renewal()
        return _within(lambda: second.renewals >= 1)
    finally:
        second.release()


def tracking_writer(n: int, cut: SoftLimitAt) -> bool:
    """The tracking writer: after the cut, another call's events reach the database, written
    by the writer thread (nobody here flushes)."""
    write_behind._writer = write_behind.TrackingWriter()  # fresh: no thread yet
    with cut:
        _call(QuickLock, f"cut:writer:{n}")
    if cut.fired_in is None:
        return True
    key = f"cut:writer:{n}:after"
    QuickLock.call(key=key)
    return _within(lambda: CoordinationEvent.objects.filter(key=key).count() == 2)


THREADS: dict[str, tuple[Callable[[int, SoftLimitAt], bool], Any]] = {
    "hold renewer": (hold_renewer, renewal),
    "claim renewer": (claim_renewer, claim),
    "tracking writer": (tracking_writer, write_behind),
}


def main(name: str) -> None:
    use, module = THREADS[name]
    settings.REACTOR_TRACKING_FLUSH_INTERVAL = 0.05  # the writer's checks wait for no more
    # Every other thread runs already, so only the one under test starts during a cut.
    QuickLock.call(key="cut:warm")
    traced = (str(module.__file__), str(Path(reactor_app.background.__file__)))
    landed: list[str] = []
    dead_after: list[str] = []
    for n in range(1, 500):
        cut = SoftLimitAt(n, traced=traced)
        worked = use(n, cut)
        if cut.fired_in is None:
            break
        landed.append(cut.fired_in)
        if not worked:
            dead_after.append(cut.fired_in)
    print(json.dumps({"landed": landed, "dead_after": dead_after}))


if __name__ == "__main__":
    main(sys.argv[1])
