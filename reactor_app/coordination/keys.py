"""Redis key names: the one place they are built, and read back.

``key()`` builds every Redis key name. The user key sits inside a hash tag
(``reactor:lock:{acct:1}``), and sub-keys keep that tag (``reactor:lock:{acct:1}:fence``), so
all the data of one user key lives in one cluster slot and multi-key scripts stay legal.
"""

from __future__ import annotations

import re
from functools import lru_cache

from redis.crc import key_slot

from reactor_app.conf import reactor_settings
from reactor_app.storable import text_problem

# A brace inside the user key would move the hash tag; percent-encoding them (and "%" itself,
# so the mapping stays reversible) keeps every key of one user key in one slot.
_BRACE_ESCAPES = {"%": "%25", "{": "%7B", "}": "%7D"}
_BRACE_UNESCAPE = re.compile(r"%(25|7B|7D)")


#: the longest user key a unit of work may coordinate on: the ``key`` column of the contention
#: and event rows (``models``), which record every key a unit met
LONGEST_USER_KEY = 512


def user_key_problem(user_key: str) -> str | None:
    """Why ``user_key`` cannot be coordinated on as it is, or None.

    A NUL character or a lone surrogate (``reactor_app.storable``): PostgreSQL's text and JSON
    cannot hold one (the key's event rows were dropped by the writer), the live-holds index
    separates a member's fields with a NUL, and a lone surrogate is no UTF-8 a Redis key can
    be written in. More than ``LONGEST_USER_KEY`` characters: the
    rows' column (the rows were dropped). Refused before anything is taken, so no hold is left
    unrecorded."""
    problem = text_problem(user_key)
    if problem is not None:
        return f"contains {problem}, which the database cannot store"
    if len(user_key) > LONGEST_USER_KEY:
        return (
            f"is {len(user_key)} characters long, more than the {LONGEST_USER_KEY} the "
            "database keeps: hash the long part (e.g. hashlib.sha256(...).hexdigest())"
        )
    return None


def encode_user_key(user_key: str) -> str:
    if not isinstance(user_key, str) or not user_key:
        raise ValueError(f"a coordination key must be a non-empty string, got {user_key!r}")
    if not any(ch in user_key for ch in _BRACE_ESCAPES):
        return user_key
    return "".join(_BRACE_ESCAPES.get(ch, ch) for ch in user_key)


def decode_user_key(encoded: str) -> str:
    return _BRACE_UNESCAPE.sub(lambda m: {"25": "%", "7B": "{", "7D": "}"}[m.group(1)], encoded)


def current_prefix(prefix: str | None = None) -> str:
    """The key prefix: the explicit one, else ``REACTOR_KEY_PREFIX`` (read on every call)."""
    return prefix if prefix is not None else reactor_settings.KEY_PREFIX


def key(primitive: str, user_key: str, *parts: str, prefix: str | None = None) -> str:
    """``{prefix}:{primitive}:{<user_key>}[:part...]`` — the one place key names are built."""
    return _key(current_prefix(prefix), primitive, user_key, parts)


@lru_cache(maxsize=8192)
def _key(prefix: str, primitive: str, user_key: str, parts: tuple[str, ...]) -> str:
    # cached: every admission builds several names for the same few hot keys
    name = f"{prefix}:{primitive}:{{{encode_user_key(user_key)}}}"
    return ":".join((name, *parts)) if parts else name


def split_key(redis_key: str, primitive: str, prefix: str | None = None) -> str | None:
    """The user key of a base key ``{prefix}:{primitive}:{<user_key>}``; None for other keys."""
    head = f"{current_prefix(prefix)}:{primitive}:{{"
    if not (redis_key.startswith(head) and redis_key.endswith("}")):
        return None
    encoded = redis_key[len(head) : -1]
    if "{" in encoded or "}" in encoded:  # a sub-key such as "...}:fence" never ends with "}"
        return None
    return decode_user_key(encoded)


def glob_escape(text: str) -> str:
    """Escape Redis glob metacharacters so a prefix matches itself only in SCAN MATCH."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def hash_slot(redis_key: str) -> int:
    """The Redis Cluster hash slot of ``redis_key`` (its hash tag's, when it has one)."""
    return int(key_slot(redis_key.encode()))
