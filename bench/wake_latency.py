"""Wake latency: a parked execution, woken by a release, from the release to its body's start.

One real Celery worker (prefork, ``--processes`` processes, the demo project's broker), idle
but for the two executions of a round:

1. a **holder** execution takes a lock in its one step and blocks in its body until the
   benchmark lets it go (a Redis key it polls);
2. a **waiter** execution of the same reactor meets the held key and parks — at once
   (``REACTOR_WORKER_WAIT = 0``), or with ``--worker-wait 1`` after waiting in its delivery
   for that long, as by default — with a 20 s backoff, so nothing but the release can bring it
   back within the round; once its parking delivery has ended and the worker is idle,
3. the holder is let go; its release wakes the waiter (``engine.enqueueing.wake``).

Timestamps (``time.time_ns``, one machine) along the way, noted in memory by hooks this module
installs in the worker (it is imported there with ``-I``, before the pool forks) and written
to Redis at the ends of the path, so that no point adds a round trip to the path it measures:

* ``released`` — the holder's release script returned (``Coordinator.release``);
* ``sent`` — the wake's broker message was sent (``engine.enqueueing.enqueue`` returned);
* ``received`` — a pool process starts the task (Celery's ``task_prerun``);
* ``deliver`` — ``engine.delivery.deliver`` starts;
* ``loaded`` — the row was read (the execution claim is being built);
* ``claim`` — the execution claim (Redis) is taken;
* ``claimed`` — the claim statement (``UPDATE ... RETURNING``) returned: the pass starts;
* ``gate`` — the locked step's gate is entered (the pass marked the row running, read the
  cancel flag, recorded the step's start);
* ``admitted`` — the gate admitted the woken execution (``Gate._admitted``);
* ``body`` — its step body starts.

With ``BENCH_PROFILE=1`` in the environment each woken pass is also profiled (``cProfile``)
from ``claimed`` to its body, one ``wake-<execution id>.prof`` file each in the temporary
directory.

The **peer**, in alternate rounds of the same run: the holder has no waiter, and the same hook
sends a plain Celery task (``bench.wake_ping``, a body that records its start) at the moment
the wake would have been sent — the broker → pool part of the path with nothing of ours in
it. Both are measured from ``released``.

    python bench/wake_latency.py [--rounds 40] [--processes 2] [--worker-wait 0]

It uses the demo project's settings (``DATABASE_URL`` / ``REDIS_URL`` when set, else SQLite and
the embedded Redis) through ``reactor_app.testing.worker_settings`` (the settings above are
applied to the worker and this process alike), migrates that database, starts its own worker
on a queue of its own, uses a fresh key prefix, and deletes its executions afterwards. Not a
test: it prints figures; docs/benchmarks.md ("Wake latency") records them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if __name__ == "__main__":
    # the settings are read at import (here and in the worker): the one option they depend on
    if "--worker-wait" in sys.argv[:-1]:
        os.environ["BENCH_WORKER_WAIT"] = sys.argv[sys.argv.index("--worker-wait") + 1]
    # Run as the module the worker imports (-I bench.wake_latency): the reactor, the peer task
    # and the hooks are defined once, under the names the worker knows.
    from bench.wake_latency import main

    main()
    sys.exit(0)

#: what the worker and this process run with: a parked waiter comes back only when woken
SETTINGS = {
    "REACTOR_WORKER_WAIT": float(os.environ.get("BENCH_WORKER_WAIT", "0")),
    "REACTOR_CONTENTION_BACKOFF": [20.0, 40.0],
    "REACTOR_CELERY_QUEUE": "bench-wake",
    "CELERY_TASK_DEFAULT_QUEUE": "bench-wake",
}
os.environ.setdefault("REACTOR_TEST_BASE_SETTINGS", "demo_project.settings")
os.environ.setdefault("REACTOR_TEST_SETTINGS", json.dumps(SETTINGS))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reactor_app.testing.worker_settings")
# one key prefix for this run, shared with the worker through the environment
os.environ.setdefault("REACTOR_KEY_PREFIX", f"bench-{uuid.uuid4().hex[:8]}")

import django  # noqa: E402

django.setup()

from celery import shared_task  # noqa: E402
from celery.signals import task_prerun  # noqa: E402

from reactor_app import Reactor, Step, Success, from_input, step, with_lock  # noqa: E402
from reactor_app.conf import reactor_settings  # noqa: E402
from reactor_app.coordination.admission import Coordinator  # noqa: E402
from reactor_app.coordination.redis import get_client  # noqa: E402
from reactor_app.engine import claim as claim_module  # noqa: E402
from reactor_app.engine import delivery, enqueueing, gate  # noqa: E402

#: the points of one round, in path order
POINTS = (
    "released",
    "sent",
    "received",
    "deliver",
    "loaded",
    "claim",
    "claimed",
    "gate",
    "admitted",
    "body",
)


def stamps_key(execution_id: str) -> str:
    return f"{reactor_settings.KEY_PREFIX}:bench:stamps:{execution_id}"


def go_key(execution_id: str) -> str:
    return f"{reactor_settings.KEY_PREFIX}:bench:go:{execution_id}"


def peer_key(execution_id: str) -> str:
    """Set for a peer round's holder: its release sends the plain task."""
    return f"{reactor_settings.KEY_PREFIX}:bench:peer:{execution_id}"


