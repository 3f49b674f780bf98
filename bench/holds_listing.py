"""Operator views at 100, 10,000 and 100,000 live holds (issue 14).

For each number of live holds, in one run against one Redis and one database:

* ``GET /api/reactor/holds/`` — first page (50 holds), median of ``--repeat`` requests;
* the admin Coordination page — first page, median, and its size in KiB;
* a filtered API query — ``key_prefix`` matching 10 holds among all the others;
* ``GET /api/reactor/holds/?ordering=ttl`` — first page by time left (the by-expiry zset);
* for contrast, the SCAN listing every request used before the live-holds index
  (``coordination.state.live_holds``, one run).

Holds are real lock holds (the admission script, pipelined to fill quickly), attributed like a
step's, with a 15-minute TTL; ten of them per size sit under the ``target:`` prefix. The
requests go through Django's test client as a superuser (no browser). Ratios are against the
100-hold row of the same run.

    python bench/holds_listing.py [--sizes 100,10000,100000] [--repeat 7] [--cluster]

``--cluster`` runs the same against a 3-master Redis Cluster started for the run (the test
harness's ``reactor_app.testing.servers``; the index sharded by hash slot). Otherwise it uses
the demo project's settings (``DATABASE_URL`` / ``REDIS_URL`` when set, else SQLite and
the embedded Redis), a fresh key prefix, and deletes its keys and its user afterwards. Not a
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.test import Client, override_settings  # noqa: E402

from reactor_app.coordination import holds_index, lock, state  # noqa: E402
from reactor_app.coordination.claims import LockClaim  # noqa: E402
from reactor_app.coordination.redis import get_client, is_cluster  # noqa: E402
from reactor_app.coordination.scripts import script_sources  # noqa: E402
from reactor_app.coordination.stored_replies import with_request  # noqa: E402
from reactor_app.testing.pytest_plugin import delete_prefixed_keys  # noqa: E402
from reactor_app.testing.servers import RedisClusterServers  # noqa: E402

TTL_MS = 15 * 60 * 1000
TARGETS = 10  # holds under the "target:" prefix, at every size


def fill(client: Any, prefix: str, start: int, stop: int, batch: int = 2000) -> None:
    """Admit locks ``hold:<n>`` for n in [start, stop) through the admission script."""
    admit = client.script_load(script_sources()["admit"])
    sharded = is_cluster(client)
    for first in range(start, stop, batch):
        # a cluster pipeline cannot carry scripts: one plain pipeline per node instead
        pipes: dict[str, Any] = {}
        for n in range(first, min(first + batch, stop)):
            key = f"hold:{n:06d}"
            index = holds_index.keys_for(key, prefix, sharded=sharded)
            keys = [*lock.admit_keys(LockClaim(key), prefix), *index]
            holder = {
                "owner": f"bench-{n}",
                "execution": f"bench-{n}",
                "step": "sync",
                "reactor": "bench.Sync",
            }
            spec = [{"p": "lock", "n": len(keys), "ttl_ms": TTL_MS, "ik": key}]
            node = client.get_node_from_key(keys[0]) if sharded else None
            name = node.name if node is not None else ""
            if name not in pipes:
                target = client.get_redis_connection(node) if node is not None else client
                pipes[name] = target.pipeline(transaction=False)
            # the admission script is retry-safe: it takes a stored-reply key and its lifetime
            call_keys, args = with_request(keys, [json.dumps(holder), json.dumps(spec), ""])
            pipes[name].evalsha(admit, len(call_keys), *call_keys, *args)
        for pipe in pipes.values():
            pipe.execute()


def add_targets(client: Any, prefix: str, size: int) -> None:
    admit = client.script_load(script_sources()["admit"])
    for n in range(TARGETS):
        key = f"target:{size}:{n}"
        index = holds_index.keys_for(key, prefix, sharded=is_cluster(client))
        keys = [*lock.admit_keys(LockClaim(key), prefix), *index]
        spec = [{"p": "lock", "n": len(keys), "ttl_ms": TTL_MS, "ik": key}]
        owner = json.dumps({"owner": f"t-{size}-{n}"})
        call_keys, args = with_request(keys, [owner, json.dumps(spec), ""])
        client.evalsha(admit, len(call_keys), *call_keys, *args)


def median_ms(call: Any, repeat: int) -> tuple[float, Any]:
    timings = []
    result = None
    for _ in range(repeat):
        started = time.perf_counter()
        result = call()
        timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,10000,100000")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--cluster", action="store_true", help="on a 3-master Redis Cluster")
    options = parser.parse_args()
    if options.cluster:
        with RedisClusterServers() as cluster:
            settings.REACTOR_REDIS_URL = cluster.url
            run(options)
    else:
        run(options)


def run(options: argparse.Namespace) -> None:
    sizes = sorted({int(s) for s in options.sizes.split(",")})

    prefix = f"bench-holds-{uuid.uuid4().hex[:8]}"
    override_settings(
        REACTOR_KEY_PREFIX=prefix, ALLOWED_HOSTS=[*settings.ALLOWED_HOSTS, "testserver"]
    ).enable()
    client = get_client()
    user_model = get_user_model()
    name = f"bench-{uuid.uuid4().hex[:8]}"
    user = user_model.objects.create_superuser(name, f"{name}@example.invalid", "x")
    web = Client()
    web.force_login(user)
    rows = []
    try:
        filled = 0
        for size in sizes:
            fill(client, prefix, filled, size - TARGETS)
            add_targets(client, prefix, size)
            filled = size - TARGETS
            total = sum(holds_index.totals(client=client, prefix=prefix).values())

            def api() -> Any:
                response = web.get("/api/reactor/holds/")
                assert response.status_code == 200, response.content[:300]
                return response

            def admin() -> Any:
                response = web.get("/admin/reactor_app/coordination/")
                assert response.status_code == 200
                return response

            def by_ttl() -> Any:
                response = web.get("/api/reactor/holds/", {"ordering": "ttl"})
                assert len(response.json()["results"]) == 50
                return response

            def filtered(size: int = size) -> Any:
                response = web.get("/api/reactor/holds/", {"key_prefix": f"target:{size}:"})
                assert len(response.json()["results"]) == TARGETS
                return response

            for warm_up in (api, admin, filtered, by_ttl):
                warm_up()
            api_ms, _ = median_ms(api, options.repeat)
            ttl_ms, _ = median_ms(by_ttl, options.repeat)
            admin_ms, page = median_ms(admin, options.repeat)
            filtered_ms, _ = median_ms(filtered, options.repeat)
            scan_ms, listed = median_ms(lambda: state.live_holds(client=client), 1)
            rows.append(
                {
                    "holds": total,
                    "api_ms": api_ms,
                    "ttl_ms": ttl_ms,
                    "admin_ms": admin_ms,
                    "admin_kib": len(page.content) / 1024,
                    "filtered_ms": filtered_ms,
                    "scan_ms": scan_ms,
                    "scan_rows": len(listed),
                }
            )
    finally:
        delete_prefixed_keys(client, prefix)
        user.delete()

    base = rows[0]
    where = "a 3-master Redis Cluster" if options.cluster else "one Redis server"
    print(
        f"live holds listing on {where}, {options.repeat} requests per figure (median), "
        "Django test client"
    )
    print(
        f"{'live holds':>10} | {'holds/ ms':>9} {'ratio':>6} | {'by ttl ms':>9} {'ratio':>6} | "
        f"{'admin ms':>8} {'ratio':>6} {'KiB':>6} | {'filtered ms':>11} {'vs 100':>6} | "
        f"{'SCAN listing ms':>15}"
    )
    for row in rows:
        print(
            f"{row['holds']:>10,} | {row['api_ms']:>9.1f} {row['api_ms'] / base['api_ms']:>5.2f}x"
            f" | {row['ttl_ms']:>9.1f} {row['ttl_ms'] / base['ttl_ms']:>5.2f}x"
            f" | {row['admin_ms']:>8.1f} {row['admin_ms'] / base['admin_ms']:>5.2f}x"
            f" {row['admin_kib']:>6.1f} | {row['filtered_ms']:>11.1f}"
            f" {row['filtered_ms'] / base['api_ms']:>5.2f}x | {row['scan_ms']:>15.1f}"
        )
    print(
        "targets: first pages within 1.5x of the 100-hold row; admin page <= 200 KiB; the "
        "filtered query within 1.5x of the unfiltered first page at 100 holds"
    )


if __name__ == "__main__":
    main()
