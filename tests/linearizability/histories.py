"""Helpers for the checker's own tests: hand-written operations and a brute-force checker.

The brute force tries every order of every subset of the ``info`` operations (an ``info`` op
may have happened or not) that respects real time (``a`` completed before ``b`` was invoked
⇒ ``a`` first) and asks the model; it is exponential and only for a handful of operations —
the reference the Wing-Gong-Lowe search is compared with.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import combinations, permutations
from typing import Any

from reactor_app.testing.history import Operation
from reactor_app.testing.linearizability import Model, searched_operations

MS = 1_000_000


def op(
    n: int,
    f: str,
    session: str | None,
    call_ms: float,
    ret_ms: float | None,
    status: str = "ok",
    key: str | None = "k",
    **value: Any,
) -> Operation:
    """Operation ``n`` (its id) on ``key``: ``ret_ms=None`` with ``status="info"`` is open."""
    if session is not None:
        value["session"] = session
    return Operation(
        id=str(n),
        process=session or "nemesis",
        f=f,
        key=key,
        status=status,  # type: ignore[arg-type]
        call=int(call_ms * MS),
        ret=None if ret_ms is None or status == "info" else int(ret_ms * MS),
        value=value,
    )


def brute_force_linearizable(ops: Sequence[Operation], model: Model) -> bool:
    """Whether some order of the operations (every completed one, any subset of the open
    ones) respects real time and is legal for ``model`` — tried one by one.

    It tries the operations the search places (``searched_operations``), so an open
    acquisition that is its hold's only operation is left out here too: its effect can only
    take the key from whoever holds it, which is legal only once that holder's lease may have
    lapsed — and then the holder's own later operations were
    legal without it. The models cannot see that (an open operation has no return time to
    test a lease against, so they let it take any key), and placing it before the holder's
    "not held" would explain a release that no lapse explains (Hypothesis found that: an
    acquisition cut short at 0 ms "freeing" a hold leased until 2 ms for its release at 1 ms).
    """
    ops = searched_operations(ops, model)  # the same operations the search places
    known = [o for o in ops if o.ret is not None]
    unknown = [o for o in ops if o.ret is None]
    for size in range(len(unknown) + 1):
        for extra in combinations(unknown, size):
            chosen = known + list(extra)
            for order in permutations(chosen):
                if _respects_real_time(order) and _legal(order, model):
                    return True
    return False


def _respects_real_time(order: Sequence[Operation]) -> bool:
    for i, later in enumerate(order):
        for earlier in order[i + 1 :]:
            # ``earlier`` is placed after ``later``: illegal when it completed before ``later``
            # was invoked
            if earlier.ret is not None and earlier.ret < later.call:
                return False
    return True


def _legal(order: Sequence[Operation], model: Model) -> bool:
    states: frozenset[Hashable] = frozenset([model.init()])
    for o in order:
        states = frozenset(s for before in states for s in model.step(before, o))
        if not states:
            return False
    return True
