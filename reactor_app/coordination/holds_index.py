"""The live-holds index: operator listings in O(page), not O(keys) (issue 14).

One piece on purpose, though over the usual size: the cluster walk (its own section below) is
the second implementation behind ``_candidates`` and ``totals``, on the same key layout, member
encoding, orderings and cursors, so taken apart it would import most of this module while this
module imports it back.

The admission, release, renewal and force-release scripts keep, per key prefix, four keys (see
``lua/_common.lua``):

* ``{prefix}:holds:time`` — zset of every lock and semaphore hold, member
  ``"<user key>\\0<primitive>\\0<owner>"``, score = acquisition (Redis ms);
* ``{prefix}:holds:keys`` — the same members with score 0, so ``ZRANGEBYLEX`` finds every
  hold of a key prefix without reading the others;
* ``{prefix}:holds:ttl`` — the same members, score = lease expiry (Redis ms): listings ordered
  by time left. A renewal (``extend.lua``, a lock's re-entry, a semaphore's) moves the entry;
* ``{prefix}:holds:counts`` — hash ``"semaphore" -> number of members``; the locks are the
  by-time zset's size less that (so a lock's admission and release pay no ``HINCRBY``).

A hold that ends by release or force-release leaves the index in the same script call. One
that *lapses* (a killed holder's lock key expiring, a semaphore lease running out) stays until
a reader meets it: ``page()`` checks every entry it returns against the hold itself, never
shows a lapsed one, and hands the lapsed ones to ``lua/prune_holds.lua``, which re-checks and
removes them atomically. Counts may therefore include lapsed holds not pruned yet; rows never
do.

Redis Cluster: a script may only touch keys of one hash slot, so the index is sharded by slot.
The shard of slot ``s`` is the same four keys named ``{prefix}:holds:{<tag>}:time`` ... where
``<tag>`` is a short text that hashes to ``s`` (a table computed once per process), and every
script is given the shard of its hold's slot. A listing asks each master, in one
``lua/holds_shards.lua`` call, for its shards' next entries after the cursor and merges the
masters' answers in order (see ``_cluster_candidates``); cursors mean the same as on one server.
"""

from __future__ import annotations

import base64
import json
import math
from binascii import crc_hqx
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any

import redis as redis_py

from reactor_app.coordination import lock, primitives, semaphore
from reactor_app.coordination.keys import current_prefix, hash_slot
from reactor_app.coordination.redis import (
    get_client,
    is_cluster,
    server_time,
    unavailable_on_connection_error,
)
from reactor_app.coordination.scripts import script_sources, scripts_for

SEPARATOR = "\0"
#: the highest code point: an exclusive upper bound for "every member starting with a prefix"
_LEX_TOP = "\U0010ffff"
#: listing orders without a key prefix: acquisition time or lease expiry, either way
ORDERINGS = ("acquired", "-acquired", "ttl", "-ttl")
#: the index zset each ordering walks
_ORDER_ZSET = {"acquired": "time", "ttl": "ttl"}
#: the four index keys' suffixes, in the order the scripts take them (counts last)
SUFFIXES = ("time", "keys", "ttl", "counts")
SLOTS = 16384


def index_keys(prefix: str | None = None, *, slot: int | None = None) -> list[str]:
    """The index's four keys — by time, by key, by expiry, counts — of one server, or with
    ``slot`` the cluster shard of that hash slot."""
    prefix = current_prefix(prefix)
    if slot is None:
        return [f"{prefix}:holds:{suffix}" for suffix in SUFFIXES]
    return list(_shard_keys(prefix, slot))


@lru_cache(maxsize=4096)
def _shard_keys(prefix: str, slot: int) -> tuple[str, ...]:
    tag = slot_tags()[slot]
    return tuple(f"{prefix}:holds:{{{tag}}}:{suffix}" for suffix in SUFFIXES)


