"""Throughput of a reactor-level lock versus the same lock at step level.

A 3-step reactor (audit → charge → notify, each step sleeping the same ``--step-ms``) where only
``charge`` needs exclusion on the account. Variant A declares the lock on the reactor (the whole
run is the critical section); variant B declares it on the ``charge`` step. ``--processes``
forked processes run ``--executions`` executions in all on one account, both variants in the
same run, and the script prints executions/second and the B/A ratio.

The clock runs from the moment every process is ready (forked, connected to the database and
Redis, one warm-up execution of its variant done on an account of its own) to the last
execution's end: it measures the lock's throughput, not the cost of starting a process, which
a short step-level run would otherwise feel several times more than the reactor-level one
(docs/benchmarks.md, "Step-level versus reactor-level lock"). The time the processes took to
get ready is printed beside it. With equal step durations
the critical section shrinks to a third, so the ratio tends towards 3x as concurrency grows
(fewer processes than steps cap it lower).

    python bench/step_vs_reactor_lock.py [--executions 120] [--processes 4] [--step-ms 20]

Uses the configured database and Redis of ``demo_project.settings`` (run ``manage.py migrate``
first; ``make bench`` does). Not a test: it prints figures; docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")

import django

django.setup()

from django.db import connections  # noqa: E402

from reactor_app import Reactor, Step, Success, from_input, step, with_lock  # noqa: E402

STEP_SECONDS = 0.02


def account_key(values: dict[str, Any]) -> str:
    return f"bench-acct:{values['account_id']}"


class Work(Step):
    inputs = ("account_id",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        time.sleep(STEP_SECONDS)
        return Success(None)


@with_lock(account_key, ttl=60, wait=600)
class Charge(Work):
    pass


@with_lock(account_key, ttl=60, wait=600)
class ReactorLevel(Reactor):
    inputs = ("account_id",)
    audit = step(Work, account_id=from_input("account_id"))
    charge = step(Work, account_id=from_input("account_id"))
    notify = step(Work, account_id=from_input("account_id"))


class StepLevel(Reactor):
    inputs = ("account_id",)
    audit = step(Work, account_id=from_input("account_id"))
    charge = step(Charge, account_id=from_input("account_id"))
    notify = step(Work, account_id=from_input("account_id"))


#: every worker and the parent meet here before the clock starts; set before each pool forks,
#: so that the pool's processes inherit it
READY: Any = None


def _worker(variant: str, account: str, runs: int, step_seconds: float) -> int:
    global STEP_SECONDS
    STEP_SECONDS = step_seconds
    connections.close_all()
    reactor = ReactorLevel if variant == "reactor" else StepLevel
    # warm up on an account of this process's own: connections, caches, the first run's costs
    if not reactor.run(account_id=f"warm-{account}-{os.getpid()}").ok:
        raise SystemExit(f"{variant}: the warm-up execution failed")
    READY.wait()
    ok = sum(1 for _ in range(runs) if reactor.run(account_id=account).ok)
    connections.close_all()
    return ok


def measure(
    variant: str, executions: int, processes: int, step_seconds: float
) -> tuple[float, float]:
    """Executions per second once every process is ready, and the seconds they took to get
    ready (fork, connections, the warm-up execution)."""
    global READY
    account = uuid.uuid4().hex[:8]
    share = [
        executions // processes + (1 if i < executions % processes else 0) for i in range(processes)
    ]
    connections.close_all()
    context = multiprocessing.get_context("fork")
    READY = context.Barrier(processes + 1)
    forked = time.perf_counter()
    with context.Pool(processes) as pool:
        pending = pool.starmap_async(_worker, [(variant, account, n, step_seconds) for n in share])
        READY.wait(timeout=120)
        started = time.perf_counter()
        done = sum(pending.get())
        elapsed = time.perf_counter() - started
    if done != executions:
        raise SystemExit(f"{variant}: only {done}/{executions} executions succeeded")
    return executions / elapsed, started - forked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=120)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=20.0)
    options = parser.parse_args()
    step_seconds = options.step_ms / 1000
    print(
        f"{options.executions} executions, {options.processes} processes, one account, "
        f"3 steps of {options.step_ms:g} ms each"
    )
    reactor_rate, reactor_ready = measure(
        "reactor", options.executions, options.processes, step_seconds
    )
    step_rate, step_ready = measure("step", options.executions, options.processes, step_seconds)
    print(
        f"{'lock at reactor level':<24}{reactor_rate:8.1f} executions/s"
        f"   (processes ready in {reactor_ready * 1000:.0f} ms, not counted)"
    )
    print(
        f"{'lock at step level':<24}{step_rate:8.1f} executions/s"
        f"   (processes ready in {step_ready * 1000:.0f} ms, not counted)"
    )
    print(f"{'ratio step/reactor':<24}{step_rate / reactor_rate:8.3f}x")


if __name__ == "__main__":
    main()
