"""What the growth and worker-throughput benchmarks share: a real worker and the bytes written.

* ``BenchWorker`` — ``reactor_app.testing.workers.WorkerProcess`` (the one way the project
  starts a real Celery worker) that also imports a benchmark module (``-I``), so the plain
  Celery tasks a benchmark defines as its peers are registered in the worker too.
* ``cpu_snapshot`` / ``cpu_used`` — the CPU time the processes doing a workload's work spent
  on it, grouped (the benchmark, the worker, PostgreSQL, Redis), and the whole machine's.
* ``Written`` — what the configured database has written between two snapshots:

  - PostgreSQL: WAL bytes (``pg_wal_lsn_diff`` of ``pg_current_wal_lsn()``; the WAL is the
    server's, so other databases' traffic on a shared server lands in it too) and the growth
    of the on-disk size of the project's tables (heap, TOAST and indexes of ``reactor_app_*``
    and ``django_celery_results_*``, this database only).
  - SQLite: the growth of the database file, and the bytes the processes that ran the work
    passed to write calls (``process_writes``): SQLite rewinds its ``-wal`` file after each
    checkpoint, so that file's size says little about what went through it.

Imported by the benchmarks after ``django.setup()``. Not a test: the benchmarks print figures.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import connection

from reactor_app.testing.workers import WorkerProcess, settings_environment

ROOT = Path(__file__).resolve().parents[1]


class BenchWorker(WorkerProcess):
    """A ``-A demo_project`` worker that also imports ``include`` (a module of ``bench``)."""

    def __init__(
        self,
        include: str,
        *,
        queue: str,
        concurrency: int,
        overrides: Mapping[str, Any] | None = None,
    ) -> None:
        """``overrides``: settings the worker runs with on top of the project's (its
        ``REACTOR_*`` tuning, ``reactor_app.testing.workers.settings_environment``)."""
        env = dict(os.environ)
        if overrides:
            env = settings_environment(overrides, env=env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        super().__init__(
            "demo_project",
            queues=(queue,),
            concurrency=concurrency,
            env=env,
            cwd=ROOT,
        )
        self.include = include

    def command(self) -> list[str]:
        return [*super().command(), "-I", self.include]


def backend() -> str:
    return str(connection.vendor)


@dataclass(frozen=True)
class Snapshot:
    wal: int  # PostgreSQL: the WAL position in bytes; SQLite: the -wal file's size
    tables: int  # PostgreSQL: the project's tables on disk; SQLite: the database file's size


_TABLES_SQL = """
    SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind = 'r' AND n.nspname = current_schema()
      AND (c.relname LIKE 'reactor_app%%' OR c.relname LIKE 'django_celery_results%%')
"""


def snapshot() -> Snapshot:
    if backend() == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")
            wal = int(cursor.fetchone()[0])
            cursor.execute(_TABLES_SQL)
            tables = int(cursor.fetchone()[0])
        return Snapshot(wal=wal, tables=tables)
    path = Path(str(connection.settings_dict["NAME"]))
    wal_path = path.with_name(path.name + "-wal")
    return Snapshot(
        wal=wal_path.stat().st_size if wal_path.exists() else 0,
        tables=path.stat().st_size if path.exists() else 0,
    )


def written(before: Snapshot, after: Snapshot) -> Snapshot:
    """Bytes written between two snapshots (the table/file growth may be negative: vacuum)."""
    return Snapshot(wal=after.wal - before.wal, tables=after.tables - before.tables)


def wal_label() -> str:
    return "WAL (server-wide)" if backend() == "postgresql" else "bytes to write()"


def process_group(leader: int | None) -> list[int]:
    """The processes of ``leader``'s process group (a worker's parent and its children)."""
    if leader is None:
        return []
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == leader:  # the field after state and ppid: pgrp
                members.append(int(entry.name))
    return members


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU seconds (user + system) spent so far by each process of interest, by pid, with
    its group, and by the whole machine (``cpu_snapshot``)."""

    processes: dict[int, tuple[str, float]]
    machine: float


