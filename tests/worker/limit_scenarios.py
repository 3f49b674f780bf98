"""The live-limit scenario the worker tests run on one Redis server and on a cluster
(tests/worker/test_worker_live_limits.py, test_worker_live_limits_cluster.py): an operator
raises the named semaphore limit ``live_pool`` (settings: 1) to 3 in the admin while twelve
runs queue on it, then removes the override.

The latency is from just before the admin POST (so it covers the commit) to the first body
that starts while another runs; bodies record their intervals in Redis (``timed``).
"""

from __future__ import annotations

import time
from typing import Any

from reactor_app.models import LimitOverride
from tests.api import users
from tests.worker.helpers import wait_until
from tests.worker.limit_reactors import PooledReactor
from tests.worker.reactors import records

#: the workers' settings the scenario needs (a module adds its topology)
WORKER_SETTINGS = {
    "REACTOR_LIMITS": {"live_pool": {"limit": 1}},
    # a refused delivery parks at once, with a long backoff: a parked run that starts sooner
    # was woken (by a release, or by the override)
    "REACTOR_WORKER_WAIT": 0,
    "REACTOR_CONTENTION_BACKOFF": [20.0, 40.0],
    "REACTOR_CONTENTION_CEILING": 20,
}
LIMITS = "/admin/reactor_app/coordination/limits/"
#: the promise (docs/coordination.md, "Live limits")
WITHIN_NS = 1_000_000_000


def _overlapping_start(bodies: list[dict[str, Any]], after: int) -> int | None:
    """The first start at or after ``after`` that falls inside another body's interval."""
    for body in sorted(bodies, key=lambda b: b["start"]):
        if body["start"] < after:
            continue
        if any(o is not body and o["start"] <= body["start"] < o["end"] for o in bodies):
            return int(body["start"])
    return None


def raise_then_remove(django_user_model: Any) -> tuple[float, float]:
    """Run the scenario; the latency of the raise and the time its POST took, in ms."""
    client = users.logged_in(users._staff(django_user_model, "limiter", "override_limit"))
    runs = [PooledReactor.run_async(hold=0.5) for _ in range(12)]
    wait_until(lambda: records("enter:pooled"), 30, message="no run entered the pool")

    raised_at = time.time_ns()
    response = client.post(
        LIMITS,
        {"primitive": "semaphore", "name": "live_pool", "value": "3", "reason": "more capacity"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    posted_ms = (time.time_ns() - raised_at) / 1e6
    # a first admission under the new limit: three bodies entered, two of them after the raise
    wait_until(
        lambda: len([e for e in records("enter:pooled") if e["start"] >= raised_at]) >= 2,
        30,
        message="the raised limit was never used",
    )
    removed_at = time.time_ns()
    response = client.post(
        LIMITS, {"primitive": "semaphore", "name": "live_pool", "action": "remove"}
    )
    assert response.status_code == 302
    assert not LimitOverride.objects.exists()

    for execution in runs:
        assert execution.wait(timeout=120).ok
    bodies = records("pooled")
    assert len(bodies) == len(runs)
    before = [b for b in bodies if b["start"] < raised_at]
    assert before and _overlapping_start(before, 0) is None  # settings: one at a time

    first = _overlapping_start(bodies, raised_at)
    assert first is not None, "no two bodies ever ran together after the raise"
    latency_ms = (first - raised_at) / 1e6
    assert first - raised_at < WITHIN_NS, f"{latency_ms:.0f} ms (the POST took {posted_ms:.0f} ms)"

    # back to settings: a body that starts once every process has read the removal shares
    # the pool with nobody
    settled = removed_at + WITHIN_NS
    late = [b for b in bodies if b["start"] >= settled]
    assert len(late) >= 2, "the removal was not exercised (too few runs left after it)"
    for body in late:
        assert not any(
            o is not body and o["start"] < body["end"] and body["start"] < o["end"] for o in bodies
        ), body
    return latency_ms, posted_ms
