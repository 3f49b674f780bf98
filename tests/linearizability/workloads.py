"""Workloads: clients (``clients``) taking and releasing holds in a loop, every operation
recorded in a ``History``, on threads or forked processes.

An error that escapes a client call (the store unreachable, a reply lost) leaves its
operation ``info`` — outcome unknown — and the loop goes on, as a real caller would retry.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from reactor_app.testing.history import History, Operation

#: the operations each primitive's hold records (the models' names for them)
VERBS = {"period": ("admit", "complete")}


def key_of(client: Any, key: str) -> str:
    """The key a client's operations are recorded under (a period's includes its bucket,
    read from this machine's clock at the invocation; an admission that completes in another
    bucket is flagged ``bucket_changed`` and ``settled_buckets`` leaves it out)."""
    return client.bucket(key) if client.primitive == "period" else key


def settled_buckets(ops: list[Operation]) -> list[Operation]:
    """``ops`` without the holds whose admission straddled a bucket boundary: which bucket
    Redis put them in is not known. Dropping a hold only removes constraints."""
    unsure = {o.value.get("session") for o in ops if o.value.get("bucket_changed")}
    return [o for o in ops if o.key is None or o.value.get("session") not in unsure]


def hold_loop(
    client: Any,
    history: History,
    key: str,
    process: str,
    *,
    duration: float,
    hold: tuple[float, float] = (0.0, 0.01),
    pause: tuple[float, float] = (0.0, 0.003),
    failures: float = 0.0,
    seed: int | None = None,
    rotate_every: float | None = None,
) -> int:
    """Take, hold for a random while, release — until ``duration`` passes; the number of
    operations recorded. ``failures``: the share of holds released as failed (a period's
    failure leaves its bucket unmarked). ``rotate_every``: move on to a new key
    (``<key>#<n>``) every so many seconds, so that a long run's history is many short ones
    (keys are checked apart) instead of one the search must hold at once."""
    rng = random.Random(seed)
    take, give = VERBS.get(client.primitive, ("acquire", "release"))
    recorded = 0
    deadline = time.monotonic() + duration
    base = key
    while time.monotonic() < deadline:
        if rotate_every:
            # the machine's monotonic clock: every process moves on at the same instant
            key = f"{base}#{int(time.monotonic() // rotate_every)}"
        session = f"{process}-{recorded}"
        where = key_of(client, key)
        recorded += 1
        try:
            with history.operation(
                process, take, where, session=session, **client.expected()
            ) as op:
                admitted, seen, holding = client.acquire(key, session)
                if key_of(client, key) != where:
                    seen["bucket_changed"] = True  # the bucket may not be the one recorded
                op.ok(admitted=admitted, **seen)
        except Exception:
            time.sleep(0.01)
            continue
        if not admitted:
            time.sleep(rng.uniform(*pause))
            continue
        time.sleep(rng.uniform(*hold))
        if client.primitive == "rate_limit":
            continue  # a charge is spent: nothing to give back
        outcome = "failure" if rng.random() < failures else "success"
        recorded += 1
        try:
            with history.operation(process, give, where, session=session, outcome=outcome) as op:
                op.ok(**client.release(key, session, holding, outcome))
        except Exception:
            time.sleep(0.01)
    return recorded


def on_threads(count: int, target: Callable[[int], Any]) -> list[Any]:
    """``target(n)`` on ``count`` threads at once; their results (an error is re-raised)."""
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            results[n] = target(n)
        except BaseException as error:  # handed to the caller
            errors.append(error)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results
