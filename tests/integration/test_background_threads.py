"""A soft limit anywhere in a background thread's first start leaves the thread startable.

The hold renewer, the execution claim renewer and the tracking writer each run on one daemon
thread per process, started by the first caller that needs it — often inside a worker
delivery, where Celery's soft time limit can land at any line (``reactor_app.background``).
CI, 2026-12-07: the soft-limit property cut a delivery at the tracking writer's first start,
between remembering the thread and starting it; that test process wrote no tracking row again,
and seven later tests that read tracking rows failed.

For each of the three, a fresh process cuts the owner's first use at every line the cut can
land on (its module and ``reactor_app/background.py``; ``tests/integration/cut_background.py``)
and checks that the next use gets its work done by the thread: a hold renewed, a claim renewed,
events written without a flush. Real Redis and database, real threads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import reactor_app.background

pytestmark = pytest.mark.django_db(transaction=True)


def _start_line() -> str:
    """``background.py:<line>`` of ``thread.start()``: a cut there comes after the thread was
    remembered and before it runs."""
    source = Path(reactor_app.background.__file__).read_text().splitlines()
    (line,) = [n for n, text in enumerate(source, 1) if text.strip() == "thread.start()"]
    return f"background.py:{line}"


@pytest.mark.parametrize("thread", ["hold renewer", "claim renewer", "tracking writer"])
def test_a_soft_limit_at_any_line_of_a_threads_first_start_leaves_it_startable(
    thread: str, subprocess_env: Callable[..., dict[str, str]]
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.cut_background", thread],
        env=subprocess_env(),
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    report = json.loads(done.stdout.decode().strip().splitlines()[-1])
    # the cuts reached the thread's start itself, between remembering it and starting it
    assert _start_line() in report["landed"], report
    assert report["dead_after"] == [], report
