"""What the tests of renewal share: a lease that survives a loaded machine, and a wait for
renewal rounds instead of a sleep that guesses how many will have run.

A test that needs a hold *kept* by its renewals must not also need the machine to answer
within a fraction of a second. A lease is renewed every third of it, so it lapses in Redis only
after a stall of two thirds of a lease — of the renewal thread, of the Redis server, or of the
whole VM (a paused VM's wall clock, which Redis expires keys by, jumps ahead on resume). A
0.6 s lease survives 0.4 s, which a 2-core CI machine running two test processes and their
Celery workers exceeded once (CI, 2026-12-03: an ``extended``-events test lost its lock).
``KEPT_LEASE`` survives a full second. Tests about leases that *lapse* keep their short ones.
"""

from __future__ import annotations

import time

from reactor_app.coordination.renewal import scheduler

#: seconds: the lease of a hold a test needs kept; renewed every third of it
KEPT_LEASE = 1.5


def wait_for_rounds(count: int, *, timeout: float = 15.0) -> int:
    """Wait until this process's renewal thread has run ``count`` more rounds than it had;
    the rounds it did run. Returns at the timeout all the same: the caller's own assertions
    say what was missing (this runs inside step bodies, where a test failure would be caught
    as the body's error)."""
    start = scheduler().rounds
    deadline = time.monotonic() + timeout
    while scheduler().rounds < start + count and time.monotonic() < deadline:
        time.sleep(0.02)
    return scheduler().rounds - start
