"""Growth: time and bytes written per unit of work as a workflow gets longer.

Two workloads, each at several sizes, in the caller's process (``Reactor.run``) and on a real
Celery worker (``run_async``, a prefork worker of ``--processes`` processes):

* **steps** — a reactor of N independent steps (10, 100, 1,000);
* **map** — one ``map_step`` over N elements (10, 1,000, 10,000).

Every step body and every element returns a ~200-byte dict (random hex inside, so that
PostgreSQL's compression of large values does not hide what is written). Per case the script
prints the time per unit (the whole run divided by N: an in-process run timed around
``Reactor.run`` after a warm-up run in the same process; a worker run from ``run_async`` to the
row seen terminal) and the bytes written per unit:

* PostgreSQL: WAL bytes (``pg_wal_lsn_diff`` of ``pg_current_wal_lsn()`` — server-wide, so a
  shared server's other traffic lands in it too) and the growth of the project's tables on
  disk; SQLite: the bytes the processes running the case passed to write calls (its ``-wal``
  file rewinds at each checkpoint) and the growth of the database file;
* the size of what the execution keeps: its ``context`` as JSON, and its step-run rows.

**The peer is the smallest size of the same workload and mode, measured in the same run**:
each row prints its time per unit and WAL per unit as a ratio to it (the target: the
10,000-element map's time per element ≤ 1.5x the 10-element map's, bytes per element
constant).

Sizes whose cost grows with the square of N can take a very long time; each case gets
``--max-seconds`` (a run that has not finished by then is stopped and reported as "did not
finish in N s" with the units it had done and its figures per unit so far, and the larger
sizes of that workload and mode are skipped):

    python bench/growth.py [--quick] [--sizes steps=10,100,1000] [--sizes map=10,1000,10000]
                           [--modes in-process,worker] [--max-seconds 120] [--processes 2]

It uses the demo project's settings: ``DATABASE_URL`` / ``REDIS_URL`` when set, else SQLite
and the embedded Redis. It migrates that database, starts its own worker on
``REACTOR_CELERY_QUEUE`` (run it with no other worker consuming that queue), uses a fresh key
prefix, and deletes its executions afterwards. An in-process case runs in a child process (so
that a run past its budget can be stopped). Not a test: it prints figures;
docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_SIZES = {"steps": [10, 100, 1000], "map": [10, 1000, 10000]}
QUICK_SIZES = {"steps": [10, 100], "map": [10, 100]}
MODES = ("in-process", "worker")
#: the reactor sizes this process (and the worker, through the environment) defines
STEPS_ENV = "BENCH_GROWTH_STEPS"


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        action="append",
        default=[],
        metavar="KIND=N,N,...",
        help="sizes of one workload (steps or map), e.g. map=10,1000; repeatable",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes only (steps and map: 10 and 100)"
    )
    parser.add_argument("--modes", default=",".join(MODES), help="in-process, worker or both")
    parser.add_argument(
        "--max-seconds", type=float, default=120.0, help="budget per case (default 120)"
    )
    parser.add_argument("--processes", type=int, default=2, help="worker processes")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every case")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    sizes = {kind: list(values) for kind, values in (QUICK_SIZES if options.quick else
                                                     DEFAULT_SIZES).items()}  # fmt: skip
    for spec in options.sizes:
        kind, _, values = spec.partition("=")
        if kind not in DEFAULT_SIZES or not values:
            parser.error(f"--sizes {spec!r}: expected steps=N,... or map=N,...")
        try:
            sizes[kind] = sorted({int(v) for v in values.split(",") if v.strip()})
        except ValueError:
            parser.error(f"--sizes {spec!r}: the sizes must be whole numbers")
        if not sizes[kind] or min(sizes[kind]) < 1:
            parser.error(f"--sizes {spec!r}: the sizes must be at least 1")
    modes = [m.strip() for m in str(options.modes).split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes {options.modes!r}: expected in-process, worker or both")
    if options.max_seconds <= 0 or options.processes < 1 or options.repeat < 1:
        parser.error("--max-seconds, --processes and --repeat must be positive")
    options.size_table = sizes
    options.mode_list = modes
    return options


if __name__ == "__main__":
    # Run as the module the worker imports (bench.growth), so the reactors are defined once,
    # under the names the worker finds them by.
    _options = parse_options()
    if _options.child:
        os.environ[STEPS_ENV] = _options.child[1] if _options.child[0] == "steps" else ""
    else:
        os.environ[STEPS_ENV] = ",".join(map(str, _options.size_table["steps"]))
    from bench.growth import child, main

    if _options.child:
        child(_options.child[0], int(_options.child[1]))
    else:
        main(_options)
    sys.exit(0)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
# one key prefix for this run, shared with the worker and the children through the environment
os.environ.setdefault("REACTOR_KEY_PREFIX", f"bench-{uuid.uuid4().hex[:8]}")

import django  # noqa: E402

django.setup()

from bench import _support  # noqa: E402
from reactor_app import Reactor, Step, Success, element, from_input, map_step, step  # noqa: E402

#: the random part of a result: ~200 bytes of JSON per result, as in issue 32's measurements.
#: Random, not a repeated character: PostgreSQL compresses large values (TOAST), and a
#: context of identical fillers would shrink to almost nothing and hide what is written.
FILLER_BYTES = 72


class Unit(Step):
    """One unit of work: returns a ~200-byte dict and does nothing else."""

    inputs = ("item",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        filler = os.urandom(FILLER_BYTES).hex()
        return Success({"item": args["item"], "status": "done", "filler": filler})


class GrowthMap(Reactor):
    """``map_step`` over the ``items`` input."""

    inputs = ("items",)
    units = map_step(Unit, over=from_input("items"), item=element())


def steps_reactor_name(size: int) -> str:
    return f"GrowthSteps{size}"


def _define_steps_reactor(size: int) -> type[Reactor]:
    """A reactor of ``size`` independent steps, defined at module level (workers import it)."""
    name = steps_reactor_name(size)
    attributes: dict[str, Any] = {
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": f"{size} independent steps.",
        "inputs": ("run",),
    }
    for index in range(size):
        attributes[f"s{index:04d}"] = step(Unit, item=from_input("run"))
    return type(name, (Reactor,), attributes)


for _size in sorted({int(s) for s in os.environ.get(STEPS_ENV, "").split(",") if s.strip()}):
    globals()[steps_reactor_name(_size)] = _define_steps_reactor(_size)


def reactor_and_inputs(kind: str, size: int) -> tuple[type[Reactor], dict[str, Any]]:
    if kind == "map":
        return GrowthMap, {"items": list(range(size))}
    return globals()[steps_reactor_name(size)], {"run": uuid.uuid4().hex[:8]}


# --------------------------------------------------------------------------------------------
# one case


def child(kind: str, size: int) -> None:
    """An in-process case in this (child) process, driven over stdin/stdout: a warm-up run,
    "ready", then (after the parent's snapshot and its "go") the timed run and one line of JSON
    with its figures."""
    warm_up()
    print("ready", flush=True)
    sys.stdin.readline()
    reactor, inputs = reactor_and_inputs(kind, size)
    wrote = _support.process_writes([os.getpid()])
    started = time.perf_counter()
    result = reactor.run(**inputs)
    seconds = time.perf_counter() - started
    wrote = _support.process_writes([os.getpid()]) - wrote
    figures = {"seconds": seconds, "status": result.status, "id": str(result.execution_id),
               "process_writes": wrote}  # fmt: skip
    print(json.dumps(figures), flush=True)


def warm_up() -> None:
    """One untimed small run: imports, connections and caches of this process or the worker's
    (so the smallest size, the peer, is not charged with them)."""
    result = GrowthMap.run(items=[0])
    from reactor_app.models import Execution

    Execution.objects.filter(pk=result.execution_id).delete()


def run_in_process(kind: str, size: int, budget: float) -> dict[str, Any]:
    """The case in a child process; the snapshot is taken once the child has warmed up."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", kind, str(size)]
    process = subprocess.Popen(
        command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdin is not None and process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        process.kill()
        raise SystemExit(f"the in-process {kind} {size} child failed to start")
    before = _support.snapshot()
    process.stdin.write("go\n")
    process.stdin.flush()
    # the figures line, within the budget (the child's exit afterwards is not part of the case)
    readable, _, _ = select.select([process.stdout], [], [], budget)
    if not readable:
        after = _support.snapshot()
        process.kill()
        process.wait()
        from reactor_app.models import Execution

        reactor, _ = reactor_and_inputs(kind, size)
        row = Execution.objects.filter(reactor=reactor.path()).order_by("-created_at").first()
        return {"finished": False, "before": before, "after": after,
                "id": str(row.pk) if row else None}  # fmt: skip
    line = process.stdout.readline()
    process.stdin.close()
    code = process.wait()
    if code != 0 or not line.strip():
        raise SystemExit(f"the in-process {kind} {size} child failed (exit {code})")
    return {"finished": True, "before": before, **json.loads(line)}


def run_on_worker(kind: str, size: int, budget: float, worker: Any) -> dict[str, Any]:
    from reactor_app.models import Execution

    reactor, inputs = reactor_and_inputs(kind, size)
    group = _support.process_group(worker.pid)
    before = _support.snapshot()
    wrote = _support.process_writes(group)
    started = time.perf_counter()
    execution = reactor.run_async(**inputs)
    terminal = {"succeeded", "failed", "halted", "cancelled"}
    while True:
        status = Execution.objects.filter(pk=execution.pk).values_list("status", flat=True)[0]
        if status in terminal:
            break
        if time.perf_counter() - started > budget:
            return {"finished": False, "id": str(execution.pk), "before": before,
                    "after": _support.snapshot()}  # fmt: skip
        time.sleep(0.02)
    seconds = time.perf_counter() - started
    settle(str(execution.pk))
    return {"finished": True, "seconds": seconds, "status": status, "id": str(execution.pk),
            "before": before, "process_writes": _support.process_writes(group) - wrote}  # fmt: skip


def settle(execution_id: str) -> None:
    """Wait until the execution's history rows stop arriving (they are written behind)."""
    from reactor_app.models import CoordinationEvent, StepRun

    last, stable_since = -1, time.monotonic()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        count = (
            StepRun.objects.filter(execution_id=execution_id).count()
            + CoordinationEvent.objects.filter(execution_id=execution_id).count()
        )
        if count != last:
            last, stable_since = count, time.monotonic()
        elif time.monotonic() - stable_since > 0.5:
            return
        time.sleep(0.1)


def kept(execution_id: str) -> tuple[int, int]:
    """The execution's state as JSON (bytes: its context with its progress rows applied) and
    its number of step-run rows."""
    from reactor_app.engine.progress import stored_context
    from reactor_app.models import Execution, StepRun

    row = Execution.objects.filter(pk=execution_id).first()
    context = stored_context(row) if row is not None else None
    runs = StepRun.objects.filter(execution_id=execution_id).count()
    return len(json.dumps(context).encode()), runs


# --------------------------------------------------------------------------------------------
# the run


def main(options: argparse.Namespace) -> None:
    from django.core.management import call_command

    from reactor_app.conf import reactor_settings
    from reactor_app.coordination.redis import get_client
    from reactor_app.models import Execution

    call_command("migrate", verbosity=0)
    sizes: dict[str, list[int]] = options.size_table
    worker = start_worker(options.processes) if "worker" in options.mode_list else None
    print(
        f"growth: db {_support.backend()}, redis {get_client().info('server')['redis_version']}, "
        f"worker {options.processes} processes, budget {options.max_seconds:g} s per case, "
        f"sizes {sizes}"
    )
    print(
        "| workload | mode | N | run | total s | ms/unit | vs smallest | "
        f"{_support.wal_label()}/unit | vs smallest | {_support.tables_label()}/unit | "
        "context at end | step runs |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    reactors = [GrowthMap.path()] + [
        globals()[steps_reactor_name(s)].path() for s in sizes["steps"]
    ]
    try:
        for kind in ("map", "steps"):
            for mode in options.mode_list:
                worker = run_series(kind, mode, sizes[kind], options, worker, reactors)
    finally:
        if worker is not None:
            worker.stop()
        Execution.objects.filter(reactor__in=reactors).delete()
        client = get_client()
        names = list(client.scan_iter(match=f"{reactor_settings.KEY_PREFIX}:*", count=500))
        if names:
            client.unlink(*names)
    print(
        "target: the largest map's ms/unit <= 1.5x the 10-element map's (in-process and on a "
        "worker); bytes per unit constant"
    )


def run_series(
    kind: str,
    mode: str,
    sizes: list[int],
    options: argparse.Namespace,
    worker: Any,
    reactors: list[str],
) -> Any:
    """Every size of one workload in one mode, smallest first (the peer of the others); past
    the budget, the larger sizes are skipped. Returns the worker (restarted after a stop)."""
    from django.db import connection

    from reactor_app.models import Execution

    peer: dict[str, float] | None = None
    stopped_at: int | None = None
    for size in sizes:
        for repetition in range(1, options.repeat + 1):
            label = f"| {kind} | {mode} | {size:,} | {repetition} |"
            if stopped_at is not None:
                print(
                    f"{label} skipped: {stopped_at:,} did not finish in {options.max_seconds:g} s |"
                )
                continue
            connection.close()
            if mode == "in-process":
                figures = run_in_process(kind, size, options.max_seconds)
            else:
                figures = run_on_worker(kind, size, options.max_seconds, worker)
            if not figures["finished"]:
                print(f"{label} {unfinished(figures, options.max_seconds, peer)}", flush=True)
                stopped_at = size
                if mode == "worker":
                    worker = restart_worker(worker, figures.get("id"), options)
                Execution.objects.filter(reactor__in=reactors).delete()
                continue
            per_unit, row = report(figures, size, peer)
            peer = peer or per_unit
            print(f"{label} {row}", flush=True)
            Execution.objects.filter(pk=figures["id"]).delete()
    return worker


def unfinished(figures: dict[str, Any], budget: float, peer: dict[str, float] | None) -> str:
    """A case stopped at its budget: how far it got, and its figures per unit done so far (the
    units counted from its step-run rows, which a stopped process may not all have written)."""
    from reactor_app.models import StepRun

    done = StepRun.objects.filter(execution_id=figures["id"]).count() if figures["id"] else 0
    message = f"did not finish in {budget:g} s"
    if not done:
        return f"{message} |"
    wrote = _support.written(figures["before"], figures["after"])
    per_unit = {"seconds": budget / done, "wal": wrote.wal / done}
    peer = peer or per_unit
    logged = "" if _support.backend() != "postgresql" else (
        f", {_support.human(per_unit['wal'])} WAL/unit "
        f"({ratio(per_unit['wal'], peer['wal'])})"
    )  # fmt: skip
    return (
        f"{message}: {done:,} units done, {1000 * per_unit['seconds']:.2f} ms/unit "
        f"({ratio(per_unit['seconds'], peer['seconds'])}){logged} so far |"
    )


def report(
    figures: dict[str, Any], size: int, peer: dict[str, float] | None
) -> tuple[dict[str, float], str]:
    """A finished case's per-unit figures and the rest of its table row."""
    settle(figures["id"])
    wrote = _support.written(figures["before"], _support.snapshot())
    context_bytes, step_runs = kept(figures["id"])
    # SQLite: what the processes passed to write calls (its -wal file rewinds at checkpoints)
    logged = wrote.wal if _support.backend() == "postgresql" else figures["process_writes"]
    per_unit = {"seconds": figures["seconds"] / size, "wal": logged / size}
    peer = peer or per_unit
    status = "" if figures["status"] == "succeeded" else f" status {figures['status']}"
    row = (
        f"{figures['seconds']:.2f} | {1000 * per_unit['seconds']:.2f} | "
        f"{ratio(per_unit['seconds'], peer['seconds'])} | {_support.human(per_unit['wal'])} | "
        f"{ratio(per_unit['wal'], peer['wal'])} | {_support.human(wrote.tables / size)} | "
        f"{_support.human(context_bytes)} | {step_runs:,} |{status}"
    )
    return per_unit, row


def ratio(value: float, peer: float) -> str:
    return f"{value / peer:.2f}x" if peer > 0 else "-"


def start_worker(processes: int) -> Any:
    from bench._support import BenchWorker
    from reactor_app.conf import reactor_settings

    worker = BenchWorker("bench.growth", queue=reactor_settings.CELERY_QUEUE, concurrency=processes)
    worker.start()
    # one untimed delivery: the worker processes' imports, connections and caches
    GrowthMap.run_async(items=[0]).wait(timeout=120)
    return worker


def restart_worker(worker: Any, execution_id: str | None, options: argparse.Namespace) -> Any:
    """A delivery past its budget: cancel it, stop the worker hard, drop its queued work."""
    from demo_project.celery import app
    from reactor_app.models import Execution

    if execution_id is not None:
        row = Execution.objects.filter(pk=execution_id).first()
        if row is not None and not row.is_terminal:
            try:
                row.cancel("growth benchmark: past its budget")
            except Exception as error:  # report and carry on: the row is deleted next
                print(f"(cancelling {execution_id} failed: {error})")
    worker.stop(timeout=2)
    app.control.purge()
    return start_worker(options.processes)
