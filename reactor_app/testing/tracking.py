"""Reading tracking rows that are written behind the work.

Step runs and coordination events reach the database within ``REACTOR_TRACKING_FLUSH_INTERVAL``
of happening (``reactor_app.write_behind``). A test that reads them right after the work — a
``Step.call``, or a run still going on another thread — asks for them *eventually*, within that
bound, rather than at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from reactor_app.conf import reactor_settings

T = TypeVar("T")

#: seconds added to twice the freshness bound: a busy machine delays the writer thread a little
SLACK = 1.0


def within_freshness_bound(read: Callable[[], T], *, timeout: float | None = None) -> T:
    """Call ``read`` until it returns something truthy, for up to the freshness bound (twice
    ``REACTOR_TRACKING_FLUSH_INTERVAL`` plus ``SLACK``); return its last answer either way, so
    the test's own assertion reports what was found."""
    if timeout is None:
        timeout = 2 * reactor_settings.TRACKING_FLUSH_INTERVAL + SLACK
    deadline = time.monotonic() + timeout
    while True:
        answer = read()
        if answer or time.monotonic() >= deadline:
            return answer
        time.sleep(0.02)
