"""What the selected saga profile (``REACTOR_SAGA_PROFILE``, registered in conftest.py) means
for each of the model's tests: examples per batch, and how long to keep running batches."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from hypothesis import settings

PROFILE = os.environ.get("REACTOR_SAGA_PROFILE", "ci")
#: examples per test kind in the ci profile (in-process ones are cheap, worker ones cost seconds)
CI_EXAMPLES = {"inprocess": 60, "worker": 10, "kill": 2}
#: the share of the soak's time each test kind gets
SOAK_SHARES = {"inprocess": 0.4, "worker": 0.45, "kill": 0.15}
SOAK_BATCH = {"inprocess": 50, "worker": 5, "kill": 2}


def saga_settings(kind: str) -> settings:
    parent = settings.get_profile(f"saga-{PROFILE}")
    count = CI_EXAMPLES[kind] if PROFILE == "ci" else SOAK_BATCH[kind]
    return settings(parent, max_examples=count)


def run_batches(kind: str, batch: Callable[[], None]) -> int:
    """Run ``batch`` (a Hypothesis test) once, or in the soak until its share of
    ``REACTOR_SAGA_SOAK_SECONDS`` (default 1800) is spent; returns the batches run."""
    if PROFILE != "soak":
        batch()
        return 1
    seconds = float(os.environ.get("REACTOR_SAGA_SOAK_SECONDS", "1800")) * SOAK_SHARES[kind]
    deadline = time.monotonic() + seconds
    count = 0
    while time.monotonic() < deadline:
        batch()
        count += 1
    return count
