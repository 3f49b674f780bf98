"""Reply statuses of the Lua scripts: the one table of what each code means, and the decoder.

Every script answers ``{status_code, json_payload}``; ``STATUSES`` says what each code means to
Python (the result type built, the error it maps to) and ``decode_reply`` turns a raw answer
into a ``ScriptReply``. Apart from ``coordination.scripts``, which loads and calls the scripts,
because readers of a reply need the table and not the loading machinery.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from reactor_app.coordination import claims as claim_types
from reactor_app.exceptions import (
    CoordinationError,
    LeaseLost,
    LockAcquisitionError,
    OrderedLockWaitError,
    PeriodInFlightError,
    RateLimitExceeded,
    SemaphoreAcquisitionError,
)


class Status(IntEnum):
    """Status codes answered by the Lua scripts (first element of every reply).

    ``lua/_common.lua`` declares the same names and values for the scripts; a unit test
    (``test_lua_status_codes_match_the_python_enum``) fails when the two differ.
    """

    OK = 0
    LOCKED = 1
    SEMAPHORE_FULL = 2
    RATE_LIMITED = 3
    PERIOD_MARKED = 4
    ORDERED_WAIT = 5
    ORDERED_STALE = 6
    CHAIN_FAILED = 7
    LOST = 8
    NOT_FOUND = 9
    PERIOD_IN_FLIGHT = 10


@dataclass(frozen=True)
class StatusMeaning:
    """What a status code means to Python: the result type built and the error it maps to."""

    name: str
    result: type | None
    error: type[CoordinationError] | None


STATUSES: dict[Status, StatusMeaning] = {
    Status.OK: StatusMeaning("ok", claim_types.Admitted, None),
    Status.LOCKED: StatusMeaning("locked", claim_types.Refused, LockAcquisitionError),
    Status.SEMAPHORE_FULL: StatusMeaning(
        "semaphore_full", claim_types.Refused, SemaphoreAcquisitionError
    ),
    Status.RATE_LIMITED: StatusMeaning("rate_limited", claim_types.Refused, RateLimitExceeded),
    Status.PERIOD_MARKED: StatusMeaning("period_marked", claim_types.PeriodHit, None),
    Status.ORDERED_WAIT: StatusMeaning("ordered_wait", claim_types.Refused, OrderedLockWaitError),
    # a position from before a reset, or one already passed over: the caller must re-assign
    Status.ORDERED_STALE: StatusMeaning("ordered_stale", claim_types.Refused, OrderedLockWaitError),
    Status.CHAIN_FAILED: StatusMeaning("chain_failed", claim_types.ChainFailed, None),
    Status.LOST: StatusMeaning("lost", None, LeaseLost),
    Status.NOT_FOUND: StatusMeaning("not_found", None, None),
    # another owner's reservation of the period bucket is live: contention, not a skip
    Status.PERIOD_IN_FLIGHT: StatusMeaning(
        "period_in_flight", claim_types.Refused, PeriodInFlightError
    ),
}


@dataclass(frozen=True)
class ScriptReply:
    """A decoded script answer: its status and its JSON payload."""

    status: Status
    data: dict[str, Any]


def decode_reply(raw: Any) -> ScriptReply:
    """A script's raw ``{status, json}`` answer as a ``ScriptReply``."""
    status, payload = raw
    if not payload:
        return ScriptReply(Status(int(status)), {})
    data = json.loads(payload)
    # without "{}" in its text a payload has no empty table to turn into a list: the walk
    # over every value (a five-claim admission's reply has dozens) is skipped
    if (b"{}" if isinstance(payload, bytes) else "{}") in payload:
        data = _lists(data)
    return ScriptReply(Status(int(status)), data)


def _lists(value: Any) -> Any:
    """cjson encodes an empty Lua table as ``{}``; every payload field we read as a list."""
    if isinstance(value, dict):
        return {k: ([] if v == {} else _lists(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_lists(v) for v in value]
    return value
