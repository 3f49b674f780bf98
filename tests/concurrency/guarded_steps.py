"""One step class per coordination primitive, for tests that run each of them against a server
of their own (``test_redis_acl``, ``test_redis_memory``).

Each body sleeps 50 ms and records its span — class name, enter and exit times
(``time.monotonic_ns``) — in ``SPANS``, so a test tells whether a body ran and whether two
bodies of one key overlapped.
"""

from __future__ import annotations

import time
from typing import Any

from reactor_app import (
    Step,
    Success,
    with_lock,
    with_ordered_lock,
    with_period,
    with_rate_limit,
    with_semaphore,
)

#: (class name, entered, left) of every body that ran
SPANS: list[tuple[str, int, int]] = []

#: the primitives that admit one body of a key at a time (a rate limit admits several; a
#: period admits one and skips the others)
EXCLUSIVE = frozenset({"lock", "semaphore", "ordered_lock"})


class Recorded(Step):
    inputs = ("n",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        start = time.monotonic_ns()
        time.sleep(0.05)
        SPANS.append((type(self).__name__, start, time.monotonic_ns()))
        return Success(args["n"])


def every_primitive(prefix: str, wait: float) -> dict[str, type[Step]]:
    """A step per primitive, keyed ``<prefix>:<n>``; those that queue wait up to ``wait``."""

    def key(args: dict[str, Any]) -> str:
        return f"{prefix}:{args['n']}"

    def named(name: str) -> Any:
        return type(name, (Recorded,), {})

    return {
        "lock": with_lock(key, ttl=5, wait=wait)(named("Locked")),
        "semaphore": with_semaphore(key, limit=1, ttl=5, wait=wait)(named("Pooled")),
        "rate_limit": with_rate_limit(key, limit=5, period=60)(named("Limited")),
        "period": with_period(key, every="hour")(named("Hourly")),
        "ordered_lock": with_ordered_lock(key, wait=max(wait, 1))(named("InLine")),
    }
