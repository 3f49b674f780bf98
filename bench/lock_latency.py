"""Lock latency: reactor_app's lock beside redis-py's ``Lock`` and python-redis-lock.

One uncontended acquire + release per iteration, the same key each time, against the same
Redis in the same run (the contenders interleaved in blocks of 100 iterations, in a new random
order each round, ``--seed``, so background load and the round trip's mode hit them alike:
``bench._support.measure`` says why), measured with ``time.perf_counter_ns``. Each ratio is
printed twice: of the overall medians, and in brackets the median of the ratios taken block by
block. Also measured: a five-primitive admission (ordered gate, period, lock, semaphore,
two-window rate limit) + release, and, for scale, a ``PING``: the round trip every call pays
(docs/benchmarks.md, "Round trips on the development VM"). Then the Redis server's side, by
``INFO commandstats``: the time of the commands each contender sends, and how many commands
the server ran for it (a script's own included).

    python bench/lock_latency.py [--iterations 2000] [--url redis://127.0.0.1:6379/15] [--seed 1]

Without ``--url`` it uses the coordination Redis of ``demo_project.settings``
(``REDIS_URL``, else the embedded server). Keys live under a fresh prefix and are deleted after.
Not a test: it prints figures; docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")

import django

django.setup()

import redis  # noqa: E402
import redis_lock  # noqa: E402

from bench._support import measure  # noqa: E402
from reactor_app.coordination import rate_limit  # noqa: E402
from reactor_app.coordination.admission import Coordinator  # noqa: E402
from reactor_app.coordination.claims import (  # noqa: E402
    Admitted,
    Claim,
    Holder,
    LockClaim,
    OrderedLockClaim,
    PeriodClaim,
    RateLimitClaim,
    SemaphoreClaim,
)
from reactor_app.coordination.redis import get_client, redis_url  # noqa: E402

WARM_UP = 200
#: what our calls are sent as: FCALL (the Functions library, Redis 7+) or EVALSHA (Redis 6);
#: a script's or function's time includes the commands it runs, so only these are summed
OURS_SENT = ("evalsha", "fcall")


def server_time_per_call(
    client: Any, iteration: Callable[[], None], sent: tuple[str, ...], n: int = 300
) -> tuple[float, float]:
    """Redis µs per ``iteration`` in the commands named ``sent``, and the commands the server
    ran per ``iteration`` (those sent, and those their scripts ran: what a script costs grows
    with them), by ``INFO commandstats`` deltas (never reset: the server may be shared, and
    other clients' commands meanwhile count too; ``INFO`` itself is left out)."""

    def read() -> tuple[float, int]:
        stats = client.info("commandstats")
        usec = sum(float(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in sent)
        calls = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")
        return usec, calls

    usec_before, calls_before = read()
    for _ in range(n):
        iteration()
    usec_after, calls_after = read()
    return (usec_after - usec_before) / n, (calls_after - calls_before) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--url", default=None, help="Redis URL (default: the configured one)")
    parser.add_argument(
        "--seed", type=int, default=1, help="the blocks' order in each round (default 1)"
    )
    options = parser.parse_args()
    url = options.url or redis_url()
    prefix = f"bench-{uuid.uuid4().hex[:8]}"

    ours = Coordinator(client=get_client(url), prefix=prefix)
    # the other libraries get a plain client of the same URL (python-redis-lock refuses
    # decode_responses=True, which our client uses)
    plain = redis.Redis.from_url(url)
    owner = Holder(owner="bench", execution_id="bench", step="bench", reactor="bench")

    def our_lock() -> None:
        admitted = ours.admit([LockClaim("bench", ttl=60)], owner)
        assert isinstance(admitted, Admitted)
        ours.release(admitted, "success")

    def redis_py_lock() -> None:
        lock = plain.lock(f"{prefix}:redis-py", timeout=60)
        assert lock.acquire(blocking=False)
        lock.release()

    def ping() -> None:
        plain.ping()

    def python_redis_lock() -> None:
        lock = redis_lock.Lock(plain, f"{prefix}:python-redis-lock", expire=60)
        assert lock.acquire(blocking=False)
        lock.release()

    windows = rate_limit.windows_from(limits={"second": 1_000_000, "hour": 1_000_000_000})

    def five_primitives_admit_release() -> None:
        admitted = ours.admit(five_claims, owner)
        assert isinstance(admitted, Admitted), admitted
        ours.release(admitted, "retry")  # keeps the position, marks nothing: repeatable

    position = ours.assign_position("five", owner)
    five_claims: list[Claim] = [
        OrderedLockClaim("five", position),
        PeriodClaim("five", 1),
        LockClaim("five", ttl=60),
        SemaphoreClaim("five", limit=10),
        RateLimitClaim("five", windows),
    ]

    try:
        server = plain.info("server")
        print(
            f"Redis {server['redis_version']} at {url}; {options.iterations} iterations "
            f"after {WARM_UP} warm-up, blocks shuffled with seed {options.seed}; Python "
            f"{sys.version.split()[0]}, redis-py "
            f"{redis.__version__}, python-redis-lock {redis_lock.__version__}"
        )
        results = measure(
            [
                ("redis-py Lock (SET NX PX + Lua release)", redis_py_lock),
                ("python-redis-lock Lock", python_redis_lock),
                ("reactor_app lock (admit + release)", our_lock),
                ("reactor_app 5 primitives (admit + release)", five_primitives_admit_release),
                ("Redis PING (one round trip, for scale)", ping),
            ],
            options.iterations,
            seed=options.seed,
        )
        server_times = [
            (label, server_time_per_call(plain, iteration, sent))
            for label, iteration, sent in (
                ("redis-py Lock (SET NX PX + Lua release)", redis_py_lock, ("set", "evalsha")),
                ("reactor_app lock (admit + release)", our_lock, OURS_SENT),
                (
                    "reactor_app 5 primitives (admit + release)",
                    five_primitives_admit_release,
                    OURS_SENT,
                ),
            )
        ]
    finally:
        doomed = list(plain.scan_iter(match=f"{prefix}:*", count=1000))
        if doomed:
            plain.delete(*doomed)

    baseline = results[0]
    print(
        f"\n{'acquire + release, µs':44} {'p50':>8} {'p99':>8} {'mean':>8}  p50 ratio"
        "  (median of per-block ratios)"
    )
    for row in results:
        ratio = row["p50"] / baseline["p50"]
        print(
            f"{row['label']:44} {row['p50']:8.1f} {row['p99']:8.1f} {row['mean']:8.1f}"
            f"  {ratio:5.2f}x     ({row['per_block']:5.2f}x)"
        )
    print(
        "\nRedis server per acquire + release (INFO commandstats): the time of the commands"
        " each sends, and how many commands ran"
    )
    for label, (micros, commands) in server_times:
        print(f"  {label:44} {micros:7.1f} µs  {commands:6.1f} commands")


if __name__ == "__main__":
    main()