@cache
def slot_tags() -> tuple[str, ...]:
    """For every hash slot, a short text whose hash slot it is (``{text}`` as a hash tag puts a
    key in that slot): the lowest hexadecimal number that does. Once per process, at its first
    index key on a cluster: ~0.1 s with the CRC taken directly (a hex text has no ``{}`` for
    ``hash_slot`` to look for; through it, a second or more on a busy machine — time a lease
    was then counting)."""
    tags: list[str | None] = [None] * SLOTS
    missing, number = SLOTS, 0
    while missing:
        tag = b"%x" % number
        slot = crc_hqx(tag, 0) % SLOTS  # Redis Cluster's key slot: CRC16 (XMODEM) mod 16384
        if tags[slot] is None:
            tags[slot] = tag.decode()
            missing -= 1
        number += 1
    return tuple(t for t in tags if t is not None)


def keys_for(user_key: str, prefix: str | None = None, *, sharded: bool = False) -> list[str]:
    """The index keys a script touching ``user_key``'s hold is given: one server's, or
    (``sharded``: a cluster) the shard of the hold's hash slot."""
    prefix = current_prefix(prefix)
    if not sharded:
        return index_keys(prefix)
    return index_keys(prefix, slot=hash_slot(lock.hold_key(user_key, prefix)))


def is_index_group(keys: list[str]) -> bool:
    """Whether a script's key group ends with index keys (so it carries ``ik``)."""
    return bool(keys) and keys[-1].endswith(":counts") and ":holds" in keys[-1]


def member(user_key: str, primitive: str, owner: str) -> str:
    return SEPARATOR.join((user_key, primitive, owner))


def split_member(text: str) -> tuple[str, str, str] | None:
    """``(user key, primitive, owner)`` of an index member; None for one this version cannot
    read — malformed, or naming a primitive it has no holding module for (a Redis shared with
    another version, a hand edit): listings pass such members over rather than fail."""
    parts = text.rsplit(SEPARATOR, 2)
    if len(parts) != 3 or parts[1] not in primitives.HOLDING:
        return None
    return parts[0], parts[1], parts[2]


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
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("m"), str)
        or ("s" in data and not _finite_number(data["s"]))
        or data.get("o", "acquired") not in ORDERINGS
    ):
        raise ValueError(f"not a cursor of this listing: {cursor!r}")
    return data


def _finite_number(value: Any) -> bool:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


def totals(*, client: Any = None, prefix: str | None = None) -> dict[str, int]:
    """Holds per primitive according to the index (lapsed ones not pruned yet included)."""
    client = client or get_client()
    prefix = current_prefix(prefix)
    with unavailable_on_connection_error():
        if is_cluster(client):
            raw: dict[str, int] = {}
            for flat in _per_master(client, prefix, "time", ["counts"]):
                for name, value in zip(flat[::2], flat[1::2], strict=True):
                    raw[name] = raw.get(name, 0) + int(value)
            every, semaphores = raw.get("all", 0), raw.get(semaphore.PRIMITIVE, 0)
        else:
            time_key, _, _, counts_key = index_keys(prefix)
            pipe = client.pipeline(transaction=False)
            pipe.zcard(time_key)
            pipe.hget(counts_key, semaphore.PRIMITIVE)
            every, semaphores = pipe.execute()
    semaphores = max(int(semaphores or 0), 0)
    # the scripts count the semaphores' entries only (see the module docstring)
    return {lock.PRIMITIVE: max(int(every) - semaphores, 0), semaphore.PRIMITIVE: semaphores}


