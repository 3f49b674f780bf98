"""Retry-safe script calls: a request id per call, its reply stored, a lost reply asked again.

An admission whose reply is lost (the connection broke or timed out after the request was sent)
has an unknown outcome: the script may have taken the lock, counted the semaphore slot, charged
the rate-limit window or assigned the place in line — or not. Sending it again as a new call
would take things twice (a lock re-entered one level deeper, a window charged twice); giving up
leaves what the first call took to lapse with its lease (an ordered position blocks its line
until ``poison_pill_timeout``). So each call of a ``RETRY_SAFE`` operation carries a request id,
and the script stores its reply under it for ``STORED_REPLY_TTL_MS`` (``lua/_stored_reply.lua``
wraps the operation): a call retried with the same id after an unknown outcome is answered the
stored reply, and the operation runs at most once. The caller ends up knowing what it holds.

The bound (docs/coordination.md, "Guarantees": a lost reply is asked again, not redone):
retries stop ``RETRY_WINDOW`` seconds after the first send, well inside the stored reply's
lifetime, so a retry never runs the operation a second time because its first reply expired;
past the window (or after ``RETRIES`` retries) the caller gets ``CoordinationUnavailable`` as
before, and what the lost call took lapses with its lease. A failure to *connect* is not
retried here: nothing was sent, the outcome is known.

Only a send that may repeat an earlier one looks for a stored reply: the request's first send,
written once by ``coordination.scripts`` onto a connection, skips the ``GET`` (``FIRST_SEND``:
its id is new), which was one Redis call of every admission and release.

The stored-reply key carries the hash tag of the call's first key (every key of one call shares
one cluster slot), so the call stays legal on a Redis Cluster.

One operation keeps its request id itself instead (``KEEPS_ITS_REQUEST``): the single-lock
admission (``lua/lock_admit.lua``) writes the id, with its answer's time and freshness, into the
hold it takes, and a resend that finds its own id on the hold is answered from it. A refusal
took nothing but a waiter's place, which a resend keeps (``waiter_register``), so a resend
after a lost refusal is simply answered anew. That saves the most frequent call of all a
``SET`` of a packed reply and a key left behind for 30 s (docs/benchmarks.md, "Coordination
hot path").
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import redis as redis_py

from reactor_app import forks

#: operations whose calls carry a request id and store their reply (lua/_stored_reply.lua)
RETRY_SAFE = frozenset(
    {"admit", "lock_admit", "release", "lock_release", "extend", "ordered_position"}
)

#: retry-safe operations that keep their request id in what they write, not under a stored-reply
#: key: their calls carry the id and the ``LOOK_FIRST`` flag as their last two arguments
#: (``with_request_id``), and they are not wrapped in ``lua/_stored_reply.lua``
KEEPS_ITS_REQUEST = frozenset({"lock_admit"})

#: the retry-safe operations wrapped in ``lua/_stored_reply.lua``
STORES_ITS_REPLY = RETRY_SAFE - KEEPS_ITS_REQUEST

#: how long a script keeps its reply for a retry of the same request, ms. Long enough to cover
#: RETRY_WINDOW with room to spare (the server's clock starts it when the script ran, which is
#: after the client's first send); short, because every call of a retry-safe operation leaves
#: one such key behind until then.
STORED_REPLY_TTL_MS = 30_000

#: seconds after the first send within which an unknown outcome is retried (then: raised).
#: Half the stored reply's lifetime: a retry sent later might find the reply gone and run the
#: operation again. Covers one command timeout (topology.COMMAND_TIMEOUT, 10 s) and the backoff.
RETRY_WINDOW = STORED_REPLY_TTL_MS / 1000 / 2

#: retries after an unknown outcome, and the pause before each (seconds)
RETRY_PAUSES = (0.01, 0.05, 0.2)
RETRIES = len(RETRY_PAUSES)

#: the errors after which the outcome of a sent request is unknown
UNKNOWN_OUTCOME = (redis_py.exceptions.ConnectionError, redis_py.exceptions.TimeoutError, OSError)

_T = TypeVar("_T")


class _RequestIds:
    """Request ids unique across processes: a random per-process part and a counter.

    ``itertools.count`` is thread-safe under the GIL; a forked child picks a new random part
    (``_after_fork``), so it never repeats its parent's ids.
    """

    def __init__(self) -> None:
        self._after_fork()

    def _after_fork(self) -> None:
        self.process = os.urandom(8).hex()
        self.counter = itertools.count(1)

    def new(self) -> str:
        return f"{self.process}.{next(self.counter)}"


_ids = _RequestIds()

forks.after_in_child(_ids._after_fork)


def new_request_id() -> str:
    """A request id no other call uses."""
    return _ids.new()


def reply_key(first_key: str, request_id: str) -> str:
    """The stored-reply key of ``request_id`` for a call whose first key is ``first_key``.

    It keeps ``first_key``'s hash tag (the user key of every key ``coordination.keys`` builds),
    so it hashes to the same cluster slot: ``<prefix>:lock:{acct}:reply:<request id>``. A first
    key without braces is its own tag (``{<key>}`` hashes like ``<key>``).
    """
    opening = first_key.find("{")
    closing = first_key.find("}", opening + 1) if opening >= 0 else -1
    if opening >= 0 and closing > opening + 1:
        return f"{first_key[: closing + 1]}:reply:{request_id}"
    if "{" not in first_key and "}" not in first_key:
        return f"{{{first_key}}}:reply:{request_id}"
    return f"{first_key}:reply:{request_id}"  # no usable tag: hashed whole, one server only


def with_request(
    keys: Sequence[str], args: Sequence[str | int | float], request_id: str | None = None
) -> tuple[list[str], list[str | int | float]]:
    """``keys`` and ``args`` of a retry-safe operation with its stored-reply key, lifetime and
    ``LOOK_FIRST`` appended (what ``lua/_stored_reply.lua`` takes off again): the script looks
    for a stored reply before running (``first_send`` turns that off for a first send)."""
    if not keys:
        raise ValueError("a retry-safe script call needs at least one key")
    rid = request_id or new_request_id()
    return [*keys, reply_key(keys[0], rid)], [*args, STORED_REPLY_TTL_MS, LOOK_FIRST]


def with_request_id(
    args: Sequence[str | int | float], request_id: str | None = None
) -> list[str | int | float]:
    """``args`` of a ``KEEPS_ITS_REQUEST`` operation with its request id and ``LOOK_FIRST``
    appended (the operation reads them as its last two arguments)."""
    return [*args, request_id or new_request_id(), LOOK_FIRST]


def with_retry_safety(
    operation: str, keys: Sequence[str], args: Sequence[str | int | float]
) -> tuple[Sequence[str], Sequence[str | int | float]]:
    """``keys`` and ``args`` of one call of the ``RETRY_SAFE`` ``operation``, as it takes them:
    a stored-reply key and its lifetime (``with_request``), or its request id
    (``with_request_id``); either way ``LOOK_FIRST`` last."""
    if operation in KEEPS_ITS_REQUEST:
        return keys, with_request_id(args)
    return with_request(keys, args)


#: the last argument of a retry-safe call: look for a stored reply before running — a resend,
#: or a send redis-py may repeat on its own (its retry policy, a cluster client's redirects)
LOOK_FIRST = "1"
#: ... or not: the request's first send, written once onto a connection by
#: ``coordination.scripts`` itself. Its id is new (``new_request_id``), so nothing can be
#: stored under it yet, and the script skips one Redis call
FIRST_SEND = "0"


def first_send(args: Sequence[str | int | float]) -> list[str | int | float]:
    """``args`` of ``with_request`` for the request's first send (``FIRST_SEND``)."""
    return [*args[:-1], FIRST_SEND]


