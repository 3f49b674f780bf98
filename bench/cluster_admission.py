"""Admission on a Redis Cluster beside one Redis server, same binary, same machine, same run.

Three throw-away topologies are started from the machine's ``redis-server`` on loopback TCP
ports (``reactor_app.testing.servers``): one server, and a 3-master cluster. Measured, one
uncontended admit + release per iteration, interleaved in blocks of 100 so background load
falls on all alike:

* a lock — one server / cluster;
* five primitives (ordered gate, period, lock, semaphore, two-window rate limit) — one server
  (one script call to admit, one to release); cluster **same slot** (all five on one user key:
  one hash tag, so still one call each way); cluster **cross slot** (five user keys on several
  nodes: admitted claim by claim, released one by one — five calls each way).

    python bench/cluster_admission.py [--iterations 2000]

Not a test: it prints figures; docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")

import django

django.setup()

import redis  # noqa: E402

from bench.lock_latency import WARM_UP, measure  # noqa: E402
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
from reactor_app.coordination.keys import hash_slot, key  # noqa: E402
from reactor_app.coordination.redis import get_client  # noqa: E402
from reactor_app.testing.servers import RedisClusterServers, StandaloneServer  # noqa: E402

OWNER = Holder(owner="bench", execution_id="bench", step="bench", reactor="bench")
WINDOWS = rate_limit.windows_from(limits={"second": 1_000_000, "hour": 1_000_000_000})


def lock_loop(coordinator: Coordinator) -> Callable[[], None]:
    def iteration() -> None:
        admitted = coordinator.admit([LockClaim("bench", ttl=60)], OWNER)
        assert isinstance(admitted, Admitted)
        coordinator.release(admitted, "success")

    return iteration


def five_loop(coordinator: Coordinator, keys: list[str]) -> Callable[[], None]:
    """Five primitives on ``keys`` (ordered, period, lock, semaphore, rate limit)."""
    position = coordinator.assign_position(keys[0], OWNER)
    claims: list[Claim] = [
        OrderedLockClaim(keys[0], position),
        PeriodClaim(keys[1], 1),
        LockClaim(keys[2], ttl=60),
        SemaphoreClaim(keys[3], limit=10),
        RateLimitClaim(keys[4], WINDOWS),
    ]

    def iteration() -> None:
        admitted = coordinator.admit(claims, OWNER)
        assert isinstance(admitted, Admitted), admitted
        coordinator.release(admitted, "retry")  # keeps the position, marks nothing

    return iteration


def slots_of(coordinator: Coordinator, keys: list[str]) -> int:
    """Hash slots the five claims on ``keys`` use (each primitive's keys share its user key's
    hash tag, so the base key's slot is the claim's slot)."""
    primitives = ["ordered_lock", "period", "lock", "semaphore", "rate_limit"]
    names = [key(p, k, prefix=coordinator.prefix) for p, k in zip(primitives, keys, strict=True)]
    return len({hash_slot(name) for name in names})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    options = parser.parse_args()

    with StandaloneServer() as single, RedisClusterServers() as cluster:
        one = Coordinator(client=get_client(single.url), prefix="bench")
        many = Coordinator(client=get_client(cluster.url), prefix="bench")
        same = ["same"] * 5
        spread = [f"cross-{n}" for n in range(5)]
        assert slots_of(many, same) == 1 and slots_of(many, spread) == 5
        version = redis.Redis(port=single.port).info("server")["redis_version"]
        print(
            f"redis-server {version} on loopback TCP: one server vs a 3-master cluster; "
            f"{options.iterations} iterations after {WARM_UP} warm-up; Python "
            f"{sys.version.split()[0]}, redis-py {redis.__version__}"
        )
        contenders: list[tuple[str, Callable[[], None]]] = [
            ("lock, one server", lock_loop(one)),
            ("lock, cluster", lock_loop(many)),
            ("5 primitives, one server", five_loop(one, same)),
            ("5 primitives, cluster, same slot", five_loop(many, same)),
            ("5 primitives, cluster, cross slot (5 slots)", five_loop(many, spread)),
        ]
        results = measure(contenders, options.iterations)

    by_label: dict[str, Any] = {row["label"]: row for row in results}
    print(f"\n{'admit + release, µs':46} {'p50':>8} {'p99':>8} {'mean':>8}  vs one server")
    for row in results:
        peer = by_label[
            "lock, one server" if row["label"].startswith("lock") else "5 primitives, one server"
        ]
        print(
            f"{row['label']:46} {row['p50']:8.1f} {row['p99']:8.1f} {row['mean']:8.1f}"
            f"  {row['p50'] / peer['p50']:5.2f}x"
        )


if __name__ == "__main__":
    main()