def _candidates(
    client: Any,
    prefix: str,
    key_prefix: str | None,
    ordering: str,
    after: dict[str, Any] | None,
    batch: int,
) -> Iterator[tuple[str, float]]:
    """Index members in listing order, after the cursor: by key when a key prefix is given,
    else by acquisition time or lease expiry (``ordering``; ties by member, descending when
    the order is)."""
    if is_cluster(client):
        yield from _cluster_candidates(client, prefix, key_prefix, ordering, after, batch)
        return
    time_key, keys_key, ttl_key, _ = index_keys(prefix)
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
    reverse = ordering.startswith("-")
    zset = ttl_key if ordering.lstrip("-") == "ttl" else time_key
    score = float(after["s"]) if after else (math.inf if reverse else -math.inf)
    last = after["m"] if after else None
    offset = 0  # members at ``score`` already passed (ties are ordered by member)
    while True:
        if reverse:
            chunk = client.zrevrangebyscore(
                zset, score, "-inf", start=offset, num=batch, withscores=True
            )
        else:
            chunk = client.zrangebyscore(
                zset, score, "+inf", start=offset, num=batch, withscores=True
            )
        if not chunk:
            return
        for name, at in chunk:
            if at == score:
                offset += 1
                if last is not None and (name >= last if reverse else name <= last):
                    continue
            else:
                score, offset = at, 1
            last = None
            yield name, at
        if len(chunk) < batch:
            return


# -- Redis Cluster: the shards of every master, merged ----------------------------------------


@cache
def _shards_script() -> str:
    """``lua/holds_shards.lua`` with the table of every slot's hash tag spliced in."""
    table = "local SLOT_TAGS = {" + ",".join(f"'{tag}'" for tag in slot_tags()) + "}"
    return script_sources()["holds_shards"].replace("-- @slot-tags", table, 1)


def _masters(client: Any) -> list[tuple[Any, str]]:
    """Every master node and the slots it serves, as ranges "a-b,c-d" (the client's map)."""
    cache = client.nodes_manager.slots_cache
    ranges: dict[str, tuple[Any, list[str]]] = {}
    current, first = None, 0
    for slot in range(SLOTS + 1):
        nodes = cache.get(slot) if slot < SLOTS else None
        node = nodes[0] if nodes else None
        if node is not current:
            if current is not None:
                ranges.setdefault(current.name, (current, []))[1].append(f"{first}-{slot - 1}")
            current, first = node, slot
    return [(node, ",".join(parts)) for node, parts in ranges.values()]


#: the script's SHA1 as loaded (on every master, by SCRIPT LOAD)
_shards_sha: dict[str, str] = {}


def _per_master(client: Any, prefix: str, suffix: str, args: list[str]) -> list[list[Any]]:
    """``lua/holds_shards.lua`` on every master over its slots' shards of the index key
    ``suffix``: one call each (the script may read keys of several slots of its own node).
    ``args``: the script's ARGV[1..4] (padded)."""
    source = _shards_script()
    head = [*args, "", "", ""][:4]

    def ask(master: tuple[Any, str]) -> Any:
        node, slots = master
        call = [*head, prefix, suffix, slots]
        sha = _shards_sha.get(source)
        try:
            if sha is None:
                raise redis_py.exceptions.NoScriptError("not loaded yet")
            return client.execute_command("EVALSHA", sha, 0, *call, target_nodes=node)
        except redis_py.exceptions.NoScriptError:
            sha = _shards_sha[source] = client.script_load(source)
            return client.execute_command("EVALSHA", sha, 0, *call, target_nodes=node)

    # the masters work at once: a page waits for the slowest, not for their sum
    masters = _masters(client)
    with ThreadPoolExecutor(max_workers=len(masters) or 1) as pool:
        return list(pool.map(ask, masters))