def ended_key() -> str:
    return f"{reactor_settings.KEY_PREFIX}:bench:ended"


#: points reached in this process, not yet written to Redis: a round trip per point would
#: lengthen the path it measures, so they are written at its ends (``flush``)
_pending: dict[str, dict[str, int]] = {}


def stamp(execution_id: Any, point: str, *, flush: bool = False) -> None:
    """Note the first time ``point`` was reached for ``execution_id``; ``flush``: write this
    execution's noted points to Redis now."""
    points = _pending.setdefault(str(execution_id), {})
    points.setdefault(point, time.time_ns())
    if flush:
        _pending.pop(str(execution_id))
        client = get_client()
        for name, at in points.items():
            client.hsetnx(stamps_key(str(execution_id)), name, at)


# --------------------------------------------------------------------------------------------
# the reactor: one step under a lock; the holder blocks until let go


PROFILE: list[Any] = []


class Critical(Step):
    inputs = ("account", "role")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        stamp(context.execution_id, "body", flush=True)
        if PROFILE:
            PROFILE[0].disable()
            PROFILE[0].dump_stats(
                os.path.join(tempfile.gettempdir(), f"wake-{context.execution_id}.prof")
            )
            PROFILE.clear()
        if args["role"] == "holder":
            client = get_client()
            while not client.lpop(go_key(context.execution_id)):
                time.sleep(0.001)  # not BLPOP: the client's socket timeout is shorter
        return Success(args["role"])


class WakeReactor(Reactor):
    inputs = ("account", "role")

    critical = step(
        with_lock(lambda a: f"wake-bench:{a['account']}", ttl=60)(Critical),
        account=from_input("account"),
        role=from_input("role"),
    )


@shared_task(name="bench.wake_ping")
def wake_ping(round_id: str) -> None:
    stamp(round_id, "body", flush=True)


# --------------------------------------------------------------------------------------------
# hooks in the worker (installed at import: the pool processes fork from the parent after it)

_release = Coordinator.release
_enqueue = enqueueing.enqueue
_run_pass = delivery._run_pass
_deliver = delivery.deliver
_admitted = gate.Gate._admitted
_enter = gate.Gate.enter
_claim_init = claim_module.ExecutionClaim.__init__
_claim_acquire = claim_module.ExecutionClaim.acquire


def _timed_claim_init(self: Any, execution_id: Any, owner: str, **kwargs: Any) -> None:
    stamp(execution_id, "loaded")
    _claim_init(self, execution_id, owner, **kwargs)
    self.bench_id = execution_id


def _timed_acquire(self: Any, wait: float = 0.0) -> bool:
    taken = _claim_acquire(self, wait)
    stamp(self.bench_id, "claim")
    return taken


def _timed_enter(self: gate.Gate, **kwargs: Any) -> Any:
    if self.scope.execution_id:
        stamp(self.scope.execution_id, "gate")
    return _enter(self, **kwargs)


def _timed_release(self: Coordinator, admitted: Any, outcome: Any, **kwargs: Any) -> Any:
    released = _release(self, admitted, outcome, **kwargs)
    holder = admitted.holder.execution_id
    if holder:
        # the holder's round is named by its execution; the woken waiter's stamps go under its
        # own id (the driver reads both)
        for waiter in [w for w in released.woken if not str(w).startswith("wait:")]:
            stamp(waiter, "released")
        if not released.woken and get_client().exists(peer_key(holder)):
            stamp(f"{holder}:peer", "released")
            wake_ping.apply_async(args=[f"{holder}:peer"], queue=reactor_settings.CELERY_QUEUE)
            stamp(f"{holder}:peer", "sent", flush=True)
    return released


def _timed_enqueue(execution_id: Any, **options: Any) -> None:
    _enqueue(execution_id, **options)
    if not options.get("countdown"):
        stamp(execution_id, "sent", flush=True)


def _timed_deliver(execution_id: str, **kwargs: Any) -> Any:
    stamp(execution_id, "deliver")
    return _deliver(execution_id, **kwargs)


def _timed_run_pass(execution: Any, claim: Any) -> Any:
    stamp(execution.id, "claimed")
    if execution.status != "parked" or not os.environ.get("BENCH_PROFILE"):
        return _run_pass(execution, claim)
    import cProfile

    profile = cProfile.Profile()
    PROFILE.append(profile)
    profile.enable()
    return _run_pass(execution, claim)


def _timed_admitted(self: gate.Gate, admitted: Any, **kwargs: Any) -> None:
    if self.scope.execution_id:
        stamp(self.scope.execution_id, "admitted")
    _admitted(self, admitted, **kwargs)


@task_prerun.connect
def _received(task: Any = None, args: Any = None, **_: Any) -> None:
    if task is not None and task.name in ("reactor_app.run_execution", "bench.wake_ping") and args:
        _pending.pop(str(args[0]), None)  # an earlier delivery's points, never flushed
        stamp(args[0], "received")


