"""``Reactor.run(..., priority=)``: runs in the caller's process wait in a contended key's line
with their priority, as ``run_async``'s do on workers — a higher one admitted first, first
come, first served within one. Real threads on real Redis; the admission order is recorded
in Redis by the bodies."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connections

from reactor_app import Reactor, Step, Success, from_input, step, with_lock
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.coordination.keys import current_prefix
from reactor_app.coordination.redis import get_client
from reactor_app.exceptions import InputValidationError

pytestmark = pytest.mark.django_db(transaction=True)


def _order_key() -> str:
    return f"{current_prefix()}:test:order"


@with_lock(lambda args: "prio", wait=30)
class Recorded(Step):
    inputs = ("name",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        get_client().rpush(_order_key(), args["name"])
        return Success(args["name"])


class Prioritized(Reactor):
    inputs = ("name",)

    record = step(Recorded, name=from_input("name"))


def test_a_higher_priority_run_in_process_is_admitted_first() -> None:
    coordinator = Coordinator()
    claim = LockClaim("prio")
    held = coordinator.admit([claim], Holder(owner="holder"))
    assert isinstance(held, Admitted)
    arrivals = [("low0", 0), ("low1", 0), ("high", 5), ("low2", 0)]
    results: dict[str, Any] = {}

    def run(name: str, priority: int) -> None:
        try:
            results[name] = Prioritized.run(name=name, priority=priority)
        finally:
            connections.close_all()

    threads = []
    for n, (name, priority) in enumerate(arrivals):  # each in the line before the next comes
        thread = threading.Thread(target=run, args=(name, priority))
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 30
        while len(coordinator.waiters(claim)) < n + 1:
            assert time.monotonic() < deadline, f"{name} never queued"
            time.sleep(0.01)
    coordinator.release(held, "success")
    for thread in threads:
        thread.join(60)
    assert all(results[name].ok for name, _ in arrivals), results
    order = list(get_client().lrange(_order_key(), 0, -1))
    assert order == ["high", "low0", "low1", "low2"]


def test_an_out_of_range_priority_is_refused_at_the_call() -> None:
    with pytest.raises(InputValidationError, match="run of Prioritized: priority"):
        Prioritized.run(name="x", priority=101)
