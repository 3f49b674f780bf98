"""The live-holds index: operator listings in O(page), not O(keys) (issue 14).

The admission, release and force-release scripts keep, per key prefix, three keys (see
``lua/_common.lua``):

* ``{prefix}:holds:time`` — zset of every lock and semaphore hold, member
  ``"<user key>\\0<primitive>\\0<owner>"``, score = acquisition (Redis ms);
* ``{prefix}:holds:keys`` — the same members with score 0, so ``ZRANGEBYLEX`` finds every
  hold of a key prefix without reading the others;
* ``{prefix}:holds:counts`` — hash ``primitive -> number of members``.

A hold that ends by release or force-release leaves the index in the same script call. One
that *lapses* (a killed holder's lock key expiring, a semaphore lease running out) stays until
a reader meets it: ``page()`` checks every entry it returns against the hold itself, never
shows a lapsed one, and hands the lapsed ones to ``lua/prune_holds.lua``, which re-checks and
removes them atomically. Counts may therefore include lapsed holds not pruned yet; rows never
do.

Redis Cluster: the index keys share no hash slot with the holds, so on a cluster client the
scripts are not given them and ``page()`` falls back to a SCAN of the hold keys (O(keys));
see docs/operations.md.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from reactor_app.coordination import lock, semaphore
from reactor_app.coordination.redis import (
    current_prefix,
    get_client,
    is_cluster,
    scripts_for,
    unavailable_on_connection_error,
)

#: the primitives the index holds (the ones an operator sees as "held")
INDEXED = ("lock", "semaphore")
SEPARATOR = "\0"
#: the highest code point: an exclusive upper bound for "every member starting with a prefix"
_LEX_TOP = "\U0010ffff"


def index_keys(prefix: str | None = None) -> list[str]:
    """The index's three keys: by time, by key, counts."""
    base = f"{current_prefix(prefix)}:holds"
    return [f"{base}:time", f"{base}:keys", f"{base}:counts"]


def member(user_key: str, primitive: str, owner: str) -> str:
    return SEPARATOR.join((user_key, primitive, owner))


def split_member(text: str) -> tuple[str, str, str] | None:
    parts = text.rsplit(SEPARATOR, 2)
    if len(parts) != 3:
        return None
    return parts[0], parts[1], parts[2]


def indexed(client: Any) -> bool:
    """Whether the scripts keep the index for this client (never on a cluster)."""
    return not is_cluster(client)


@dataclass
class HoldPage:
    """One page of live holds (``state.live_holds`` rows) and where the next one starts."""

    rows: list[dict[str, Any]]
    next_cursor: str | None
    #: holds per primitive according to the index (may include lapsed ones not pruned yet)
    totals: dict[str, int] = field(default_factory=dict)


