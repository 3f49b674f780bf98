"""A delivery's claim statement caught in a deadlock is sent again (``managers``).

The counterexample this keeps (``test_debounce.py``, six concurrent starts, PostgreSQL): the
settles of a burst lock its rows (``supersede``) while the latest start's delivery claimed its
row; PostgreSQL found a cycle through the claim — queued on that row behind one settle while
another settle waited for it — and aborted the claim. The delivery failed, its message was
gone, and the start stayed pending until the sweep (the test's 60 s wait ran out first).

Here the same cycle is built on purpose with three real connections, each step taken only once
the one before it is seen waiting (``pg_stat_activity``): ``holder`` locks the row, the claim
waits for it, ``other`` locks a second row and then waits for the first behind the claim, and
``holder`` asks for the second row. The claim's connection checks for deadlocks first (its
``deadlock_timeout`` is the shortest), so it is the victim; ``other`` is the next one, which
lets ``holder`` commit. The claim must then return the row, claimed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import OperationalError, close_old_connections, connection, transaction

from reactor_app.engine.delivery import RUNNABLE
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def backend() -> tuple[int, Callable[[str], None]]:
    """This thread's connection: its backend pid and a way to set its deadlock timeout."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()

    def deadlock_timeout(value: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"SET deadlock_timeout = '{value}'")

    return pid, deadlock_timeout


def wait_until_waiting(pid: int, within: float = 30.0) -> None:
    """Until backend ``pid`` waits for a lock."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        with connection.cursor() as cursor:
            cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
            row = cursor.fetchone()
        if row and row[0] == "Lock":
            return
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited for a lock")


def test_a_claim_aborted_as_a_deadlock_victim_is_sent_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("SQLite locks the whole database: no row-lock cycle to be caught in")
    claimed = Execution.objects.create(reactor="tests.claim", status="pending", inputs={})
    second = Execution.objects.create(reactor="tests.claim", status="pending", inputs={})
    pids: dict[str, int] = {}
    ready = {name: threading.Event() for name in ("holder", "claim", "other")}
    outcome: dict[str, Any] = {}

    def holder() -> None:
        try:
            pids["holder"], timeout = backend()
            timeout("60s")  # never the victim
            with transaction.atomic():
                list(Execution.objects.select_for_update().filter(pk=claimed.pk))
                ready["holder"].set()
                ready["other"].wait(30)
                wait_until_waiting(pids["other"])
                list(Execution.objects.select_for_update().filter(pk=second.pk))
            outcome["holder"] = "committed"
        finally:
            close_old_connections()
            connection.close()

    def claim() -> None:
        try:
            pids["claim"], timeout = backend()
            timeout("2s")  # checks first: the victim
            ready["holder"].wait(30)
            ready["claim"].set()
            outcome["claim"] = Execution.objects.claim(claimed.pk, RUNNABLE)
        except OperationalError as exc:
            outcome["claim"] = exc
        finally:
            connection.close()

    def other() -> None:
        try:
            pids["other"], timeout = backend()
            timeout("4s")  # checks next: its abort lets the holder commit
            ready["claim"].wait(30)
            wait_until_waiting(pids["claim"])
            with transaction.atomic():
                list(Execution.objects.select_for_update().filter(pk=second.pk))
                ready["other"].set()
                list(Execution.objects.select_for_update().filter(pk=claimed.pk))
            outcome["other"] = "committed"
        except OperationalError as exc:
            outcome["other"] = exc
        finally:
            connection.close()

    caplog.set_level("WARNING", logger="reactor_app.managers")
    threads = [threading.Thread(target=f) for f in (holder, claim, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)

    assert isinstance(outcome["claim"], Execution), outcome
    row = outcome["claim"]
    assert (row.pk, row.status, row.claim_generation) == (
        claimed.pk,
        ExecutionStatus.PENDING,
        claimed.claim_generation + 1,
    )
    # the cycle was there and the claim was its first victim; the holder committed
    assert any("a deadlock's victim" in r.getMessage() for r in caplog.records), caplog.text
    assert isinstance(outcome["other"], OperationalError) and outcome["holder"] == "committed"
