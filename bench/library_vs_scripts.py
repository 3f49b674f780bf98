"""Server time of our calls as Functions-library FCALLs against the same Lua as EVALSHA scripts.

One process, one Redis 7+ server, side by side and interleaved in blocks so that background
load falls on every row alike:

* a redis-py ``Lock`` acquire + release (``SET NX PX`` + its Lua release) — the peer;
* one lock admitted and released by ``Coordinator`` (the fast path: ``lock_admit`` /
  ``lock_release``), as FCALLs of the library and as EVALSHA scripts;
* five primitives (ordered lock, period, lock, semaphore, two-window rate limit) admitted and
  released (``"retry"``, so it repeats) through the general ``admit`` / ``release``, both ways.

For each row: the Redis server time per pair from ``INFO commandstats`` deltas of the commands
the row sends (a script's or function's time includes the commands it runs), as the median and
the lowest of the per-block figures (the lowest is the least disturbed by other processes
taking the server's CPU), and the wall-clock median per pair. Ratios are to the redis-py pair
of the same run. Point it at a server of its own when the machine is shared: commandstats are
server-wide, so other clients' EVALSHA calls would count in the script rows.

    python bench/library_vs_scripts.py --url redis://127.0.0.1:6394/0 [--blocks 15]

Not a test: it prints figures; docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")

import django

django.setup()

import redis  # noqa: E402

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
from reactor_app.coordination.scripts import scripts_for  # noqa: E402
from reactor_app.testing.pytest_plugin import delete_prefixed_keys  # noqa: E402


def usec(client: Any, sent: tuple[str, ...]) -> float:
    stats = client.info("commandstats")
    return sum(float(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in sent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="Redis URL (default: the configured one)")
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--block", type=int, default=100, help="pairs per block")
    options = parser.parse_args()
    url = options.url or redis_url()
    plain = redis.Redis.from_url(url)
    version = str(plain.info("server")["redis_version"])
    if int(version.split(".")[0]) < 7:
        sys.exit(f"Redis {version} has no Functions: nothing to compare")
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    holder = Holder(owner="bench", execution_id="bench", step="bench", reactor="bench")
    windows = rate_limit.windows_from(limits={"second": 1_000_000, "hour": 1_000_000_000})

    def ways(functions: bool) -> tuple[Callable[[], None], Callable[[], None]]:
        client = get_client(url) if functions else redis.Redis.from_url(url)
        scripts_for(client).uses_functions = functions
        ours = Coordinator(client=client, prefix=f"{prefix}-{'f' if functions else 's'}")
        position = ours.assign_position("five", holder)
        five: list[Claim] = [
            OrderedLockClaim("five", position),
            PeriodClaim("five", 1),
            LockClaim("five", ttl=60),
            SemaphoreClaim("five", limit=10),
            RateLimitClaim("five", windows),
        ]

        def lock_pair() -> None:
            admitted = ours.admit([LockClaim("bench", ttl=60)], holder)
            assert isinstance(admitted, Admitted)
            ours.release(admitted, "success")

        def five_pair() -> None:
            admitted = ours.admit(five, holder)
            assert isinstance(admitted, Admitted), admitted
            ours.release(admitted, "retry")

        return lock_pair, five_pair

    def redis_py_pair() -> None:
        lock = plain.lock(f"{prefix}:redis-py", timeout=60)
        assert lock.acquire(blocking=False)
        lock.release()

    lock_f, five_f = ways(True)
    lock_s, five_s = ways(False)
    rows: list[tuple[str, Callable[[], None], tuple[str, ...]]] = [
        ("redis-py Lock pair (SET NX PX + Lua release)", redis_py_pair, ("set", "evalsha")),
        ("one lock, library (FCALL)", lock_f, ("fcall",)),
        ("one lock, scripts (EVALSHA)", lock_s, ("evalsha",)),
        ("five primitives, library (FCALL)", five_f, ("fcall",)),
        ("five primitives, scripts (EVALSHA)", five_s, ("evalsha",)),
    ]
    server: dict[str, list[float]] = {label: [] for label, _, _ in rows}
    wall: dict[str, list[float]] = {label: [] for label, _, _ in rows}
    try:
        for _, pair, _ in rows:  # warm-up: loads the library and the scripts
            for _ in range(50):
                pair()
        for _ in range(options.blocks):
            for label, pair, sent in rows:
                before = usec(plain, sent)
                for _ in range(options.block):
                    started = time.perf_counter_ns()
                    pair()
                    wall[label].append((time.perf_counter_ns() - started) / 1000)
                server[label].append((usec(plain, sent) - before) / options.block)
    finally:
        for way in ("f", "s"):
            delete_prefixed_keys(plain, f"{prefix}-{way}")
        delete_prefixed_keys(plain, prefix)
    print(
        f"Redis {version} at {url}; {options.blocks} blocks of {options.block} pairs per row, "
        f"interleaved; Python {sys.version.split()[0]}, redis-py {redis.__version__}; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    peer = rows[0][0]
    peer_server = statistics.median(server[peer])
    peer_low = min(server[peer])
    peer_wall = statistics.median(wall[peer])
    print(
        f"\n{'per acquire + release':44} {'server µs median':>16} {'ratio':>6} "
        f"{'lowest':>7} {'ratio':>6} {'wall µs p50':>12} {'ratio':>6}"
    )
    for label, _, _ in rows:
        median, low, p50 = (
            statistics.median(server[label]),
            min(server[label]),
            statistics.median(wall[label]),
        )
        print(
            f"{label:44} {median:16.1f} {median / peer_server:5.2f}x {low:7.1f} "
            f"{low / peer_low:5.2f}x {p50:12.1f} {p50 / peer_wall:5.2f}x"
        )


if __name__ == "__main__":
    main()
