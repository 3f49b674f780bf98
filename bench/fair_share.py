"""Fair sharing (``fair_by``): the small tenant's wait, and what a fair line costs admission.

Two measurements, each beside its peer in the same run:

* **Fairness on real workers** — tenant ``a`` submits ``--backlog`` executions (``run_async``),
  then tenant ``b`` submits 5, all on one semaphore of limit 2 whose body records its label
  into Redis as it starts and holds the slot ``--critical-ms``. The figure is the number of
  admissions until ``b``'s 5 have all been admitted, read from that Redis list: with
  ``fair_by=tenant`` against the same semaphore without it (first come, first served). The
  line builds as the backlog arrives — a real run, not the tests' held key. The worker parks
  at once by default (``--worker-wait 0``): with an in-delivery wait every delivery of the
  backlog holds a worker process up to that long before it parks, so ``b``'s messages reach
  the key only after the broker has handed out ``a``'s — the broker's order, which no line
  can change, decides then (docs/coordination.md, "Priority and fair sharing").
* **Admission script cost** — one uncontended admit + release of a semaphore, and one refusal
  that registers a waiter in a line of 50 and leaves it again (where a fair line hands out a
  turn), each with and without ``fair``, interleaved in blocks of 100 (``lock_latency``).

    python bench/fair_share.py [--backlog 200] [--critical-ms 50] [--processes 4]
                               [--worker-wait 0] [--rounds 2] [--iterations 2000]

It uses the demo project's settings (``DATABASE_URL`` / ``REDIS_URL`` when set), migrates that
database, starts its own worker on ``REACTOR_CELERY_QUEUE`` (run it with no other worker
consuming that queue), uses a fresh key prefix and deletes its executions afterwards. Not a
test: it prints figures; docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if __name__ == "__main__":
    # Run as the module the worker imports (-I bench.fair_share), so the reactors are defined
    # once, under the names the worker knows.
    from bench.fair_share import main

    main()
    sys.exit(0)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
# one key prefix for this run, shared with the worker through the environment
os.environ.setdefault("REACTOR_KEY_PREFIX", f"bench-{uuid.uuid4().hex[:8]}")

import django  # noqa: E402

django.setup()

from reactor_app import Reactor, Step, Success, from_input, step, with_semaphore  # noqa: E402
from reactor_app.conf import reactor_settings  # noqa: E402
from reactor_app.coordination.admission import Coordinator  # noqa: E402
from reactor_app.coordination.claims import (  # noqa: E402
    Admitted,
    Holder,
    Refused,
    SemaphoreClaim,
)
from reactor_app.coordination.redis import get_client  # noqa: E402

SMALL = 5
LIMIT = 2


def order_key(run: str) -> str:
    return f"{reactor_settings.KEY_PREFIX}:bench:{run}:order"


def tenant_work(args: dict[str, Any]) -> Any:
    get_client().rpush(order_key(args["run"]), args["label"])
    time.sleep(args["critical_ms"] / 1000)
    return Success(args["label"])


@with_semaphore(lambda args: f"pool:{args['run']}", limit=LIMIT, fair_by=lambda a: a["tenant"])
class FairWork(Step):
    inputs = ("run", "tenant", "label", "critical_ms")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return tenant_work(args)


@with_semaphore(lambda args: f"pool:{args['run']}", limit=LIMIT)
class PlainWork(Step):
    inputs = ("run", "tenant", "label", "critical_ms")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return tenant_work(args)


def _inputs() -> dict[str, Any]:
    return {name: from_input(name) for name in ("run", "tenant", "label", "critical_ms")}


class FairReactor(Reactor):
    inputs = ("run", "tenant", "label", "critical_ms")
    work = step(FairWork, **_inputs())


class PlainReactor(Reactor):
    inputs = ("run", "tenant", "label", "critical_ms")
    work = step(PlainWork, **_inputs())


def backlog_run(
    reactor: type[Reactor], backlog: int, critical_ms: float, timeout: float
) -> dict[str, Any]:
    """Tenant a's backlog, then b's five; returns b's admissions and the run's wall time."""
    run = uuid.uuid4().hex[:8]
    started = time.monotonic()
    for index in range(backlog):
        reactor.run_async(run=run, tenant="a", label=f"a{index}", critical_ms=critical_ms)
    for index in range(SMALL):
        reactor.run_async(run=run, tenant="b", label=f"b{index}", critical_ms=critical_ms)
    client = get_client()
    deadline = time.monotonic() + timeout
    while client.llen(order_key(run)) < backlog + SMALL and time.monotonic() < deadline:
        time.sleep(0.05)
    order = list(client.lrange(order_key(run), 0, -1))
    b_at = [index + 1 for index, label in enumerate(order) if label.startswith("b")]
    return {
        "admitted": len(order),
        "b_done_at": max(b_at) if len(b_at) == SMALL else None,
        "b_first_at": min(b_at) if b_at else None,
        "wall_s": time.monotonic() - started,
    }


def script_cost(iterations: int) -> list[dict[str, Any]]:
    """Admit + release and refuse + register + leave, plain and fair, interleaved."""
    from bench.lock_latency import measure

    coordinator = Coordinator(prefix=f"{reactor_settings.KEY_PREFIX}-script")
    contenders: list[tuple[str, Callable[[], None]]] = []
    for fair in (None, "t1"):
        name = "fair" if fair else "plain"
        free = SemaphoreClaim(f"free-{name}", limit=10, fair=fair)
        owner = Holder(owner="bench", execution_id="bench", step="bench", reactor="bench")

        def admit_release(claim: SemaphoreClaim = free, holder: Holder = owner) -> None:
            admitted = coordinator.admit([claim], holder)
            assert isinstance(admitted, Admitted), admitted
            coordinator.release(admitted, "success")

        full = SemaphoreClaim(f"full-{name}", limit=1, fair=fair)
        assert isinstance(coordinator.admit([full], Holder(owner="holder")), Admitted)
        for index in range(50):  # a standing line of five groups
            group = SemaphoreClaim(full.key, limit=1, fair=f"t{index % 5}" if fair else None)
            waiter = f"standing-{index}"
            answer = coordinator.admit([group], Holder(owner=waiter), waiter_id=waiter)
            assert isinstance(answer, Refused), answer

        def refuse_register_leave(claim: SemaphoreClaim = full) -> None:
            answer = coordinator.admit([claim], Holder(owner="asker"), waiter_id="asker")
            assert isinstance(answer, Refused), answer
            coordinator.unregister_waiter(claim, "asker")

        contenders += [
            (f"semaphore admit + release, {name}", admit_release),
            (f"refused + registered + left (line of 50), {name}", refuse_register_leave),
        ]
    return measure(contenders, iterations)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=200)
    parser.add_argument("--critical-ms", type=float, default=50.0)
    parser.add_argument(
        "--worker-wait",
        type=float,
        default=0.0,
        help="REACTOR_WORKER_WAIT of the worker (seconds a delivery waits before parking)",
    )
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="fair and plain runs each")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--timeout", type=float, default=600.0)
    options = parser.parse_args()

    from django.core.management import call_command

    from bench._support import BenchWorker, backend
    from reactor_app.models import Execution

    print(
        f"redis {get_client().info('server')['redis_version']}, db {backend()}, Python "
        f"{sys.version.split()[0]}; {options.iterations} iterations per contender"
    )
    print(f"\n{'admission script, µs':52} {'p50':>8} {'p99':>8} {'mean':>8}  vs plain")
    rows = {row["label"]: row for row in script_cost(options.iterations)}
    for label, row in rows.items():
        peer = rows[label.replace(", fair", ", plain")]
        print(
            f"{label:52} {row['p50']:8.1f} {row['p99']:8.1f} {row['mean']:8.1f}"
            f"  {row['p50'] / peer['p50']:5.2f}x"
        )
    sys.stdout.flush()

    call_command("migrate", verbosity=0)
    worker = BenchWorker(
        "bench.fair_share",
        queue=reactor_settings.CELERY_QUEUE,
        concurrency=options.processes,
        overrides={"REACTOR_WORKER_WAIT": options.worker_wait},
    ).start()
    paths = [FairReactor.path(), PlainReactor.path()]
    try:
        print(
            f"\ntenant a: {options.backlog} executions, then tenant b: {SMALL}; semaphore limit "
            f"{LIMIT}, body {options.critical_ms:g} ms, {options.processes} worker processes, "
            f"REACTOR_WORKER_WAIT {options.worker_wait:g} s"
        )
        print("| round | semaphore | admitted | b's first at | b's 5 done at | wall s |")
        print("|---:|---|---:|---:|---:|---:|")
        for round_ in range(options.rounds):
            pair = [("fair_by=tenant", FairReactor), ("plain (FIFO)", PlainReactor)]
            if round_ % 2:
                pair.reverse()
            for name, reactor in pair:
                row = backlog_run(reactor, options.backlog, options.critical_ms, options.timeout)
                print(
                    f"| {round_ + 1} | {name} | {row['admitted']}/{options.backlog + SMALL} | "
                    f"{row['b_first_at']} | {row['b_done_at']} | {row['wall_s']:.1f} |"
                )
                sys.stdout.flush()
    finally:
        worker.stop()
        Execution.objects.filter(reactor__in=paths).delete()
        client = get_client()
        for prefix in (reactor_settings.KEY_PREFIX, f"{reactor_settings.KEY_PREFIX}-script"):
            names = list(client.scan_iter(match=f"{prefix}:*", count=500))
            if names:
                client.unlink(*names)
