"""Helpers of the fault schedules (``test_fault_histories``): clients of the five primitives
recording their operations, on threads or forked processes, the checker's verdict per
primitive, and the servers the schedules break (one restarted empty; a cluster with replicas).

Each primitive runs ``tests.linearizability.workloads.hold_loop`` with the library's own client
(``Coordinator.admit`` / ``release``) on a key of its own, with short leases so that holders
killed or paused by a schedule are outlived (and passed over) within the run:

===========  ==================================================  ==========================
primitive    claim                                               model
===========  ==================================================  ==========================
lock         ``LockClaim(ttl=LEASE, auto_extend=False)``         mutex, fencing tokens
semaphore    ``SemaphoreClaim(limit=2, ttl=LEASE)``              2-slot semaphore
rate_limit   ``RateLimitClaim`` 3 per 0.5 s sliding window      sliding window
period       ``PeriodClaim(every=2 s, ttl=LEASE)``               one success per bucket
ordered      ``OrderedLockClaim`` (poison pill = LEASE)          mutex, positions in order
===========  ==================================================  ==========================
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from reactor_app.coordination.admission import Coordinator
from reactor_app.testing.history import CLOCK, History, Operation, load, operations
from reactor_app.testing.linearizability import CheckResult, Model, check
from reactor_app.testing.redis_processes import BUS_OFFSET, START_TIMEOUT, wait_until
from reactor_app.testing.sequential_models import (
    MutexModel,
    PeriodModel,
    RateLimitModel,
    SemaphoreModel,
)
from reactor_app.testing.servers import (
    RedisClusterServers,
    ServerBinaryMissing,
    StandaloneServer,
    free_port,
)
from tests.linearizability.clients import (
    CoordinatorLock,
    CoordinatorOrderedLock,
    CoordinatorPeriod,
    CoordinatorRateLimit,
    CoordinatorSemaphore,
)
from tests.linearizability.workloads import hold_loop, settled_buckets

#: seconds every schedule runs: a few in ``make test``, long under ``make soak``
SOAK = float(os.environ.get("REACTOR_FAULT_SOAK_SECONDS", "0") or 0)
#: lease seconds of the schedules' holds: short, so killed and paused holders are outlived
LEASE = 0.5
#: the period's buckets (epoch-aligned seconds): several per run
PERIOD = 2
#: seconds after which a client moves on to a new key: a long (soak) run is checked as many
#: short histories, which the search holds in memory one at a time
ROTATE = 20.0


def clients(coordinator: Callable[[], Coordinator]) -> dict[str, Any]:
    """The five primitives' clients on ``coordinator()``'s store."""
    return {
        "lock": CoordinatorLock(ttl=LEASE, coordinator=coordinator()),
        "semaphore": CoordinatorSemaphore(ttl=LEASE, limit=2, coordinator=coordinator()),
        "rate_limit": CoordinatorRateLimit(window=0.5, limit=3, coordinator=coordinator()),
        "period": CoordinatorPeriod(ttl=LEASE, every=PERIOD, coordinator=coordinator()),
        "ordered": CoordinatorOrderedLock(ttl=LEASE, poison_pill=LEASE, coordinator=coordinator()),
    }


MODELS: dict[str, Model] = {
    "lock": MutexModel(),
    "semaphore": SemaphoreModel(limit=2),
    "rate_limit": RateLimitModel(),
    "period": PeriodModel(),
    # a line restarted empty starts its positions again: only tokens survive lost state
    "ordered": MutexModel(name="ordered lock", order_field="position", order_survives_loss=False),
}

PRIMITIVES = tuple(MODELS)


def key_for(primitive: str, schedule: str) -> str:
    return f"{primitive}:{schedule}"


def verdicts(ops: list[Operation], schedule: str) -> dict[str, CheckResult]:
    """Each primitive's operations (by their key's stem) checked against its model — recorded
    under a ``ClockWatch`` (``assert_watched``)."""
    assert_watched(ops)
    results = {}
    for primitive, model in MODELS.items():
        stem = key_for(primitive, schedule)
        mine = [o for o in ops if o.key is None or o.key.split("@")[0].split("#")[0] == stem]
        results[primitive] = check(settled_buckets(mine), model)
    return results


def assert_watched(ops: list[Operation]) -> None:
    """Every fault schedule is recorded under a ``ClockWatch``: a step of the wall clock the
    leases lapse on is then allowed for, and said (docs/testing.md, "The server's clock")."""
    watches = [o for o in ops if o.key is None and o.f == CLOCK]
    assert len(watches) == 1 and watches[0].status == "ok", watches


def report(schedule: str, results: dict[str, CheckResult]) -> str:
    """One line per primitive: operations checked (recorded), keys, violations."""
    lines = [f"fault schedule {schedule!r}:"]
    for primitive, result in results.items():
        lines.append(f"  {primitive:<10} {result.summary()}")
        lines += [str(v) for v in result.violations]
    return "\n".join(lines)


#: a period admits one success per 2-second bucket and only settled buckets are checked, so a
#: short schedule on a loaded machine may settle only two of them
LEAST_CHECKED = {"period": 2}


def assert_no_violation(schedule: str, results: dict[str, CheckResult], least: int = 5) -> None:
    text = report(schedule, results)
    print(text)
    for primitive, result in results.items():
        assert result.valid, text
        floor = min(least, LEAST_CHECKED.get(primitive, least))
        assert result.checked >= floor, f"{primitive}: too few operations\n{text}"


# -- processes ---------------------------------------------------------------------------------


def child_loop(primitive: str, schedule: str, process: str, path: str, duration: float) -> None:
    """A forked client: ``hold_loop`` of ``primitive`` recording into the file ``path``."""
    client = clients(Coordinator)[primitive]
    history = History(path)
    hold_loop(
        client,
        history,
        key_for(primitive, schedule),
        process,
        duration=duration,
        hold=(0.0, LEASE / 5),
        failures=0.2,
        seed=os.getpid(),
        rotate_every=ROTATE,
    )
    os._exit(0)  # no atexit handlers of the parent's (its test database, its servers)


class Children:
    """Forked clients, started, killed, paused and resumed by pid."""

    def __init__(self, schedule: str, path: Path, duration: float) -> None:
        self.schedule, self.path, self.duration = schedule, str(path), duration
        self.context = multiprocessing.get_context("fork")
        self.running: dict[str, Any] = {}
        self.started = 0

    def spawn(self, primitive: str, duration: float | None = None) -> str:
        name = f"{primitive}-p{self.started}"
        self.started += 1
        seconds = self.duration if duration is None else duration
        process = self.context.Process(
            target=child_loop, args=(primitive, self.schedule, name, self.path, seconds)
        )
        process.start()
        self.running[name] = process
        return name

    def kill(self, name: str) -> None:
        process = self.running.pop(name)
        os.kill(process.pid, signal.SIGKILL)
        process.join(10)

    def pause(self, name: str) -> None:
        os.kill(self.running[name].pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        os.kill(self.running[name].pid, signal.SIGCONT)

    def join(self, timeout: float) -> None:
        for process in self.running.values():
            process.join(timeout)

    def stop_all(self) -> None:
        for process in self.running.values():
            if process.is_alive():
                os.kill(process.pid, signal.SIGCONT)
                os.kill(process.pid, signal.SIGKILL)
                process.join(10)

    def operations(self) -> list[Operation]:
        return operations(load(self.path))


# -- servers the schedules break ------------------------------------------------------------

#: servers of any kind (``StandaloneServer``, ``SentinelServers``, a cluster)
S = TypeVar("S")


@contextmanager
def running(make: Callable[[], S]) -> Iterator[S]:
    """Servers the schedule breaks, started here (``make()``: not started yet) on free
    loopback ports and stopped by their pids afterwards; a machine without ``redis-server``
    skips the test with the reason."""
    try:
        servers = make().start()
    except ServerBinaryMissing as missing:
        pytest.skip(str(missing))
    try:
        yield servers
    finally:
        servers.stop()


class RestartableServer(StandaloneServer):
    """A plain server that can be SIGKILLed and started again, empty, on the same port."""

    def restart_empty(self, down: float = 0.0) -> None:
        """SIGKILL the server and start an empty one on its port, ``down`` seconds later (a
        window in which every client call meets a refused connection)."""
        port = self.port
        self.servers[0].kill()
        self.servers.pop(0)
        time.sleep(down)
        self._await_ping(self._spawn(port, self._common(port), f"standalone-{port}-again"))


class ClusterWithReplicas(RedisClusterServers):
    """A private 3-master cluster (the session's shared one must not lose a master) with one
    replica per master, joined by ``CLUSTER MEET`` and ``CLUSTER REPLICATE``."""

    replica_of: dict[int, int]  # replica port -> its master's port

    def add_replicas(self) -> ClusterWithReplicas:
        self.replica_of = {}
        for master in list(self.servers):
            taken = [p for s in self.servers for p in (s.port, s.port + BUS_OFFSET)]
            port = free_port(with_bus=True, taken=taken)
            args = [
                *self._common(port),
                *("--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"),
                *("--cluster-node-timeout", str(self.node_timeout_ms)),
            ]
            self._await_ping(self._spawn(port, args, f"replica-{port}"))
            self._client(master.port).execute_command("CLUSTER", "MEET", "127.0.0.1", port)
            master_id = self._client(master.port).execute_command("CLUSTER", "MYID")

            def knows_master(port: int = port, master_id: str = master_id) -> bool:
                return master_id in str(self._client(port).execute_command("CLUSTER", "NODES"))

            wait_until(knows_master, START_TIMEOUT, "the replica to learn of its master")
            self._client(port).execute_command("CLUSTER", "REPLICATE", master_id)

            def synced(port: int = port) -> bool:
                info = self._client(port).info("replication")
                return bool(info.get("master_link_status") == "up")

            wait_until(synced, START_TIMEOUT, "the replica to sync")
            self.replica_of[port] = master.port
        return self

    def kill_busiest_master(self, prefix: str) -> tuple[int, int]:
        """SIGKILL the master holding the most keys under ``prefix``; (its port, its
        replica's)."""

        def keys(port: int) -> int:
            return sum(1 for _ in self._client(port).scan_iter(match=f"{prefix}*", count=500))

        busiest = max(self.replica_of.values(), key=keys)
        replica = next(r for r, m in self.replica_of.items() if m == busiest)
        next(s for s in self.servers if s.port == busiest).kill()
        return busiest, replica

    def wait_promoted(self, replica: int, timeout: float = 30.0) -> None:
        def promoted() -> bool:
            return bool(self._client(replica).info("replication").get("role") == "master")

        wait_until(promoted, timeout, "the cluster to promote the replica")
