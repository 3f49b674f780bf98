"""Hot path: what a caller waits for in ``Step.call`` and per step of ``Reactor.run``.

Side by side in one run, against the same Redis and database, interleaved in blocks (in a new
random order each round, ``--seed``: ``measure`` says why) so that background load falls on
every row alike, medians in µs:

* a redis-py ``Lock`` acquire + release pair — the peer every ratio is taken against;
* a Redis ``PING``, for scale: one round trip, which every blocking call of every row pays
  (on a virtual machine it includes waking a core that slept while waiting, and it is not the
  same from one run to the next: docs/benchmarks.md, "Round trips on the development VM");
* a locked no-op ``Step.call`` at the default settings (``REACTOR_TRACKING="full"``) and with
  ``REACTOR_TRACKING="executions"``;
* a five-primitive no-op ``Step.call``: lock + semaphore + two-window rate limit + period (a
  fresh period key per call, so it runs every time) + ordered lock;
* the marginal cost of one uncoordinated no-op step inside a ``Reactor.run``: a 10-step run
  against a 1-step run, divided by 9 — at the default settings, and with
  ``REACTOR_TRACKING_FLUSH_ON_FINISH = False`` (the run leaves its history to the writer).

    python bench/hot_path.py [--iterations 1000] [--seed 1]

It uses the settings of ``demo_project.settings``: ``DATABASE_URL`` / ``REDIS_URL`` when set,
else SQLite and the embedded Redis (run ``manage.py migrate`` first; ``make bench`` does).
Tracking rows are written behind the work by the writer thread, as in production; the figures
include whatever that thread takes from the caller (the GIL, the database). Keys live under a
fresh prefix and are deleted after; the rows it wrote are deleted too. Also printed: the Redis
server time per call (``INFO commandstats``: the commands each contender sends, a script
counted whole with the commands it runs, never those twice). Each ratio is printed twice: the
ratio of the overall medians, and in brackets the median of the ratios taken block by block
(each block's contenders run milliseconds apart, so a machine changing speed mid-run moves
both sides of a block's ratio alike). Not a test: it prints figures; docs/benchmarks.md
records them.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
# as in production: DEBUG off (Django's debug cursor logs and formats every statement)
os.environ.setdefault("DJANGO_DEBUG", "0")

import django

django.setup()

import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import override_settings  # noqa: E402

from reactor_app import (  # noqa: E402
    Reactor,
    Step,
    Success,
    step,
    with_lock,
    with_ordered_lock,
    with_period,
    with_rate_limit,
    with_semaphore,
)
from reactor_app.coordination.admission import Coordinator  # noqa: E402
from reactor_app.coordination.claims import Admitted, Holder, LockClaim  # noqa: E402
from reactor_app.coordination.redis import get_client, redis_url  # noqa: E402
from reactor_app.models import CoordinationEvent, Execution  # noqa: E402
from reactor_app.write_behind import flush, get_writer  # noqa: E402

WARM_UP = 100
_fresh = itertools.count()


Contender = tuple[str, Callable[[], None], Callable[[], Any] | None]


def measure(
    contenders: list[Contender], iterations: int, block: int = 50, seed: int = 1
) -> dict[str, list[float]]:
    """Samples (µs) of each contender, interleaved in blocks of ``block`` iterations, the
    contenders in a fresh random order each round (``seed``). A contender's ``context`` (e.g.
    ``override_settings``) is entered around each of its blocks, never around a single call,
    so its own cost is not measured.

    Why shuffled: a block runs partly in what the block before it left running — the tracking
    writer's flush, PostgreSQL finishing its commits — and on the development VM that decides
    whether a round trip costs ~30 µs or ~110 µs (a core kept busy never sleeps, so the reply
    need not wake it). In a fixed order the redis-py pair always followed the 10-step
    ``Reactor.run`` block and always ran in the fast mode; the same code measured in the
    reverse order gave the locked ``Step.call`` 1.36x instead of 3.15x (docs/benchmarks.md,
    "The order of the blocks"). A new order each round spreads that over every contender."""
    rng = random.Random(seed)

    def scoped(context: Callable[[], Any] | None) -> Any:
        return context() if context is not None else contextlib.nullcontext()

    for _, iteration, context in contenders:
        with scoped(context):
            for _ in range(WARM_UP):
                iteration()
    samples: dict[str, list[float]] = {label: [] for label, _, _ in contenders}
    done = 0
    while done < iterations:
        size = min(block, iterations - done)
        for label, iteration, context in rng.sample(contenders, len(contenders)):
            with scoped(context):
                for _ in range(size):
                    started = time.perf_counter_ns()
                    iteration()
                    samples[label].append((time.perf_counter_ns() - started) / 1000)
        done += size
    return samples


def p50(values: list[float]) -> float:
    return statistics.median(values)


def block_ratio(values: list[float], peer: list[float], block: int = 50) -> float:
    """The median over blocks of (this contender's median / the peer's median) in the same
    round of blocks: measured a few ms apart, so a machine that changes speed during the run
    (a busy neighbour) moves both sides of each ratio alike. A steadier figure than the ratio
    of the overall medians when the run is noisy; the two agree on a quiet machine."""
    ratios = [
        p50(values[start : start + block]) / p50(peer[start : start + block])
        for start in range(0, min(len(values), len(peer)), block)
    ]
    return p50(ratios)


class Noop(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(None)


@with_lock(lambda args: "bench:lock", ttl=60)
class LockedNoop(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(None)


@with_ordered_lock(lambda args: "bench:five", ttl=3600)
@with_period(lambda args: f"bench:period:{args['n']}", every=3600)
@with_lock(lambda args: "bench:five", ttl=60)
@with_semaphore(lambda args: "bench:five", limit=10)
@with_rate_limit(lambda args: "bench:five", limits={"second": 10**6, "hour": 10**9})
class FiveNoop(Step):
    inputs = ("n",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(None)


class OneStep(Reactor):
    s0 = step(Noop)


class TenSteps(Reactor):
    s0 = step(Noop)
    s1 = step(Noop)
    s2 = step(Noop)
    s3 = step(Noop)
    s4 = step(Noop)
    s5 = step(Noop)
    s6 = step(Noop)
    s7 = step(Noop)
    s8 = step(Noop)
    s9 = step(Noop)


#: the commands a contender's client sends itself. A script's EVALSHA (or a function's FCALL)
#: time includes every command it runs, which INFO commandstats also counts under that
#: command's own name: summing every name would count those twice. redis-py's Lock sends SET
#: (acquire) and EVALSHA (its release script); ours send FCALL (the Functions library, Redis
#: 7+) or EVALSHA (older servers), and FUNCTION LOAD once.
SENT_BY_REDIS_PY_LOCK = ("set", "evalsha")
SENT_BY_OURS = ("evalsha", "fcall")


def server_usec(client: Any, sent: tuple[str, ...]) -> float:
    """µs the server spent so far in the commands named ``sent`` (``INFO commandstats``). Read
    as a difference before/after, never reset: the server may be shared."""
    stats = client.info("commandstats")
    return sum(float(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in sent)


def server_time_per_call(
    client: Any, iteration: Callable[[], None], sent: tuple[str, ...], n: int = 300
) -> float:
    """Redis server µs spent per ``iteration`` in the commands it sends (scripts counted whole,
    their inner commands once), by commandstats deltas."""
    before = server_usec(client, sent)
    for _ in range(n):
        iteration()
    after = server_usec(client, sent)
    return (after - before) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument(
        "--seed", type=int, default=1, help="the blocks' order in each round (default 1)"
    )
    options = parser.parse_args()
    url = redis_url()
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    plain = redis.Redis.from_url(url)
    started_at = time.time()

    def redis_py_lock() -> None:
        lock = plain.lock(f"{prefix}:redis-py", timeout=60)
        assert lock.acquire(blocking=False)
        lock.release()

    def ping() -> None:
        plain.ping()

    def locked_call() -> None:
        assert LockedNoop.call().ok

    def tracking_executions() -> Any:
        return override_settings(REACTOR_TRACKING="executions")

    def no_flush() -> Any:
        return override_settings(REACTOR_TRACKING_FLUSH_ON_FINISH=False)

    coordinator = Coordinator()
    bare_holder = Holder(owner="bench-bare")

    def bare_lock_pair() -> None:
        admitted = coordinator.admit([LockClaim("bench:bare", ttl=60)], bare_holder)
        assert isinstance(admitted, Admitted)
        coordinator.release(admitted, "success")

    def five_call() -> None:
        assert FiveNoop.call(n=next(_fresh)).ok

    def one_step_run() -> None:
        assert OneStep.run().ok

    def ten_step_run() -> None:
        assert TenSteps.run().ok

    database = connection.vendor
    if database == "postgresql":
        database += f" {connection.pg_version // 10000}"
    server = plain.info("server")
    print(
        f"Redis {server['redis_version']} at {url}; database {database}; "
        f"{options.iterations} iterations after {WARM_UP} warm-up, blocks shuffled with seed "
        f"{options.seed}; Python "
        f"{sys.version.split()[0]}, redis-py {redis.__version__}; "
        f"DEBUG={settings.DEBUG}; REACTOR_TRACKING_FLUSH_INTERVAL="
        f"{getattr(settings, 'REACTOR_TRACKING_FLUSH_INTERVAL', 0.25)}"
    )
    with override_settings(REACTOR_KEY_PREFIX=prefix):
        try:
            samples = measure(
                [
                    ("redis-py Lock pair", redis_py_lock, None),
                    ("Redis PING (one round trip, for scale)", ping, None),
                    ("Coordinator lock admit + release (no engine)", bare_lock_pair, None),
                    ("locked Step.call, default tracking", locked_call, None),
                    (
                        'locked Step.call, TRACKING="executions"',
                        locked_call,
                        tracking_executions,
                    ),
                    ("five-primitive Step.call, default", five_call, None),
                    ("Reactor.run, 1 no-op step", one_step_run, None),
                    ("Reactor.run, 10 no-op steps", ten_step_run, None),
                    ("Reactor.run, 1 step, FLUSH_ON_FINISH=False", one_step_run, no_flush),
                    ("Reactor.run, 10 steps, FLUSH_ON_FINISH=False", ten_step_run, no_flush),
                ],
                options.iterations,
                seed=options.seed,
            )
            flush()
            server_time = {
                "redis-py Lock pair": server_time_per_call(
                    plain, redis_py_lock, SENT_BY_REDIS_PY_LOCK
                ),
                "Coordinator lock admit + release": server_time_per_call(
                    plain, bare_lock_pair, SENT_BY_OURS
                ),
                "locked Step.call (admit + release)": server_time_per_call(
                    plain, locked_call, SENT_BY_OURS
                ),
                "five-primitive Step.call (admit + release)": server_time_per_call(
                    plain, five_call, SENT_BY_OURS
                ),
            }
            calls = len(samples["locked Step.call, default tracking"])
        finally:
            doomed = list(get_client(url).scan_iter(match=f"{prefix}:*", count=1000))
            if doomed:
                get_client(url).delete(*doomed)
            runs = Execution.objects.filter(
                reactor__in=[OneStep.path(), TenSteps.path()], created_at__gte=_aware(started_at)
            )
            runs.delete()
            CoordinationEvent.objects.filter(key__startswith="bench:").delete()

    peer = p50(samples["redis-py Lock pair"])
    print(
        f"\n{'median per call, µs':48} {'p50':>9} {'p90':>9}  ratio to the redis-py pair"
        "  (median of per-block ratios)"
    )
    for label, values in samples.items():
        ordered = sorted(values)
        p90 = ordered[int(len(ordered) * 0.9)]
        paired = block_ratio(values, samples["redis-py Lock pair"])
        print(
            f"{label:48} {p50(values):9.1f} {p90:9.1f}  {p50(values) / peer:5.2f}x"
            f"  ({paired:5.2f}x)"
        )
    one, ten = (
        p50(samples["Reactor.run, 1 no-op step"]),
        p50(samples["Reactor.run, 10 no-op steps"]),
    )
    print(f"\nmarginal uncoordinated step in a Reactor.run: {(ten - one) / 9:.1f} µs")
    one = p50(samples["Reactor.run, 1 step, FLUSH_ON_FINISH=False"])
    ten = p50(samples["Reactor.run, 10 steps, FLUSH_ON_FINISH=False"])
    print(f"  same with REACTOR_TRACKING_FLUSH_ON_FINISH=False: {(ten - one) / 9:.1f} µs")
    print("\nRedis server time per call, the commands it sends (INFO commandstats deltas):")
    for name, micros in server_time.items():
        print(f"  {name:52} {micros:7.1f} µs")
    print(f"tracking rows written behind: {get_writer().written} ({calls} locked calls)")


def _aware(epoch: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, tz=UTC)


if __name__ == "__main__":
    main()
