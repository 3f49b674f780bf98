"""Live limits: what reading a named limit at every admission costs, beside a numeric limit.

One uncontended semaphore admission + release per iteration, the same key each time, three
contenders interleaved in blocks of 100 iterations (background load falls on all alike),
measured with ``time.perf_counter_ns``:

* a semaphore declared with a number (``limit=5``): the peer;
* a named limit (``limit_name="partner_api"``, settings: 2) with no override published;
* the same name with an operator's override published (``7``): each admission takes the
  value from this process's copy of the overrides (``coordination.live_limits``), which it
  reads again from Redis at most every ``REFRESH_SECONDS``.

    python bench/live_limits.py [--iterations 2000]

Uses the coordination Redis of ``demo_project.settings`` (``REDIS_URL``, else the embedded
server) under a fresh key prefix, deleted after. Not a test: it prints figures;
docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
# live limits are read under the configured prefix: give the run its own
os.environ["REACTOR_KEY_PREFIX"] = f"bench-{uuid.uuid4().hex[:8]}"

import django

django.setup()

import redis  # noqa: E402

from bench._support import measure  # noqa: E402
from reactor_app.conf import reactor_settings  # noqa: E402
from reactor_app.coordination import live_limits  # noqa: E402
from reactor_app.coordination.admission import Coordinator  # noqa: E402
from reactor_app.coordination.claims import Admitted, Holder, SemaphoreClaim  # noqa: E402
from reactor_app.coordination.redis import get_client, redis_url  # noqa: E402

WARM_UP = 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    options = parser.parse_args()
    coordinator = Coordinator()
    owner = Holder(owner="bench", execution_id="bench", step="bench", reactor="bench")
    name = "partner_api"
    assert name in reactor_settings.LIMITS, "demo_project.settings declares partner_api"

    def run(claim: SemaphoreClaim) -> Callable[[], None]:
        def iteration() -> None:
            admitted = coordinator.admit([claim], owner)
            assert isinstance(admitted, Admitted), admitted
            coordinator.release(admitted, "success")

        return iteration

    numeric = run(SemaphoreClaim("numeric", limit=5))
    named = run(SemaphoreClaim("named", limit=2, limit_name=name))
    overridden = run(SemaphoreClaim("overridden", limit=2, limit_name="bench_overridden"))
    live_limits.publish(
        {
            live_limits.field_name("semaphore", "bench_overridden"): live_limits.Override(
                primitive="semaphore", name="bench_overridden", value={"limit": 7}, by="bench"
            )
        }
    )
    plain = redis.Redis.from_url(redis_url())
    prefix = reactor_settings.KEY_PREFIX
    try:
        print(
            f"Redis {plain.info('server')['redis_version']} at {redis_url()}; "
            f"{options.iterations} iterations after {WARM_UP} warm-up; Python "
            f"{sys.version.split()[0]}; copies refreshed every {live_limits.REFRESH_SECONDS} s"
        )
        results = measure(
            [
                ("semaphore limit=5 (the peer)", numeric),
                ('named limit (limit="partner_api"), settings', named),
                ("named limit with an override published", overridden),
            ],
            options.iterations,
        )
    finally:
        doomed = list(plain.scan_iter(match=f"{prefix}:*", count=1000))
        if doomed:
            plain.delete(*doomed)
        get_client()  # keep the configured client alive to the end (its pool is shared)

    baseline = results[0]
    print(f"\n{'admit + release, µs':46} {'p50':>8} {'p99':>8} {'mean':>8}  p50 ratio")
    for row in results:
        ratio = row["p50"] / baseline["p50"]
        print(
            f"{row['label']:46} {row['p50']:8.1f} {row['p99']:8.1f} {row['mean']:8.1f}"
            f"  {ratio:5.2f}x"
        )


if __name__ == "__main__":
    main()
