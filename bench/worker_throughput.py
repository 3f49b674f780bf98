"""Worker throughput: a 3-step reactor via ``run_async`` beside plain Celery doing the same work.

Three workloads through the same real Celery worker (prefork, ``--processes`` processes), the
same broker and the same database, in the same run:

* **reactor_app** — ``ThroughputReactor.run_async(...)``: ``first`` → ``second`` → ``third``,
  each step one of the three bodies below, each reading the previous one's result;
* **Celery chain** — ``first.s() | second.s() | third.s()``: the same three bodies as three
  tasks (the peer the issue's target is set against: ≥ 2x its executions/s);
* **one Celery task** — one task calling the three bodies in a row (target: ≥ 0.6x its
  executions/s).

The bodies are trivial (a ~200-byte dict in, a ~200-byte dict out); the third one records the
time it ended in Redis. Throughput is ``--executions`` executions divided by the time from the
first submission to the last third body's end. Each repetition measures the three workloads
one after another, in an order that rotates from one repetition to the next, so that a change
in the machine's load falls on each of them alike; the ratios are taken within a repetition.

    python bench/worker_throughput.py [--executions 200] [--repetitions 5] [--processes 2]
                                      [--store-delivery-results] [--cpu]

``--cpu`` also prints where the CPU went, per execution: the benchmark process (the
submissions), the worker's processes, PostgreSQL's and Redis's server processes, and the whole
machine's busy time (``bench._support.cpu_used``; Linux). On a machine the workloads keep
busy, an execution's throughput is about the cores divided by its machine time.

The Celery tasks store their results in the result backend (Celery's default, and how a Celery
user gets a task's value); ``reactor_app.run_execution`` does not (its default: the execution
row is its result, which the delivery writes anyway). ``--store-delivery-results`` measures a
deployment that stores the delivery's summary too (``ignore_result=False`` through
``task_annotations``, docs/operations.md).

It uses the demo project's settings: ``DATABASE_URL`` / ``REDIS_URL`` when set, else SQLite
and the embedded Redis (the Celery result backend is the demo's: ``django-db``). It migrates
that database, starts its own worker on ``REACTOR_CELERY_QUEUE`` (run it with no other worker
consuming that queue), uses a fresh key prefix, and deletes its executions afterwards. Not a
test: it prints figures; docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if __name__ == "__main__":
    # Run as the module the worker imports (-I bench.worker_throughput), so the reactor and the
    # tasks are defined once, under the names the worker knows.
    from bench.worker_throughput import main

    main()
    sys.exit(0)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
# as in production: DEBUG off (Django's debug cursor logs and formats every statement, the
# result backend's as the deliveries'); the worker inherits it through the environment
os.environ.setdefault("DJANGO_DEBUG", "0")
# one key prefix for this run, shared with the worker through the environment
os.environ.setdefault("REACTOR_KEY_PREFIX", f"bench-{uuid.uuid4().hex[:8]}")

import django  # noqa: E402

django.setup()

from celery import chain, shared_task  # noqa: E402
from django.conf import settings as django_settings  # noqa: E402

from reactor_app import Reactor, Step, Success, from_input, from_result, step  # noqa: E402
from reactor_app.conf import reactor_settings  # noqa: E402
from reactor_app.coordination.redis import get_client  # noqa: E402

if os.environ.get("BENCH_STORE_DELIVERY_RESULTS") == "1":
    # --store-delivery-results: the delivery task's summary stored in the result backend too
    # (this module is imported by the worker too)
    from reactor_app.tasks import run_execution

    run_execution.ignore_result = False

FILLER = "x" * 150


def done_key(run: str) -> str:
    return f"{reactor_settings.KEY_PREFIX}:bench:{run}:done"


# --------------------------------------------------------------------------------------------
# the three bodies, shared by every workload


def first_body(run: str, index: int) -> dict[str, Any]:
    return {"run": run, "index": index, "stage": 1, "filler": FILLER}


def second_body(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "stage": 2}


def third_body(payload: dict[str, Any]) -> dict[str, Any]:
    get_client().rpush(done_key(payload["run"]), json.dumps(time.time_ns()))
    return {**payload, "stage": 3}


# --------------------------------------------------------------------------------------------
# reactor_app


class First(Step):
    inputs = ("run", "index")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(first_body(args["run"], args["index"]))


class Second(Step):
    inputs = ("payload",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(second_body(args["payload"]))


class Third(Step):
    inputs = ("payload",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(third_body(args["payload"]))


class ThroughputReactor(Reactor):
    inputs = ("run", "index")

    first = step(First, run=from_input("run"), index=from_input("index"))
    second = step(Second, payload=from_result("first"))
    third = step(Third, payload=from_result("second"))
    returns = "third"


# --------------------------------------------------------------------------------------------
# plain Celery


@shared_task(name="bench.throughput_first")
def task_first(run: str, index: int) -> dict[str, Any]:
    return first_body(run, index)


@shared_task(name="bench.throughput_second")
def task_second(payload: dict[str, Any]) -> dict[str, Any]:
    return second_body(payload)


@shared_task(name="bench.throughput_third")
def task_third(payload: dict[str, Any]) -> dict[str, Any]:
    return third_body(payload)


@shared_task(name="bench.throughput_all")
def task_all(run: str, index: int) -> dict[str, Any]:
    return third_body(second_body(first_body(run, index)))


# --------------------------------------------------------------------------------------------
# running


def submit_reactor(run: str, index: int) -> None:
    sys.modules[__name__].ThroughputReactor.run_async(run=run, index=index)


def submit_chain(run: str, index: int) -> None:
    module = sys.modules[__name__]
    chain(
        module.task_first.s(run, index), module.task_second.s(), module.task_third.s()
    ).apply_async(queue=reactor_settings.CELERY_QUEUE)


def submit_one_task(run: str, index: int) -> None:
    sys.modules[__name__].task_all.apply_async((run, index), queue=reactor_settings.CELERY_QUEUE)


WORKLOADS: dict[str, Callable[[str, int], None]] = {
    "reactor_app run_async, 3 steps": submit_reactor,
    "Celery chain of the 3 bodies": submit_chain,
    "one Celery task, 3 bodies": submit_one_task,
}


def measure(
    submit: Callable[[str, int], None],
    executions: int,
    timeout: float,
    cpu: dict[str, float] | None = None,
    worker: list[int] | None = None,
) -> float:
    """Executions per second; 0.0 when not all of them ended within ``timeout``. With ``cpu``,
    the CPU ms per execution of each group of ``bench._support.cpu_used`` (the ``worker``
    processes' among them) is added into it."""
    from bench._support import cpu_snapshot, cpu_used

    run = uuid.uuid4().hex[:8]
    client = get_client()
    before = cpu_snapshot(worker or []) if cpu is not None else None
    started_ns = time.time_ns()
    for index in range(executions):
        submit(run, index)
    deadline = time.monotonic() + timeout
    while client.llen(done_key(run)) < executions:
        if time.monotonic() > deadline:
            return 0.0
        time.sleep(0.01)
    ended_ns = max(json.loads(at) for at in client.lrange(done_key(run), 0, -1))
    if cpu is not None and before is not None:
        # the last executions' final writes end just after their third body: let them finish
        time.sleep(0.2)
        for group, used in cpu_used(before, cpu_snapshot(worker or [])).items():
            cpu[group] = cpu.get(group, 0.0) + used * 1000 / executions
    client.delete(done_key(run))
    return executions / ((ended_ns - started_ns) / 1e9)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--executions", type=int, default=200, help="per workload and run")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0, help="per workload and run")
    parser.add_argument(
        "--store-delivery-results",
        action="store_true",
        help="store reactor_app.run_execution's return value in the result backend too "
        "(ignore_result=False), as the Celery tasks' results are",
    )
    parser.add_argument(
        "--cpu", action="store_true", help="also print the CPU ms per execution, per process"
    )
    options = parser.parse_args()
    if min(options.executions, options.repetitions, options.processes) < 1:
        parser.error("--executions, --repetitions and --processes must be at least 1")

    from django.core.management import call_command

    from bench._support import BenchWorker, backend, process_group
    from reactor_app.models import Execution

    if options.store_delivery_results:
        # read by this module at import, in this process (already imported: set it here too)
        # and in the worker, which inherits the environment
        os.environ["BENCH_STORE_DELIVERY_RESULTS"] = "1"
        from reactor_app.tasks import run_execution

        run_execution.ignore_result = False
    call_command("migrate", verbosity=0)
    worker = BenchWorker(
        "bench.worker_throughput",
        queue=reactor_settings.CELERY_QUEUE,
        concurrency=options.processes,
    ).start()
    names = list(WORKLOADS)
    rates: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, dict[str, float]] = {name: {} for name in names}
    path = ThroughputReactor.path()
    try:
        print(
            f"{options.executions} executions per workload and run, {options.processes} worker "
            f"processes (db {backend()}, redis {get_client().info('server')['redis_version']})"
        )
        print(celery_settings())
        print(f"DEBUG={django_settings.DEBUG} (the worker inherits it)")
        # one untimed round first: imports, connections and the first tasks' set-up
        for name in names:
            measure(WORKLOADS[name], min(20, options.executions), options.timeout)
        print("| run | order | " + " | ".join(names) + " | vs chain | vs one task |")
        print("|---:|---|" + "---:|" * (len(names) + 2))
        for repetition in range(options.repetitions):
            order = names[repetition % 3 :] + names[: repetition % 3]
            if repetition % 2:
                order.reverse()
            for name in order:
                rates[name].append(
                    measure(
                        WORKLOADS[name],
                        options.executions,
                        options.timeout,
                        cpu=cpu[name] if options.cpu else None,
                        worker=process_group(worker.pid) if options.cpu else None,
                    )
                )
            ours, chained, single = (rates[name][-1] for name in names)
            print(
                f"| {repetition + 1} | {', '.join(str(names.index(n) + 1) for n in order)} | "
                + " | ".join(f"{rates[name][-1]:.1f}/s" for name in names)
                + f" | {share(ours, chained)} | {share(ours, single)} |"
            )
            sys.stdout.flush()
        medians = {name: statistics.median(rates[name]) for name in names}
        ratios_chain = [share(o, c) for o, c in zip(rates[names[0]], rates[names[1]], strict=True)]
        ratios_task = [share(o, t) for o, t in zip(rates[names[0]], rates[names[2]], strict=True)]
        print(
            "| median | | "
            + " | ".join(f"{medians[name]:.1f}/s" for name in names)
            + f" | {share(medians[names[0]], medians[names[1]])} | "
            f"{share(medians[names[0]], medians[names[2]])} |"
        )
        print(f"ratios per run: vs chain {', '.join(ratios_chain)}; vs one task "
              f"{', '.join(ratios_task)}")  # fmt: skip
        print("targets: >= 2x the chain, >= 0.6x one task")
        if options.cpu:
            print_cpu(cpu, options.repetitions)
        # the third body ends before its execution's final write: let the last rows finish
        settled = ("succeeded", "failed", "halted", "cancelled")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not Execution.objects.filter(reactor=path).exclude(status__in=settled).exists():
                break
            time.sleep(0.1)
        failed = Execution.objects.filter(reactor=path).exclude(status="succeeded")
        if failed.exists():
            worker.keep_log = True
            statuses = sorted(failed.values_list("status", flat=True))
            print(f"{len(statuses)} reactor_app execution(s) did not succeed ({statuses}); "
                  f"worker log: {worker.log_path}")  # fmt: skip
    finally:
        worker.stop()
        Execution.objects.filter(reactor=path).delete()
        client = get_client()
        leftovers = list(client.scan_iter(match=f"{reactor_settings.KEY_PREFIX}:*", count=500))
        if leftovers:
            client.unlink(*leftovers)


