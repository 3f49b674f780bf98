"""Throughput of a reactor-level lock versus the same lock at step level.

A 3-step reactor (audit → charge → notify, each step sleeping the same ``--step-ms``) where only
``charge`` needs exclusion on the account. Variant A declares the lock on the reactor (the whole
run is the critical section); variant B declares it on the ``charge`` step. ``--processes``
forked processes run ``--executions`` executions in all on one account, both variants in the
same run, and the script prints executions/second and the B/A ratio. With equal step durations
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


def _worker(variant: str, account: str, runs: int, step_seconds: float) -> int:
    global STEP_SECONDS
    STEP_SECONDS = step_seconds
    connections.close_all()
    reactor = ReactorLevel if variant == "reactor" else StepLevel
    ok = sum(1 for _ in range(runs) if reactor.run(account_id=account).ok)
    connections.close_all()
    return ok


def measure(variant: str, executions: int, processes: int, step_seconds: float) -> float:
    account = uuid.uuid4().hex[:8]
    share = [
        executions // processes + (1 if i < executions % processes else 0) for i in range(processes)
    ]
    connections.close_all()
    context = multiprocessing.get_context("fork")
    started = time.perf_counter()
    with context.Pool(processes) as pool:
        done = sum(pool.starmap(_worker, [(variant, account, n, step_seconds) for n in share]))
    elapsed = time.perf_counter() - started
    if done != executions:
        raise SystemExit(f"{variant}: only {done}/{executions} executions succeeded")
    return executions / elapsed


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
    reactor_rate = measure("reactor", options.executions, options.processes, step_seconds)
    step_rate = measure("step", options.executions, options.processes, step_seconds)
    print(f"{'lock at reactor level':<24}{reactor_rate:8.1f} executions/s")
    print(f"{'lock at step level':<24}{step_rate:8.1f} executions/s")
    print(f"{'ratio step/reactor':<24}{step_rate / reactor_rate:8.3f}x")


if __name__ == "__main__":
    main()