def cpu_snapshot(worker: list[int]) -> CpuSnapshot:
    """This process (group ``benchmark``), the ``worker`` processes, and PostgreSQL's and
    Redis's server processes on this machine (by command name: other databases' traffic on a
    shared server counts too); ``machine`` is every CPU's busy time (/proc/stat, all but idle
    and I/O wait). Linux only: empty where /proc is not readable."""
    ticks = os.sysconf("SC_CLK_TCK")
    members = set(worker)
    processes: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name, rest = (entry / "stat").read_text().split("(", 1)[1].rsplit(")", 1)
        except OSError:
            continue
        pid = int(entry.name)
        if pid == os.getpid():
            group = "benchmark"
        elif pid in members:
            group = "worker"
        elif name == "postgres":
            group = "postgres"
        elif name.startswith("redis-server"):
            group = "redis"
        else:
            continue
        fields = rest.split()
        processes[pid] = (group, (int(fields[11]) + int(fields[12])) / ticks)  # utime, stime
    try:
        times = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return CpuSnapshot({}, 0.0)
    return CpuSnapshot(processes, (sum(times) - times[3] - times[4]) / ticks)


def cpu_used(before: CpuSnapshot, after: CpuSnapshot) -> dict[str, float]:
    """CPU seconds per group between two snapshots: a process that started in between counts
    from zero; one that exited in between is missed (its last seconds too), which the
    ``machine`` figure is not."""
    used = {"benchmark": 0.0, "worker": 0.0, "postgres": 0.0, "redis": 0.0}
    for pid, (group, seconds) in after.processes.items():
        earlier = before.processes.get(pid)
        used[group] += seconds - (earlier[1] if earlier and earlier[0] == group else 0.0)
    used["machine"] = after.machine - before.machine
    return used


def process_writes(pids: list[int]) -> int:
    """Bytes the processes have passed to write calls so far (``wchar`` of /proc/<pid>/io):
    with SQLite that is the database and its WAL, plus the processes' small log and pipe
    writes. Linux only; 0 where /proc is not readable."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/io").read_text().splitlines():
                if line.startswith("wchar:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def tables_label() -> str:
    return "table growth" if backend() == "postgresql" else "db file growth"


def human(count: float) -> str:
    """Bytes as B / kB / MB (powers of 1000, as the docs' tables)."""
    for unit, size in (("MB", 1e6), ("kB", 1e3)):
        if abs(count) >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count:.0f} B"


def measure(
    contenders: list[tuple[str, Callable[[], None]]],
    iterations: int,
    block: int = 100,
    warm_up: int = 200,
    seed: int | None = None,
) -> list[dict[str, Any]]:
    """Latency of each contender, in µs. They run interleaved in blocks of ``block`` so that
    background load on the machine falls on all of them alike.

    With ``seed``, the blocks of each round run in a new random order, and each row also has
    ``per_block``: the median over rounds of its block's median divided by the first
    contender's (the peer's) in the same round. Why: on a virtual machine a round trip costs
    far less while a core is busy than when the reply must wake one, and a block runs partly in
    what the block before it left running; in a fixed order one contender can be handed one
    mode every round (docs/benchmarks.md, "The order of the blocks"). A round's blocks run
    milliseconds apart, so their ratio is the steadier figure."""
    for _, iteration in contenders:
        for _ in range(warm_up):
            iteration()
    samples: dict[str, list[int]] = {label: [] for label, _ in contenders}
    rounds: list[dict[str, float]] = []  # each round's block medians (µs)
    order = random.Random(seed)
    done = 0
    while done < iterations:
        size = min(block, iterations - done)
        this_round = list(contenders)
        if seed is not None:
            order.shuffle(this_round)
        medians: dict[str, float] = {}
        for label, iteration in this_round:
            taken = []
            for _ in range(size):
                started = time.perf_counter_ns()
                iteration()
                taken.append(time.perf_counter_ns() - started)
            samples[label] += taken
            medians[label] = statistics.median(taken) / 1000
        rounds.append(medians)
        done += size
    peer = contenders[0][0]
    rows = []
    for label, _ in contenders:
        micros = sorted(ns / 1000 for ns in samples[label])
        rows.append(
            {
                "label": label,
                "p50": micros[len(micros) // 2],
                "p99": micros[min(len(micros) - 1, int(len(micros) * 0.99))],
                "mean": statistics.fmean(micros),
                "per_block": statistics.median(r[label] / r[peer] for r in rounds),
            }
        )
    return rows
