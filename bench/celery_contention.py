"""Celery contention: reactor_app's parked executions beside a plain Celery chain with retry.

The same contended workflow, N executions on ONE key, through the same real Celery worker
(prefork, 4 processes) in the same run:

* **reactor_app** — ``BenchReactor.run_async(...)``: ``audit`` → ``charge`` (a step-level
  ``with_lock`` on the key, body of ``--critical-ms``) → ``notify``. Contention parks the
  execution; the release that frees the key re-enqueues the next waiter at once.
* **Celery chain** — ``audit.s() | charge.s() | notify.s()``: the middle task takes a redis-py
  ``Lock`` on the key without blocking and, when it is taken, ``self.retry(countdown=1)``.

Each execution's end-to-end latency runs from just before it is submitted to the end of its
``notify`` body (``time.time_ns()``, one machine); throughput is executions per second from the
first submission to the last completion. The **floor** is one critical section after another
with zero hand-off (1000 / critical-ms executions per second); "% of floor" is the throughput
against it. The **hand-off** is the gap from one critical section's end to the next one's
start (the key idle between two holders), median and p99.

    python bench/celery_contention.py [--executions 50] [--critical-ms 20,100] [--processes 4]

It uses the demo project's settings: ``DATABASE_URL`` / ``REDIS_URL`` when set, else SQLite
and the embedded Redis. It migrates that database, starts its own worker on
``REACTOR_CELERY_QUEUE`` (run it with no other worker consuming that queue), uses a fresh key
prefix, and deletes its executions afterwards. Not a test: it prints figures;
docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if __name__ == "__main__":
    # Run as the module the worker imports (-I bench.celery_contention), so the reactor and the
    # tasks are defined once, under the names the worker knows.
    from bench.celery_contention import main

    main()
    sys.exit(0)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
# one key prefix for this run, shared with the worker through the environment
os.environ.setdefault("REACTOR_KEY_PREFIX", f"bench-{uuid.uuid4().hex[:8]}")

import django  # noqa: E402

django.setup()

from celery import chain, shared_task  # noqa: E402

from reactor_app import Reactor, Step, Success, from_input, step, with_lock  # noqa: E402
from reactor_app.conf import reactor_settings  # noqa: E402
from reactor_app.coordination.redis import get_client  # noqa: E402

KEY = "bench:acct:1"


def done_key(run: str) -> str:
    return f"{reactor_settings.KEY_PREFIX}:bench:{run}:done"


def record_done(run: str, index: int) -> None:
    get_client().rpush(done_key(run), json.dumps({"index": index, "at": time.time_ns()}))


def bodies_key(run: str) -> str:
    return f"{reactor_settings.KEY_PREFIX}:bench:{run}:bodies"


def critical_section(run: str, critical_ms: float) -> None:
    """The protected work: sleep, recording its interval (for the hand-off figures)."""
    start = time.time_ns()
    time.sleep(critical_ms / 1000)
    get_client().rpush(bodies_key(run), json.dumps({"start": start, "end": time.time_ns()}))


# --------------------------------------------------------------------------------------------
# (a) reactor_app


class BenchAudit(Step):
    inputs = ("run", "index")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success("audited")


@with_lock(lambda args: KEY, ttl=30)
class BenchCharge(Step):
    inputs = ("run", "index", "critical_ms")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        critical_section(args["run"], args["critical_ms"])
        return Success("charged")


class BenchNotify(Step):
    inputs = ("run", "index")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record_done(args["run"], args["index"])
        return Success("sent")


class BenchReactor(Reactor):
    inputs = ("run", "index", "critical_ms")

    audit = step(BenchAudit, run=from_input("run"), index=from_input("index"))
    charge = step(
        BenchCharge,
        run=from_input("run"),
        index=from_input("index"),
        critical_ms=from_input("critical_ms"),
    )
    notify = step(BenchNotify, run=from_input("run"), index=from_input("index"))


# --------------------------------------------------------------------------------------------
# (b) a plain Celery chain with a redis-py Lock and retry(countdown=1)


@shared_task(name="bench.chain_audit", acks_late=True)
def chain_audit(run: str, index: int, critical_ms: float) -> dict[str, Any]:
    return {"run": run, "index": index, "critical_ms": critical_ms}


@shared_task(name="bench.chain_charge", bind=True, acks_late=True, max_retries=None)
def chain_charge(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
    lock = get_client().lock(f"{reactor_settings.KEY_PREFIX}:plain:{KEY}", timeout=30)
    if not lock.acquire(blocking=False):
        get_client().incr(f"{reactor_settings.KEY_PREFIX}:bench:{payload['run']}:refusals")
        raise self.retry(countdown=1)
    try:
        critical_section(payload["run"], payload["critical_ms"])
    finally:
        lock.release()
    return payload


@shared_task(name="bench.chain_notify", acks_late=True)
def chain_notify(payload: dict[str, Any]) -> None:
    record_done(payload["run"], payload["index"])


# --------------------------------------------------------------------------------------------
# running


def start_worker(processes: int) -> tuple[subprocess.Popen[bytes], Path]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    log_path = Path(tempfile.mkstemp(prefix="bench-celery-", suffix=".log")[1])
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "demo_project", "worker",
                "-P", "prefork", "-c", str(processes),
                "--without-heartbeat", "--without-gossip", "--without-mingle",
                "-Q", reactor_settings.CELERY_QUEUE, "-I", "bench.celery_contention",
                "-n", f"bench-{uuid.uuid4().hex[:6]}@%h", "--loglevel", "WARNING",
            ],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    from demo_project.celery import app

    deadline = time.monotonic() + 60
    while not app.control.ping(timeout=0.5):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the worker did not start; see {log_path}")
    return process, log_path


def stop_worker(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def measure(
    name: str, submit: Callable[[str, int], None], executions: int, timeout: float
) -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    submitted: dict[int, int] = {}
    for index in range(executions):
        submitted[index] = time.time_ns()
        submit(run, index)
    client = get_client()
    deadline = time.monotonic() + timeout
    while client.llen(done_key(run)) < executions:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    done = {d["index"]: d["at"] for d in map(json.loads, client.lrange(done_key(run), 0, -1))}
    latencies = [(done[i] - submitted[i]) / 1e9 for i in done]
    wall = (max(done.values()) - min(submitted.values())) / 1e9 if done else float("nan")
    bodies = sorted(
        (json.loads(b) for b in client.lrange(bodies_key(run), 0, -1)), key=lambda b: b["start"]
    )
    handoffs = [(b["start"] - a["end"]) / 1e6 for a, b in itertools.pairwise(bodies)]
    return {
        "handoff_p50_ms": statistics.median(handoffs) if handoffs else float("nan"),
        "handoff_p99_ms": percentile(handoffs, 99) if handoffs else float("nan"),
        "name": name,
        "run": run,
        "completed": len(done),
        "wall_s": wall,
        "throughput": len(done) / wall if done else 0.0,
        "p50_s": statistics.median(latencies) if latencies else float("nan"),
        "p99_s": percentile(latencies, 99) if latencies else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executions", type=int, default=50)
    parser.add_argument(
        "--critical-ms", default="20,100", help="critical section(s) in ms, comma-separated"
    )
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=300.0)
    options = parser.parse_args()
    sections = [float(ms) for ms in str(options.critical_ms).split(",") if ms.strip()]

    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    process, log_path = start_worker(options.processes)
    failures = 0
    try:
        print(
            f"{options.executions} executions on one key, {options.processes} worker processes "
            f"(db {django.conf.settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}, "
            f"redis {get_client().info('server')['redis_version']}, "
            f"REACTOR_WORKER_WAIT {reactor_settings.WORKER_WAIT:g} s)"
        )
        print(
            "| critical section | workflow | completed | executions/s | % of floor | "
            "vs chain | p50 s | p99 s | hand-off p50 ms | hand-off p99 ms | refusals |"
        )
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for critical_ms in sections:
            rows, failed = measure_pair(options.executions, critical_ms, options.timeout)
            failures += failed
            floor = 1000.0 / critical_ms
            for row in rows:
                ratio = row["throughput"] / rows[1]["throughput"] if rows[1]["throughput"] else 0
                print(
                    f"| {critical_ms:g} ms | {row['name']} | {row['completed']}/"
                    f"{options.executions} | {row['throughput']:.2f} | "
                    f"{100 * row['throughput'] / floor:.0f}% | {ratio:.2f}x | "
                    f"{row['p50_s']:.2f} | {row['p99_s']:.2f} | {row['handoff_p50_ms']:.1f} | "
                    f"{row['handoff_p99_ms']:.1f} | {row['refusals']} |"
                )
    finally:
        stop_worker(process)
        client = get_client()
        names = list(client.scan_iter(match=f"{reactor_settings.KEY_PREFIX}:*", count=500))
        if names:
            client.unlink(*names)
    if failures:
        print(f"{failures} reactor_app execution(s) did not succeed; worker log: {log_path}")
    else:
        log_path.unlink(missing_ok=True)


def measure_pair(executions: int, critical_ms: float, timeout: float) -> tuple[list[dict], int]:
    """Both workflows at one critical section; returns the rows and reactor_app's failures."""
    from django.db.models import Sum

    from reactor_app.models import ContentionState, Execution

    workload = sys.modules[__name__]

    def ours(run: str, index: int) -> None:
        workload.BenchReactor.run_async(run=run, index=index, critical_ms=critical_ms)

    def plain(run: str, index: int) -> None:
        chain(
            workload.chain_audit.s(run, index, critical_ms),
            workload.chain_charge.s(),
            workload.chain_notify.s(),
        ).apply_async(queue=reactor_settings.CELERY_QUEUE)

    try:
        rows = [
            measure("reactor_app run_async, step lock", ours, executions, timeout),
            measure("Celery chain, redis-py Lock + retry(countdown=1)", plain, executions,
                    timeout),
        ]  # fmt: skip
        ours_executions = Execution.objects.filter(reactor=workload.BenchReactor.path())
        failures = ours_executions.exclude(status="succeeded").count()
        # contention refusals: parks (reactor_app) and retries (the chain)
        rows[0]["refusals"] = (
            ContentionState.objects.filter(execution__in=ours_executions).aggregate(
                total=Sum("attempts")
            )["total"]
            or 0
        )
        chain_refusals = get_client().get(
            f"{reactor_settings.KEY_PREFIX}:bench:{rows[1]['run']}:refusals"
        )
        rows[1]["refusals"] = int(chain_refusals or 0)
    finally:
        Execution.objects.filter(reactor=workload.BenchReactor.path()).delete()
    return rows, failures
