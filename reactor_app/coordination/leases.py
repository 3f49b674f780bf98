"""Lease renewal verbs: extending holds' leases, and starting their keep-alive.

``extend`` renews the leases of lock and semaphore holds and period reservations in one
``lua/extend.lua`` call (one per hold when their keys span cluster slots); ``extend_many``
renews several admissions' in one pipeline, the renewal scheduler's round
(``coordination.renewal``); ``keep_alive`` starts that renewal for an admission.

Each public function takes the ``Coordinator`` (its client, prefix and script calls) first:
they are its methods (``Coordinator.extend``, ...).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reactor_app.coordination.claims import Admitted, Hold
from reactor_app.coordination.primitives import RENEWABLE
from reactor_app.coordination.redis import is_cluster, unavailable_on_connection_error
from reactor_app.coordination.script_args import specs
from reactor_app.coordination.scripts import decode_reply, scripts_for
from reactor_app.exceptions import LeaseLost

if TYPE_CHECKING:
    from reactor_app.coordination.admission import Coordinator
    from reactor_app.coordination.renewal import Renewal


@dataclass(frozen=True)
class Extended:
    """What a renewal did: holds renewed and holds found lost, with the reason."""

    extended: list[Hold] = field(default_factory=list)
    granted_ms: list[int] = field(default_factory=list)  # lease now granted, per extended hold
    lost: list[tuple[Hold, str]] = field(default_factory=list)


def extend(
    coordinator: Coordinator,
    holds: Sequence[Hold],
    owner: str,
    *,
    renew: Callable[[Hold], bool] | None = None,
    lease_ms: int | None = None,
) -> Extended:
    """Renew the leases of lock and semaphore ``holds`` and period reservations (one
    call); see extend.lua.

    ``renew`` picks the holds whose lease is renewed; the others are only checked (still
    held by ``owner`` with their token, lease not expired) and keep the lease they have.
    By default every hold is renewed. A hold re-adopted after a park (``Gate.enter``) uses
    this: a lock declared without ``auto_extend`` must not outlive its TTL because of it.
    ``lease_ms`` grants that lease instead of each claim's own TTL (a hold kept across a
    park is made to cover the park); a lease is never shortened.
    """
    items = _renewable(holds)
    if not items:
        return Extended()
    groups = _groups(coordinator, items)
    spec = _lease_spec(owner, renew=renew, lease_ms=lease_ms)
    answers: list[Extended] = []
    for batch_holds, batch_groups in coordinator._batches(items, groups):
        reply = coordinator._run(
            "extend",
            [k for g in batch_groups for k in g],
            [json.dumps(specs(batch_holds, batch_groups, spec))],
            batch_holds[0].claim if len(batch_holds) == 1 else None,
        )
        answers.append(_extended(batch_holds, reply.data))
    return Extended(
        extended=[hold for answer in answers for hold in answer.extended],
        granted_ms=[ms for answer in answers for ms in answer.granted_ms],
        lost=[lost for answer in answers for lost in answer.lost],
    )


def extend_many(
    coordinator: Coordinator, requests: Sequence[tuple[Sequence[Hold], str]]
) -> list[Extended]:
    """Renew several admissions' leases — ``(holds, owner)`` each — in ONE pipeline (the
    renewal scheduler's round). A cluster client, whose pipeline cannot carry scripts of
    several slots, renews them one call each."""
    client = coordinator.client
    if len(requests) == 1 or is_cluster(client):
        return [extend(coordinator, holds, owner) for holds, owner in requests]
    scripts = scripts_for(client)
    plans: list[list[Hold]] = []
    with unavailable_on_connection_error():
        pipe = client.pipeline(transaction=False)
        for holds, owner in requests:
            items = _renewable(holds)
            plans.append(items)
            if not items:
                continue
            groups = _groups(coordinator, items)
            spec = json.dumps(specs(items, groups, _lease_spec(owner)))
            scripts.queue(pipe, "extend", [k for g in groups for k in g], [spec])
        raws = iter(pipe.execute())
    return [
        _extended(items, decode_reply(next(raws)).data) if items else Extended() for items in plans
    ]


def keep_alive(
    coordinator: Coordinator,
    admitted: Admitted,
    *,
    on_lost: Callable[[LeaseLost], None] | None = None,
    on_extended: Callable[[str, int], None] | None = None,
    start: bool = True,
) -> Renewal | None:
    """Start the renewal thread for ``admitted`` (None when nothing needs renewing):
    auto-extended locks, semaphore leases and ordered-lock heartbeats. ``on_extended``
    receives ``(key, granted lease ms)`` per renewed lease. ``start=False``: the renewal is
    returned unstarted, for a caller that must hold it before it runs (``engine.gate``)."""
    global _start_renewal
    if _start_renewal is None:
        # imported on first use: renewal imports admission, which imports this module (an
        # import statement run on every admission costs the import machinery each time; a
        # look in sys.modules could meet the module half-imported by another thread)
        from reactor_app.coordination.renewal import start_renewal

        _start_renewal = start_renewal
    return _start_renewal(  # type: ignore[no-any-return]
        admitted, coordinator=coordinator, on_lost=on_lost, on_extended=on_extended, start=start
    )


#: ``renewal.start_renewal``, once ``keep_alive`` (or a fork) has imported it
_start_renewal: Any = None


def _import_renewal_before_fork() -> None:
    """Import the renewal module in a process about to fork, so that its children inherit it:
    imported on first use instead, it was compiled and run in every forked worker on the way
    to its first critical section (docs/benchmarks.md, "Step-level versus reactor-level
    lock"). Before-fork hooks run before the interpreter takes its import lock for the
    fork; a fork from inside an import that cannot finish this one leaves it to first use."""
    global _start_renewal
    if _start_renewal is None:
        try:
            from reactor_app.coordination.renewal import start_renewal
        except Exception:  # pragma: no cover - a fork in the middle of an import: first use
            return
        _start_renewal = start_renewal


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_import_renewal_before_fork)


def _renewable(holds: Sequence[Hold]) -> list[Hold]:
    """The holds with a lease to renew (locks, semaphores, period reservations)."""
    return [h for h in holds if h.claim.primitive in RENEWABLE]


def _groups(coordinator: Coordinator, holds: list[Hold]) -> list[list[str]]:
    """The extend script's key group of each hold, live-holds index keys included."""
    prefix = coordinator.prefix
    return coordinator._with_index(
        [h.claim for h in holds],
        [RENEWABLE[h.claim.primitive].extend_keys(h.claim, prefix) for h in holds],
    )


def _lease_spec(
    owner: str, *, renew: Callable[[Hold], bool] | None = None, lease_ms: int | None = None
) -> Callable[[Hold], dict[str, Any]]:
    """A hold's own fields of the extend spec (see ``extend`` for ``renew`` and ``lease_ms``)."""

    def spec(hold: Hold) -> dict[str, Any]:
        return {
            **RENEWABLE[hold.claim.primitive].extend_spec(hold, owner),
            **({} if lease_ms is None else {"ttl_ms": lease_ms}),
            # a lease of 0 ms never lengthens one: extend.lua only checks the hold
            **({} if renew is None or renew(hold) else {"ttl_ms": 0}),
        }

    return spec


def _extended(holds: list[Hold], data: dict[str, Any]) -> Extended:
    """An extend reply's payload for ``holds`` (the holds of that call, in its order)."""
    return Extended(
        extended=[holds[i] for i in data.get("extended", [])],
        granted_ms=[int(ms) for ms in data.get("ttl_ms", [])],
        lost=[(holds[e["index"]], e["reason"]) for e in data.get("lost", [])],
    )
