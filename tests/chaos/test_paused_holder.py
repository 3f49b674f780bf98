"""Chaos: a lock holder paused (SIGSTOP) for longer than its lease knows it on waking.

A real child process holds a lock through ``Step.call`` and checks its lease in a loop; the
test stops it with SIGSTOP, lets the lease lapse in Redis, takes the lock as a new holder (a
newer fencing token) and writes the fenced row, then resumes the child. The child's very next
``context.checkpoint()`` must raise ``LeaseLost`` — decided by its own monotonic clock, before
its renewal could even try — the step must end ``LeaseLost``, and its fenced write with the old
token must be refused.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from demo_project.shop.models import Account
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.fencing import fenced_update
from reactor_app.testing import coordination_state

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]

CHILD = Path(__file__).with_name("pause_holder.py")
TTL = 1.0
#: how long the holder stays stopped: several leases
PAUSE = 3.5


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_holder_paused_past_its_lease_fails_with_lease_lost_and_its_fenced_write_is_refused(
    subprocess_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    key = "chaos:paused"
    Account.objects.create(number=900, balance=0)
    child = subprocess.Popen(
        [sys.executable, str(CHILD), key, str(TTL), "900", str(tmp_path)],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    coordinator = Coordinator()
    newcomer: Any = None
    try:
        entered = wait_for(
            lambda: (
                (tmp_path / "entered.json").exists()
                and json.loads((tmp_path / "entered.json").read_text())
            ),
            60,
            "the child to enter its step",
        )
        assert entered["pid"] == child.pid
        time.sleep(0.3)  # the child is inside its checkpoint loop, its lease being renewed
        assert coordination_state().lock(key).held

        os.kill(child.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        # the stopped holder renews nothing: its lease lapses in Redis...
        wait_for(lambda: not coordination_state().lock(key).held, TTL * 3, "the lease to lapse")
        # ...and a new holder takes the key, with a newer token, and writes the fenced row
        newcomer = coordinator.admit([LockClaim(key, ttl=30)], Holder(owner="newcomer"))
        assert isinstance(newcomer, Admitted)
        new_token = newcomer.token_for(key)
        assert new_token is not None and new_token > entered["token"]
        assert fenced_update(Account.objects.filter(number=900), new_token, balance=100) == 1
        time.sleep(max(0.0, PAUSE - (time.monotonic() - stopped_at)))
        os.kill(child.pid, signal.SIGCONT)

        output, _ = child.communicate(timeout=60)
        assert child.returncode == 0, output.decode(errors="replace")
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.wait(10)
        if isinstance(newcomer, Admitted):
            coordinator.release(newcomer, "success")

    report = json.loads((tmp_path / "result.json").read_text())
    # the first check after waking already knew: the gap it saw spans the whole pause
    assert "lease_lost" in report, report
    assert report["gap_before_detection"] >= PAUSE - 0.5, report
    # the step ends with LeaseLost (the end-of-step check), not a success
    assert (report["outcome"], report["outcome_error"]) == ("Failure", "LeaseLost"), report
    # and its write with the old token was refused: the newcomer's write stands
    assert report["fenced_rows"] == 0, report
    account = Account.objects.get(number=900)
    assert (account.balance, account.fencing_token) == (100, new_token)