def _ended(task: Any = None, args: Any = None, **_: Any) -> None:
    if task is not None and task.name == "reactor_app.run_execution" and args:
        get_client().rpush(ended_key(), str(args[0]))


Coordinator.release = _timed_release  # type: ignore[method-assign]
enqueueing.enqueue = _timed_enqueue
delivery._run_pass = _timed_run_pass
delivery.deliver = _timed_deliver
gate.Gate._admitted = _timed_admitted  # type: ignore[method-assign]
gate.Gate.enter = _timed_enter  # type: ignore[method-assign]
claim_module.ExecutionClaim.__init__ = _timed_claim_init  # type: ignore[method-assign]
claim_module.ExecutionClaim.acquire = _timed_acquire  # type: ignore[method-assign]
from celery.signals import task_postrun  # noqa: E402

task_postrun.connect(_ended, weak=False)


# --------------------------------------------------------------------------------------------
# the driver


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.005)


def one_round(index: int, *, peer: bool, settle: float) -> dict[str, float] | None:
    """The latencies (ms from ``released``) of one round, or None when it went wrong."""
    from reactor_app.models import Execution

    client = get_client()
    account = f"{index}-{uuid.uuid4().hex[:6]}"
    holder = WakeReactor.run_async(account=account, role="holder")
    wait_for(lambda: client.hexists(stamps_key(str(holder.id)), "body"), 30, "holder body")
    if peer:
        client.set(peer_key(str(holder.id)), 1)
        subject = f"{holder.id}:peer"
    else:
        waiter = WakeReactor.run_async(account=account, role="waiter")
        subject = str(waiter.id)

        def parked() -> bool:
            ended = client.lrange(ended_key(), 0, -1)
            return subject in ended and Execution.objects.get(pk=subject).status == ("parked")

        wait_for(parked, 30, "waiter park")
        client.delete(stamps_key(subject))  # its first delivery's points: not this path
    time.sleep(settle)  # the worker idle: the parking delivery's last writes are done
    client.rpush(go_key(str(holder.id)), 1)
    wait_for(lambda: client.hexists(stamps_key(subject), "body"), 30, "woken body")
    raw = {str(k): int(v) for k, v in client.hgetall(stamps_key(subject)).items()}
    if "released" not in raw:
        return None
    return {p: (raw[p] - raw["released"]) / 1e6 for p in POINTS if p in raw}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="per kind (wake, peer)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--settle", type=float, default=0.1, help="idle seconds before release")
    parser.add_argument(
        "--worker-wait", type=float, default=0.0, help="REACTOR_WORKER_WAIT of the waiter"
    )
    options = parser.parse_args()

    from django.core.management import call_command

    from bench._support import BenchWorker, backend
    from reactor_app.models import Execution

    call_command("migrate", verbosity=0)
    worker = BenchWorker(
        "bench.wake_latency", queue=reactor_settings.CELERY_QUEUE, concurrency=options.processes
    ).start()
    results: dict[str, list[dict[str, float]]] = {"wake": [], "peer": []}
    try:
        print(
            f"{options.rounds} rounds per kind, {options.processes} worker processes, "
            f"REACTOR_WORKER_WAIT {reactor_settings.WORKER_WAIT:g} s "
            f"(db {backend()}, redis {get_client().info('server')['redis_version']})"
        )
        one_round(-1, peer=False, settle=options.settle)  # untimed: imports and connections
        one_round(-2, peer=True, settle=options.settle)
        for index in range(options.rounds * 2):
            kind = "peer" if index % 2 else "wake"
            measured = one_round(index, peer=kind == "peer", settle=options.settle)
            if measured is not None:
                results[kind].append(measured)
        print("| ms from the release | " + " | ".join(POINTS[1:]) + " |")
        print("|---|" + "---:|" * (len(POINTS) - 1))
        for kind, label in (("wake", "woken execution"), ("peer", "plain Celery task (peer)")):
            rows = results[kind]
            for name, q in (("p50", 0.5), ("p95", 0.95)):
                cells = []
                for point in POINTS[1:]:
                    values = sorted(r[point] for r in rows if point in r)
                    cells.append(f"{quantile(values, q):.1f}" if values else "-")
                print(f"| {label} {name} (n={len(rows)}) | " + " | ".join(cells) + " |")
        bodies = [r["body"] for r in results["wake"]]
        peers = [r["body"] for r in results["peer"]]
        if bodies and peers:
            print(
                f"release -> body p50: woken {statistics.median(bodies):.1f} ms, plain task "
                f"{statistics.median(peers):.1f} ms (target <= 20 ms)"
            )
    finally:
        worker.stop()
        Execution.objects.filter(reactor=WakeReactor.path()).delete()
        client = get_client()
        leftovers = list(client.scan_iter(match=f"{reactor_settings.KEY_PREFIX}:*", count=500))
        if leftovers:
            client.unlink(*leftovers)


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``values`` (nearest rank)."""
    return values[min(len(values) - 1, max(0, round(q * len(values) + 0.5) - 1))]