def _cluster_candidates(
    client: Any,
    prefix: str,
    key_prefix: str | None,
    ordering: str,
    after: dict[str, Any] | None,
    batch: int,
) -> Iterator[tuple[str, float]]:
    """``_candidates`` on a cluster. Each round every master answers, for its shards, the
    entries after the position up to a bound below which it answered every one (the
    ``batch``-th smallest head of its shards, or a shard's last entry when it gave ``batch``);
    the masters' answers up to the smallest of their bounds are the next entries in order."""
    if key_prefix is not None:
        last = after["m"] if after else None
        while True:
            low = f"({last}" if last is not None else f"[{key_prefix}"
            high = f"({key_prefix}{_LEX_TOP}"
            answers = _per_master(client, prefix, "keys", ["lex", low, high, str(batch)])
            entries: list[str] = []
            bound: str | None = None  # None: every master answered everything
            for answer in answers:
                caps, names = int(answer[0]), answer[1:]
                for cap in names[:caps]:
                    bound = cap if bound is None else min(bound, cap)
                entries += names[caps:]
            entries = sorted(
                n
                for n in set(entries)
                if (last is None or n > last) and (bound is None or n <= bound)
            )
            for name in entries:
                yield name, 0.0
            if bound is None:
                return
            last = entries[-1] if entries else bound
    reverse = ordering.startswith("-")
    position: tuple[float, str] | None = (float(after["s"]), after["m"]) if after else None
    suffix = _ORDER_ZSET[ordering.lstrip("-")]

    def later(entry: tuple[float, str], than: tuple[float, str]) -> bool:
        return entry < than if reverse else entry > than

    while True:
        cursor = "" if position is None else repr(position[0])
        answers = _per_master(
            client, prefix, suffix, ["desc" if reverse else "asc", cursor, str(batch)]
        )
        found: list[tuple[float, str]] = []
        limit: tuple[float, str] | None = None  # None: everything answered
        for answer in answers:
            head, caps = answer[0], int(answer[1])
            rest = answer[2:]
            bounds = [(float(rest[i + 1]), rest[i]) for i in range(0, 2 * caps, 2)]
            if head != "":
                # every entry scored up to ``head`` (inclusive) was answered
                bounds.append((float(head), "" if reverse else _LEX_TOP))
            for candidate in bounds:
                if limit is None or later(limit, candidate):
                    limit = candidate
            rest = rest[2 * caps :]
            found += [(float(rest[i + 1]), rest[i]) for i in range(0, len(rest), 2)]
        chosen = sorted(
            {
                e
                for e in found
                if (position is None or later(e, position))
                and (limit is None or not later(e, limit))
            },
            reverse=reverse,
        )
        for at, name in chosen:
            yield name, at
        if limit is None:
            return
        if chosen:
            position = chosen[-1]
        else:  # pragma: no cover - a bound always lets at least one entry through
            return


def _states(client: Any, prefix: str, entries: list[tuple[str, str, str]]) -> list[Any]:
    """One pipeline: each entry's hold as it is now (lock hash + PTTL, or lease + info)."""
    pipe = client.pipeline(transaction=False)
    for user_key, primitive, owner in entries:
        primitives.holding(primitive).index_read(pipe, user_key, owner, prefix)
    return pipe.execute() if entries else []