class NotSent(Exception):
    """Raised by a send callable when the request could not be sent at all (wraps the cause);
    ``retrying`` re-raises the cause without retrying: nothing ran."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def retrying(send: Callable[[], _T]) -> _T:
    """``send()`` (the same request, same id, each time), again after an unknown outcome.

    Retried ``RETRIES`` times at most, and only within ``RETRY_WINDOW`` of the first send; the
    last error is raised then. ``send`` raises ``NotSent`` for a request that never left (a
    refused connection): re-raised at once as its cause.
    """
    started = time.monotonic()
    for attempt in range(RETRIES + 1):
        try:
            return send()
        except NotSent as not_sent:
            raise not_sent.cause from None
        except UNKNOWN_OUTCOME:
            if attempt == RETRIES:
                raise
            pause = RETRY_PAUSES[attempt]
            if time.monotonic() - started + pause >= RETRY_WINDOW:
                raise
            time.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def wrap_source(wrapper: str, body: str) -> str:
    """``body`` (an operation's spliced text) inside the stored-reply ``wrapper``; the
    operation's opening contract comment stays first, where a reader looks for it."""
    marker = "-- @stored_reply_body\n"
    if marker not in wrapper:
        raise RuntimeError("lua/_stored_reply.lua lost its body line")
    contract = ""
    if body.startswith("--[["):
        end = body.index("]]") + len("]]")
        contract, body = body[:end] + "\n\n", body[end:].lstrip("\n")
    return contract + wrapper.replace(marker, body.rstrip("\n") + "\n", 1)
