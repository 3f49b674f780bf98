"""The Redis Functions library: every operation script as one function, loaded once per server.

An ``EVALSHA`` script runs its whole text on each call, so each call of a general script defined
its forty-odd shared helpers and its primitives' dispatch tables again (measured at 16 µs of
server time per call on one host; docs/benchmarks.md, "Functions library"). A Functions library
(Redis 7.0+) runs its top level once, at ``FUNCTION LOAD``: the fragments' helpers are defined
there, and an ``FCALL`` runs only its operation's own text (``lua/_library.lua`` is the frame
and says how the operations' ``KEYS``/``ARGV`` reach them).

Where the library lives: functions are part of the dataset — replicated, persisted, kept by a
replica promoted in a failover. A server that lost them (restarted empty, ``FUNCTION FLUSH``,
a cluster master that never had them) answers "Function not found": ``coordination.scripts``
loads the library then (``load``: ``FUNCTION LOAD REPLACE``, on every master of a cluster) and
sends the call again — nothing ran, so that resend is safe for any operation.

A server without Functions (Redis < 7: the embedded 6.2 among them) answers ``FCALL`` with
"unknown command", and an ACL may refuse the user ``FCALL`` or ``FUNCTION LOAD`` while it
allows scripts: ``coordination.scripts`` then sends that client's calls as ``EVALSHA``
scripts, the same Lua with the fragments spliced into each (``script_sources``) — a fallback
with the same behaviour, only slower on the server (docs/coordination.md, "Scripts and the
Functions library").

The library's name and its functions' names carry a digest of its text, so two versions of the
application on one server (a rolling deploy) each load and call their own; an old version's
library stays until deleted (``FUNCTION DELETE reactor_app_<digest>``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import redis as redis_py

from reactor_app.coordination.script_sources import includes, lua_parts, without_includes
from reactor_app.coordination.stored_replies import STORES_ITS_REPLY

#: the frame the library is assembled in
LIBRARY_FRAME = "_library.lua"
#: operations sent as ``EVALSHA`` scripts only: ``holds_shards`` reads keys of every slot of a
#: cluster master (called per master by ``coordination.holds_index``, its slot table spliced
#: into its text there), an operator's read that gains nothing from the library
NOT_IN_LIBRARY = frozenset({"holds_shards"})
#: what a library's name starts with (then the digest of its text)
NAME_PREFIX = "reactor_app_"

_FRAGMENTS_LINE = re.compile(r"^-- @fragments\n", re.MULTILINE)
_OPERATIONS_LINE = re.compile(r"^-- @operations\n", re.MULTILINE)
#: where an operation's text stops defining and starts doing: what precedes it (its helpers,
#: its dispatch tables, the primitives' sections registering in them) runs once, when the
#: library loads; what follows is the function's body, run on each call
_PER_CALL = re.compile(r"^-- @per_call\n", re.MULTILINE)
_SHEBANG = re.compile(r"\A#!lua(?: flags=(\S*))?[^\n]*\n")
_PREFIX = "@function_prefix@"


@dataclass(frozen=True)
class Library:
    """The assembled library: what ``FUNCTION LOAD`` takes, and each operation's function."""

    name: str
    source: str
    #: ``{operation: function name}``
    functions: dict[str, str]


@cache
def library() -> Library:
    """The library of every operation of the installed package (but ``NOT_IN_LIBRARY``).

    The fragments go in once, at the top, in the order the operations first include them (an
    operation includes a fragment after those it needs). Each operation becomes one function:
    the part of its text before a ``-- @per_call`` line (the general scripts' helpers and
    dispatch tables; the call's own values are locals they declare there and set after the
    line) runs once, at load; the rest, or the whole text, is the body run per call. A
    retry-safe one that stores its reply (``stored_replies.STORES_ITS_REPLY``) runs inside
    the frame's ``stored_reply``; the flags of a ``#!lua flags=`` line become the function's
    flags.
    """
    parts = lua_parts()
    operations = {
        name: text for name, text in parts.operations.items() if name not in NOT_IN_LIBRARY
    }
    order: list[str] = []
    for text in operations.values():
        for fragment in includes(text):
            if fragment not in parts.fragments:
                raise RuntimeError(f"lua include {fragment!r} not found")
            if fragment not in order:
                order.append(fragment)
    frame = parts.fragments[LIBRARY_FRAME]
    fragments = "".join(parts.fragments[name].rstrip("\n") + "\n\n" for name in order)
    blocks = "".join(_function_block(name, text) for name, text in operations.items())
    body = _OPERATIONS_LINE.sub(
        lambda _: blocks, _FRAGMENTS_LINE.sub(lambda _: fragments, frame, count=1), count=1
    )
    digest = hashlib.sha1(body.encode()).hexdigest()[:16]
    name = f"{NAME_PREFIX}{digest}"
    prefix = f"reactor_{digest}_"
    return Library(
        name=name,
        source=f"#!lua name={name}\n" + body.replace(_PREFIX, prefix),
        functions={operation: prefix + operation for operation in operations},
    )


def _function_block(operation: str, text: str) -> str:
    """One operation as a ``do`` block registering its function."""
    flags = ""
    shebang = _SHEBANG.match(text)
    if shebang:
        text = text[shebang.end() :]
        if shebang.group(1):
            flags = ", flags = {" + ", ".join(f"'{f}'" for f in shebang.group(1).split(",")) + "}"
    run = "stored_reply(body)" if operation in STORES_ITS_REPLY else "body()"
    once, per_call = "", without_includes(text)
    marker = _PER_CALL.search(per_call)
    if marker:
        once, per_call = per_call[: marker.start()], per_call[marker.end() :]
    return (
        f"do -- {operation}.lua\n"
        f"{once.strip(chr(10))}\n"
        "local function body()\n"
        f"{per_call.strip(chr(10))}\n"
        "end\n"
        f"redis.register_function{{function_name = '{_PREFIX}{operation}',"
        " callback = function(keys, args)\n"
        "  KEYS, ARGV = keys, args\n"
        f"  return {run}\n"
        f"end{flags}}}\n"
        "end\n\n"
    )


def load(client: Any) -> None:
    """``FUNCTION LOAD REPLACE`` the library on ``client``'s server — on every master, for a
    cluster client (redis-py sends ``FUNCTION LOAD`` to each). Replacing an identical library
    is harmless: two processes loading it at once both succeed."""
    client.function_load(library().source, replace=True)


def is_missing(error: BaseException) -> bool:
    """Whether ``error`` is the server's answer to an ``FCALL`` of a function it does not
    have (restarted empty, flushed, a new master): load the library, send again."""
    return "Function not found" in str(error)


def is_unsupported(error: BaseException) -> bool:
    """Whether ``error`` says this client cannot use Functions: the server has none (Redis < 7:
    ``FCALL`` is an unknown command), or its ACL refuses the user ``FCALL`` or ``FUNCTION
    LOAD`` (a managed service may allow scripts and not Functions). Send ``EVALSHA`` scripts
    instead."""
    text = str(error).lower()
    if isinstance(error, redis_py.exceptions.NoPermissionError):
        return "'fcall" in text or "'function" in text
    return "unknown command" in text and "fcall" in text
