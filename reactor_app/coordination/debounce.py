"""Debounce: a burst of starts with one key becomes one run, after the burst settles.

``start`` runs ``lua/debounce.lua`` for one start (an execution created pending): Redis keeps
each key's burst — its latest start, when the burst began, when the latest is due — and answers
which earlier start this one supersedes and how long this one waits. The engine
(``engine.debounce``) marks the superseded row and sends the new one with that countdown. The
burst lives on the Redis clock, like every other coordination time, so web processes with
skewed clocks agree on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reactor_app.coordination.keys import key
from reactor_app.coordination.redis import get_client, unavailable_on_connection_error
from reactor_app.coordination.scripts import scripts_for

PRIMITIVE = "debounce"


@dataclass(frozen=True)
class DebouncedStart:
    """One start's place in its burst."""

    #: the burst's starts before this one, which this one replaces
    earlier: list[str]
    #: seconds until this start is due to run
    due_in: float


def start(
    user_key: str,
    execution_id: str,
    *,
    quiet: float,
    max_wait: float | None = None,
    client: Any = None,
) -> DebouncedStart:
    """Record ``execution_id`` as the latest start of ``user_key``'s burst."""
    name = key(PRIMITIVE, user_key)
    reply = scripts_for(client or get_client()).run(
        "debounce",
        [name, key(PRIMITIVE, user_key, "starts")],
        [execution_id, int(quiet * 1000), "" if max_wait is None else int(max_wait * 1000)],
        key=user_key,
        primitive=PRIMITIVE,
    )
    return DebouncedStart(
        earlier=[str(start) for start in reply.data["earlier"] or []],
        due_in=float(reply.data["due_in"]) / 1000,
    )


def replacement(user_key: str, execution_id: str, *, client: Any = None) -> str | None:
    """The start that replaced ``execution_id``: the latest of the burst Redis keeps for
    ``user_key`` when ``execution_id`` is an earlier start of that burst. None when it is the
    latest, or not in that burst (its own burst is over: another began, or Redis let it go)."""
    burst = starts(user_key, client=client)
    if execution_id not in burst or burst[-1] == execution_id:
        return None
    return burst[-1]


def starts(user_key: str, *, client: Any = None) -> list[str]:
    """The starts of ``user_key``'s current burst, oldest first (empty once Redis let the
    burst go, some time after its latest start came due)."""
    with unavailable_on_connection_error(key=user_key, primitive=PRIMITIVE):
        values = (client or get_client()).lrange(key(PRIMITIVE, user_key, "starts"), 0, -1)
    return [value.decode() if isinstance(value, bytes) else str(value) for value in values]