def encode_cursor(data: dict[str, Any]) -> str:
    raw = json.dumps(data, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> dict[str, Any]:
    """The cursor's data; ``ValueError`` for anything this module did not produce."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not a cursor of this listing: {cursor!r}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("m"), str):
        raise ValueError(f"not a cursor of this listing: {cursor!r}")
    return data


def totals(*, client: Any = None, prefix: str | None = None) -> dict[str, int]:
    client = client or get_client()
    with unavailable_on_connection_error():
        raw = client.hgetall(index_keys(prefix)[2])
    return {p: max(int(raw.get(p, 0)), 0) for p in INDEXED}


def _candidates(
    client: Any, prefix: str, key_prefix: str | None, after: dict[str, Any] | None, batch: int
) -> Iterator[tuple[str, float]]:
    """Index members in listing order, after the cursor: by key when a key prefix is given,
    else by acquisition time (ties by member)."""
    time_key, keys_key, _ = index_keys(prefix)
    if key_prefix is not None:
        low = f"({after['m']}" if after else f"[{key_prefix}"
        high = f"({key_prefix}{_LEX_TOP}"
        while True:
            chunk = client.zrangebylex(keys_key, low, high, start=0, num=batch)
            if not chunk:
                return
            for name in chunk:
                yield name, 0.0
            if len(chunk) < batch:
                return
            low = f"({chunk[-1]}"
    score = float(after["s"]) if after else float("-inf")
    last = after["m"] if after else None
    offset = 0  # members at ``score`` already passed (ties are ordered by member)
    while True:
        chunk = client.zrangebyscore(
            time_key, score, "+inf", start=offset, num=batch, withscores=True
        )
        if not chunk:
            return
        for name, at in chunk:
            if at == score:
                offset += 1
                if last is not None and name <= last:
                    continue
            else:
                score, offset = at, 1
            last = None
            yield name, at
        if len(chunk) < batch:
            return


def _states(client: Any, prefix: str, entries: list[tuple[str, str, str]]) -> list[Any]:
    """One pipeline: each entry's hold as it is now (lock hash + PTTL, or lease + info)."""
    pipe = client.pipeline(transaction=False)
    for user_key, primitive, owner in entries:
        if primitive == "lock":
            pipe.hgetall(lock.hold_key(user_key, prefix))
            pipe.pttl(lock.hold_key(user_key, prefix))
        else:
            pipe.zscore(semaphore.leases_key(user_key, prefix), owner)
            pipe.hmget(semaphore.holders_key(user_key, prefix), owner, semaphore.LIMIT_FIELD)
    return pipe.execute() if entries else []


def _row(
    entry: tuple[str, str, str], first: Any, second: Any, now_ms: int
) -> dict[str, Any] | None:
    """The ``live_holds`` row of an index entry, or None when its hold is gone."""
    user_key, primitive, owner = entry
    if primitive == "lock":
        fields, ttl_ms = first, second
        if not fields or fields.get("owner") != owner:
            return None
        return {
            "primitive": "lock",
            "key": user_key,
            "owner": owner,
            "step": fields.get("step") or None,
            "execution": fields.get("execution") or None,
            "reactor": fields.get("reactor") or None,
            "acquired_at": int(fields["acquired_at"]) / 1000 if fields.get("acquired_at") else None,
            "ttl_left": ttl_ms / 1000 if ttl_ms and ttl_ms > 0 else None,
            "count": int(fields.get("count") or 0),
            "token": int(fields["token"]) if fields.get("token") else None,
        }
    expiry_ms, (raw_info, raw_limit) = first, second
    if expiry_ms is None or expiry_ms <= now_ms:
        return None
    info = json.loads(raw_info or "{}")
    return {
        "primitive": "semaphore",
        "key": user_key,
        "owner": owner,
        "step": info.get("step") or None,
        "execution": info.get("execution") or None,
        "reactor": info.get("reactor") or None,
        "acquired_at": info["acquired_at"] / 1000 if info.get("acquired_at") else None,
        "ttl_left": (expiry_ms - now_ms) / 1000,
        "count": int(info.get("count", 1)),
        "token": None,
        "limit": int(raw_limit) if raw_limit else None,
    }


def _matches(row: dict[str, Any], filters: dict[str, Any]) -> bool:
    for name, wanted in filters.items():
        if wanted is None:
            continue
        if name == "level":
            if ("step" if row["step"] else "reactor") != wanted:
                return False
        elif name == "key":
            if row["key"] != wanted:
                return False
        elif name == "reactor":
            reactor = row["reactor"] or ""
            if reactor != wanted and reactor.rsplit(".", 1)[-1] != wanted:
                return False
        elif row.get(name) != wanted:
            return False
    return True


def page(
    *,
    limit: int = 50,
    cursor: str | None = None,
    key_prefix: str | None = None,
    client: Any = None,
    prefix: str | None = None,
    **filters: Any,
) -> HoldPage:
    """Up to ``limit`` live holds, in acquisition order (by key under a ``key_prefix``),
    starting after ``cursor``; ``filters``: primitive, key (exact), step, level, reactor,
    execution. Reads O(page) entries when nothing but the key prefix and primitive narrow
    the listing; other filters read on until the page is full.

    Lapsed entries met on the way are never returned and are pruned. ``ValueError`` for a bad
    cursor; ``CoordinationUnavailable`` when Redis cannot be reached.
    """
    client = client or get_client()
    prefix = current_prefix(prefix)
    after = decode_cursor(cursor) if cursor else None
    if after is not None and ("s" in after) == (key_prefix is not None):
        raise ValueError("the cursor belongs to a listing with other filters")
    if filters.get("key") is not None and key_prefix is None:
        key_prefix = filters["key"]  # an exact key is a prefix whose other matches are dropped
    wanted_primitive = filters.get("primitive")
    batch = max(limit, 50)
    rows: list[dict[str, Any]] = []
    lapsed: list[tuple[str, str, str]] = []
    next_cursor: str | None = None
    with unavailable_on_connection_error():
        seconds, micros = client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        candidates = _candidates(client, prefix, key_prefix, after, batch)
        exhausted = False
        while len(rows) < limit and not exhausted:
            chunk: list[tuple[tuple[str, str, str], str, float]] = []
            for name, at in candidates:
                entry = split_member(name)
                if entry is None:
                    continue
                chunk.append((entry, name, at))
                if len(chunk) >= batch:
                    break
            else:
                exhausted = True
            states = _states(client, prefix, [e for e, _, _ in chunk])
            for index, (entry, name, at) in enumerate(chunk):
                row = _row(entry, states[2 * index], states[2 * index + 1], now_ms)
                if row is None:
                    lapsed.append(entry)
                    continue
                if wanted_primitive is not None and entry[1] != wanted_primitive:
                    continue
                if not _matches(row, filters):
                    continue
                rows.append(row)
                if len(rows) == limit:
                    position = {"m": name} if key_prefix is not None else {"m": name, "s": at}
                    more = index < len(chunk) - 1 or not exhausted
                    next_cursor = encode_cursor(position) if more else None
                    break
        if lapsed:
            prune(lapsed, client=client, prefix=prefix)
        counts = totals(client=client, prefix=prefix)
    return HoldPage(rows=rows, next_cursor=next_cursor, totals=counts)


def prune(
    entries: list[tuple[str, str, str]], *, client: Any = None, prefix: str | None = None
) -> int:
    """Remove the index entries of holds that are gone (re-checked atomically). Returns how
    many were removed."""
    client = client or get_client()
    prefix = current_prefix(prefix)
    keys = list(index_keys(prefix))
    specs = []
    for user_key, primitive, owner in entries:
        keys.append(
            lock.hold_key(user_key, prefix)
            if primitive == "lock"
            else semaphore.leases_key(user_key, prefix)
        )
        specs.append({"p": primitive, "key": user_key, "owner": owner})
    reply = scripts_for(client).run("prune_holds", keys, [json.dumps(specs)])
    return len(reply.data.get("pruned", []))


def all_entries(*, client: Any = None, prefix: str | None = None) -> list[tuple[str, str, str]]:
    """Every entry of the index, lapsed or not (for tests and repair)."""
    client = client or get_client()
    with unavailable_on_connection_error():
        names = client.zrange(index_keys(prefix)[0], 0, -1)
    return [e for e in (split_member(n) for n in names) if e is not None]
