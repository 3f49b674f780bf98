"""The durations and counts the coordination scripts keep exact, checked where they are given.

The scripts compute in Lua numbers — doubles, exact for whole numbers below 2**53 — with times
in Redis milliseconds (about 1.8e12 today), and hand results back to Redis as integer
arguments (a lifetime to ``PEXPIRE``, a lease's end, an increment), which Redis writes from
Lua as text with ``%.17g``. Out of that range a declaration used to be accepted and then fail
its work at every admission with an error naming a script line: a lock's ``ttl`` of 1e20
seconds is a lease end Redis refuses ("value is not an integer or out of range"), a semaphore
limit of 10**30 reaches Redis as ``1e+30``, an infinite ``ttl`` is no number of milliseconds
at all (``OverflowError`` before anything is sent), and a ``with_period`` bucket of 10**16
seconds or more was never found done again, so its work ran on every call. So each duration
and count a script will see is checked where it is given — a decorator when the class is
created, a setting when it is read, an operator's change before it is stored — against:

* ``SHORTEST_SECONDS`` to ``LONGEST_SECONDS`` for a duration (a lease, a window, a quiet
  period; a period's bucket, in whole seconds from 1): 1 ms is the unit Redis keeps lifetimes
  in (a shorter lease was rounded up to one that had run out before its holder could use it);
  100 years ends, in milliseconds, near 5e12 today, and the sums the scripts make of such
  ends stay exact;
* 1 to ``LARGEST_COUNT`` (10**15) for a count (a semaphore's or a window's limit, a
  rate-limit cost): a window's total plus one admission's cost stays exact too.

Waits (``wait=``, ``rollback_wait=``) are not checked here: they are measured by the waiting
process's own clock and never reach a script, so an infinite wait is a wait without end.
docs/coordination.md, "The range of durations and counts", says the same for users.
"""

from __future__ import annotations

import math
from typing import Any

#: 1 ms: Redis keeps lifetimes in whole milliseconds
SHORTEST_SECONDS = 0.001
#: 100 years of 365.25 days
LONGEST_SECONDS = 100 * 365.25 * 86400
LONGEST_TEXT = f"{LONGEST_SECONDS:.0f} (100 years)"
LARGEST_COUNT = 10**15
LARGEST_COUNT_TEXT = "10**15"


def seconds_within(value: Any, what: str) -> float:
    """``value`` as float seconds when it is a number from ``SHORTEST_SECONDS`` to
    ``LONGEST_SECONDS``; else ``ValueError`` saying so about ``what``."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and math.isfinite(value) and SHORTEST_SECONDS <= value <= LONGEST_SECONDS:
        return float(value)
    raise ValueError(
        f"{what} must be a number of seconds from {SHORTEST_SECONDS} to {LONGEST_TEXT}, "
        f"got {value!r}"
    )


def count_within(value: Any, what: str) -> int:
    """``value`` when it is a whole number from 1 to ``LARGEST_COUNT``; else ``ValueError``
    saying so about ``what``."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= LARGEST_COUNT:
        return value
    raise ValueError(
        f"{what} must be a positive integer no larger than {LARGEST_COUNT_TEXT}, got {value!r}"
    )