def _row(
    entry: tuple[str, str, str], first: Any, second: Any, now_ms: int
) -> dict[str, Any] | None:
    """The ``live_holds`` row of an index entry, or None when its hold is gone."""
    user_key, primitive, owner = entry
    return primitives.holding(primitive).index_row(user_key, owner, first, second, now_ms)


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
    ordering: str | None = None,
    client: Any = None,
    prefix: str | None = None,
    **filters: Any,
) -> HoldPage:
    """Up to ``limit`` live holds starting after ``cursor``: by key under a ``key_prefix``
    (or an exact ``key``), else in ``ordering`` — ``acquired`` (the default: oldest first),
    ``-acquired``, ``ttl`` (least time left first) or ``-ttl``. ``filters``: primitive, key
    (exact), step, level, reactor, execution. Reads O(page) entries when nothing but the key
    prefix and primitive narrow the listing; other filters read on until the page is full.

    Every hold present for the whole walk is listed exactly once across the pages; in a
    ``ttl`` ordering a hold whose lease is renewed meanwhile moves (it may be listed again,
    or, walking ``-ttl``, jump behind the cursor). Lapsed entries met on the way are never
    returned and are pruned. ``ValueError`` for a bad cursor or ordering (an ordering with
    a key prefix: those list by key); ``CoordinationUnavailable`` when Redis cannot be
    reached.
    """
    client = client or get_client()
    prefix = current_prefix(prefix)
    if filters.get("key") is not None and key_prefix is None:
        # an exact key: the prefix of its own members only ("<key>\0<primitive>\0<owner>"),
        # not of every longer key that starts with it
        key_prefix = filters["key"] + SEPARATOR
    if ordering is not None and ordering not in ORDERINGS:
        raise ValueError(f"ordering must be one of {', '.join(ORDERINGS)}, not {ordering!r}")
    if ordering is not None and key_prefix is not None:
        raise ValueError("a listing by key prefix (or key) is ordered by key: no ordering")
    ordering = ordering or "acquired"
    after = decode_cursor(cursor) if cursor else None
    if after is not None and (
        ("s" in after) == (key_prefix is not None) or after.get("o", "acquired") != ordering
    ):
        raise ValueError("the cursor belongs to a listing with other filters")
    wanted_primitive = filters.get("primitive")
    batch = max(limit, 50)
    rows: list[dict[str, Any]] = []
    lapsed: list[tuple[str, str, str]] = []
    next_cursor: str | None = None
    with unavailable_on_connection_error():
        seconds, micros = server_time(client)
        now_ms = seconds * 1000 + micros // 1000
        candidates = _candidates(client, prefix, key_prefix, ordering, after, batch)
        exhausted = False
        while len(rows) < limit and not exhausted:
            chunk: list[tuple[tuple[str, str, str], str, float]] = []
            for name, at in candidates:
                entry = split_member(name)
                if entry is None:
                    continue
                if wanted_primitive is not None and entry[1] != wanted_primitive:
                    continue  # never read: the filter costs no state reads
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
                if not _matches(row, filters):
                    continue
                rows.append(row)
                if len(rows) == limit:
                    position: dict[str, Any] = {"m": name}
                    if key_prefix is None:
                        position["s"] = at
                        if ordering != "acquired":
                            position["o"] = ordering
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
    many were removed. On a cluster, one call per hash slot (with that slot's shard)."""
    client = client or get_client()
    prefix = current_prefix(prefix)
    sharded = is_cluster(client)
    groups: dict[int | None, list[tuple[str, str, str]]] = {}
    for entry in entries:
        slot = hash_slot(lock.hold_key(entry[0], prefix)) if sharded else None
        groups.setdefault(slot, []).append(entry)
    removed = 0
    for slot, group in groups.items():
        keys = index_keys(prefix, slot=slot)
        specs = []
        for user_key, primitive, owner in group:
            keys.append(primitives.holding(primitive).live_key(user_key, prefix))
            specs.append({"p": primitive, "key": user_key, "owner": owner})
        reply = scripts_for(client).run("prune_holds", keys, [json.dumps(specs)])
        removed += len(reply.data.get("pruned", []))
    return removed


def all_entries(*, client: Any = None, prefix: str | None = None) -> list[tuple[str, str, str]]:
    """Every entry of the index, lapsed or not, by acquisition (for tests and repair)."""
    client = client or get_client()
    prefix = current_prefix(prefix)
    with unavailable_on_connection_error():
        names = [n for n, _ in _candidates(client, prefix, None, "acquired", None, 1000)]
    return [e for e in (split_member(n) for n in names) if e is not None]


def expiry_entries(
    *, client: Any = None, prefix: str | None = None
) -> list[tuple[tuple[str, str, str], int]]:
    """Every entry of the by-expiry zset with its expiry ms, lapsed or not (for tests)."""
    client = client or get_client()
    prefix = current_prefix(prefix)
    with unavailable_on_connection_error():
        pairs = list(_candidates(client, prefix, None, "ttl", None, 1000))
    return [(e, int(at)) for e, at in ((split_member(n), at) for n, at in pairs) if e is not None]
