"""CPU per locked no-op ``Step.call`` with a stand-in answering the two lock scripts.

The wall-clock figures of ``hot_path.py`` move with a shared machine's load by more than the
engine's own Python is worth; CPU time does much less. A stand-in replaces the script
registry of the coordination client (``admission.scripts_for``), so ``lock_admit`` and
``lock_release`` are answered at once — an admission with a fresh fencing token, a release
that freed the key — and everything else a locked ``Step.call`` does runs as it does against
Redis: the gate, the two coordination events with their signals (and the Prometheus receiver
when ``prometheus_client`` is installed), the tracking rows written behind by the writer
thread (to the configured database), the renewal registration.

    python bench/locked_call_cpu.py [--calls 20000] [--runs 5]

Prints, per run, the process CPU (every thread, the writer's included) and the calling
thread's CPU per call, in µs, and the best of each. Run it from the tree to measure (the
tree's own ``reactor_app`` is imported first; the line it prints says which). Not a test;
docs/benchmarks.md records its figures. The rows it writes have keys ``bench:cpu:*`` and are
deleted at the end.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
os.environ.setdefault("DJANGO_DEBUG", "0")

import django

django.setup()

import reactor_app  # noqa: E402
from reactor_app import Step, Success, with_lock  # noqa: E402
from reactor_app.coordination import admission  # noqa: E402
from reactor_app.models import CoordinationEvent  # noqa: E402
from reactor_app.write_behind import flush  # noqa: E402


class StandIn:
    """Answers the single-lock scripts as Redis would for an uncontended key."""

    def __init__(self) -> None:
        self.tokens = itertools.count(1)

    def call(self, operation: str, keys: Any, args: Any) -> Any:
        if operation == "lock_admit":
            return [0, b"1700000000000", 1, next(self.tokens)]  # OK, time, fresh, token
        if operation == "lock_release":
            return [0, None]  # freed, nobody woken
        raise AssertionError(f"the stand-in does not answer {operation}")


@with_lock(lambda args: "bench:cpu:lock", ttl=60)
class LockedNoop(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=5)
    options = parser.parse_args()
    stand_in = StandIn()
    admission.scripts_for = lambda client: stand_in  # type: ignore[assignment]
    print(f"reactor_app from {Path(reactor_app.__file__).parent}")
    try:
        for _ in range(500):
            assert LockedNoop.call().ok
        process, thread = [], []
        for _ in range(options.runs):
            cpu, own = time.process_time(), time.thread_time()
            for _ in range(options.calls):
                LockedNoop.call()
            process.append((time.process_time() - cpu) / options.calls * 1e6)
            thread.append((time.thread_time() - own) / options.calls * 1e6)
    finally:
        flush()
        CoordinationEvent.objects.filter(key__startswith="bench:cpu:").delete()
    print("process CPU µs/call:", " ".join(f"{v:.1f}" for v in process), f"best {min(process):.1f}")
    print("caller thread µs/call:", " ".join(f"{v:.1f}" for v in thread), f"best {min(thread):.1f}")


if __name__ == "__main__":
    main()
