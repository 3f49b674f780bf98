"""Child process of ``test_paused_holder.py``: a ``Step.call`` holding a lock, checking its lease.

Run as ``python tests/chaos/pause_holder.py <key> <ttl seconds> <account number> <out dir>``.
The step body writes ``entered.json`` (its fencing token, pid), then calls
``context.checkpoint()`` in a tight loop until it raises ``LeaseLost`` (or a deadline passes);
the test SIGSTOPs this process in the middle of that loop. Then the body tries a fenced write
with its old token and records everything in ``result.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

#: seconds the body checks its lease before giving up (the test pauses it for much less)
DEADLINE = 30.0


def main(key: str, ttl: float, account: int, out: Path) -> None:
    import django

    django.setup()
    from django.test import override_settings

    # No tracking rows: a writer thread stopped mid-flush would hold the SQLite write lock for
    # the whole pause and block the test's own fenced write (a real hazard of pausing a
    # process, but not the one under test here).
    override_settings(REACTOR_TRACKING="executions").enable()

    from demo_project.shop.models import Account
    from reactor_app import Step, Success, with_lock
    from reactor_app.exceptions import LeaseLost
    from reactor_app.fencing import fenced_update

    report: dict[str, Any] = {}

    @with_lock(lambda args: args["key"], ttl=ttl)
    class PausedHolder(Step):
        inputs = ("key",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            token = context.fencing_token()
            report["token"] = token
            (out / "entered.json").write_text(json.dumps({"token": token, "pid": os.getpid()}))
            started = last_ok = time.monotonic()
            while time.monotonic() - started < DEADLINE:
                check_started = time.monotonic()
                try:
                    context.checkpoint()
                except LeaseLost as lost:
                    report["lease_lost"] = str(lost)
                    # From the start of the last check that passed to this failure: wherever
                    # the pause fell, it spans it — unless a check passed after the pause.
                    report["gap_before_detection"] = time.monotonic() - last_ok
                    break
                last_ok = check_started
            report["fenced_rows"] = fenced_update(
                Account.objects.filter(number=account), token, balance=-1
            )
            return Success(token)

    outcome = PausedHolder.call(key=key)
    report["outcome"] = type(outcome).__name__
    error = getattr(outcome, "error", None)
    report["outcome_error"] = type(error).__name__ if error is not None else None
    (out / "result.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
