"""``manage.py demo_step_lock`` end to end (SC-013), as a user runs it.

The command runs as a subprocess against the test database and the suite's Redis (in this
test's key space); it starts its own Celery worker processes, runs every path and must report
every claim passed, with a timeline per key, a JSON report and the HTML file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PROJECT_ROOT

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

PATHS = ["serialized", "contended", "compensated", "period", "rate_limit"]


DEMO_TIMEOUT = 240.0


def run_demo(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the demo; one that overruns is stopped the way an operator would — SIGTERM, on
    which it stops the Celery workers it started — and only then killed with its process
    group, so no worker of a failed run is left polling the suite's Redis."""
    process = subprocess.Popen(
        [sys.executable, "manage.py", "demo_step_lock", *args],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=DEMO_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.terminate()
        try:
            stdout, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
        pytest.fail(
            f"the demo did not finish in {DEMO_TIMEOUT:g} s\nstdout:\n{stdout}\nstderr:\n{stderr}"
        )
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_every_claim_of_the_demo_passes(
    subprocess_env: Callable[..., dict[str, str]], tmp_path: Path, reactor_redis: Any
) -> None:
    # reactor_redis: this test uses the coordination Redis (through its child processes), so
    # its key space is cleaned afterwards like any other test's
    html = tmp_path / "timeline.html"
    done = run_demo(subprocess_env(), "--json", "--executions", "2", "--output", str(html))

    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    report = json.loads(done.stdout)  # stdout is exactly the JSON document
    failed = [
        (path["name"], claim["claim"], claim["evidence"])
        for path in report["paths"]
        for claim in path["claims"]
        if not claim["passed"]
    ]
    assert report["ok"] and not failed, failed
    assert [path["name"] for path in report["paths"]] == PATHS
    assert report["workers"]["started_here"] and report["workers"]["processes"] == 2
    for path in report["paths"]:
        assert path["claims"], path["name"]
        assert path["executions"], path["name"]
        for key in path["keys"]:
            assert path["timeline"][key], f"{path['name']}: no timeline for {key}"

    contended = next(p for p in report["paths"] if p["name"] == "contended")
    events = {row["event"] for row in contended["timeline"][contended["keys"][0]]}
    assert {"acquired", "released", "parked", "resumed"} <= events
    compensated = next(p for p in report["paths"] if p["name"] == "compensated")
    rows = compensated["timeline"][compensated["keys"][0]]
    assert any(row["event"] == "undo_began" for row in rows)
    assert any(r["event"] == "released" and "rollback" in r["text"] for r in rows)

    assert "every claim passed" in done.stderr  # progress and summary go to stderr
    # it ends with what to open next: the timeline file and the admin
    closing = done.stderr.rstrip().splitlines()[-4:]
    assert closing[0] == "next:", done.stderr
    assert html.resolve().as_uri() in closing[1]
    assert closing[-1].endswith("http://127.0.0.1:8000/admin/reactor_app/coordination/")
    page = html.read_text()
    assert "every claim passed" in page and page.count("<svg") >= 5
    assert (tmp_path / "worker-1.log").exists()  # worker logs sit next to the page


def test_no_worker_without_a_running_worker_says_what_to_do(
    subprocess_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    env = subprocess_env()
    done = run_demo(env, "--no-worker", "--output", str(tmp_path / "t.html"))

    assert done.returncode != 0
    assert "no Celery worker consumes the queue" in done.stderr


def test_bad_executions_is_refused(subprocess_env: Callable[..., dict[str, str]]) -> None:
    done = run_demo(subprocess_env(), "--executions", "1")
    assert done.returncode != 0
    assert "--executions must be between 2 and 10" in done.stderr