def celery_settings() -> str:
    """What decides how the one worker takes and acknowledges each workload's messages: the
    same prefetch for all, and each task's own ``acks_late`` / ``ignore_result``."""
    from celery import current_app

    from reactor_app.tasks import run_execution

    module = sys.modules[__name__]
    conf = current_app.conf
    tasks = {
        "reactor_app.run_execution": run_execution,
        "chain tasks": module.task_first,
        "one task": module.task_all,
    }
    per_task = "; ".join(
        f"{name}: acks_late={task.acks_late}, ignore_result={task.ignore_result}"
        for name, task in tasks.items()
    )
    return (
        f"celery: prefetch multiplier {conf.worker_prefetch_multiplier}, result backend "
        f"{conf.result_backend}, pool prefork; {per_task}"
    )


def print_cpu(cpu: dict[str, dict[str, float]], repetitions: int) -> None:
    """The mean CPU ms per execution of each workload, by process group (``--cpu``)."""
    groups = ("benchmark", "worker", "postgres", "redis", "machine")
    print("\nCPU ms per execution, mean of the runs (machine: every CPU's busy time)")
    print("| workload | " + " | ".join(groups) + " |")
    print("|---|" + "---:|" * len(groups))
    for name, used in cpu.items():
        print(
            f"| {name} | "
            + " | ".join(f"{used.get(group, 0.0) / repetitions:.2f}" for group in groups)
            + " |"
        )


def share(value: float, peer: float) -> str:
    return f"{value / peer:.2f}x" if peer > 0 else "-"
