"""The cancel request: a Redis flag per execution that every process running it polls.

``request_cancel`` raises the flag (``{prefix}:cancel:<id>``, the reason and who asked);
``cancel_request`` reads it — at each step boundary, at the start of every pass and at
``context.checkpoint()`` — so a cancel works whichever process is inside the run (the first
pass of a run this process has just created skips the read at its start: ``note_clear``).
Reading the flag is a Redis round trip, the largest cost of an uncoordinated step, so step
boundaries and checkpoints read it at most every ``REACTOR_CANCEL_POLL`` seconds (default
0.05) per run; a cancel requested by the very process running the execution is seen at its
next boundary. After a body that holds coordination the flag is not read on its own: the
step's release reads it in the same round trip (``flag_keys``, ``Gate.exit_unless``) and
counts as a read (``note_clear``). A worker delivery reads its execution's flag in the round
trip of its claim (``note_read``), and the start of its pass uses that read. What a cancel does
with the flag is told in ``engine.cancel``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.utils import timezone

from reactor_app.conf import reactor_settings
from reactor_app.coordination.keys import key as redis_key
from reactor_app.coordination.redis import get_client, unavailable_on_connection_error
from reactor_app.exceptions import ConfigurationError, ExecutionCancelled, InputValidationError

logger = logging.getLogger(__name__)

#: how long a cancel request outlives its execution's end (seconds): long enough for any pass
#: still in flight to see it, short enough to clean itself up
REQUEST_TTL = 7 * 86400
#: seconds the engine stops polling for cancel requests after a failed read (see cancel_request)
POLL_REST = 5.0
#: the poll's rest after a failed read: (the ``REACTOR_*`` settings version it failed under,
#: monotonic end). Settings that change meanwhile name another Redis, so the rest ends with them.
_rest: tuple[int, float] = (-1, 0.0)
#: the longest reason kept (the rest is cut): it is shown in the admin and stored on the row
MAX_REASON = 1000


def _key(execution_id: Any) -> str:
    return redis_key("cancel", str(execution_id))


#: the runs (their ids) whose flag was read and found clear, with the monotonic time of that
#: read — the most recent ``_CHECKED_KEPT`` only (an old entry just means one more read)
_checked: OrderedDict[tuple[str, ...], float] = OrderedDict()
_CHECKED_KEPT = 4096
#: executions cancelled by this very process: its own runs see them at the next boundary
_requested_here: set[str] = set()
#: flags read in the round trip of a delivery's claim (``note_read``): execution id -> (the
#: raw value, monotonic time of the read), used once by the start of that delivery's pass
_read_with_claim: dict[str, tuple[Any, float]] = {}
_guard = threading.Lock()


def request_cancel(execution_id: Any, reason: str, by: str | None) -> dict[str, Any] | None:
    """Raise the flag every process running ``execution_id`` polls.

    The first request wins: a flag already raised is kept as it is (its reason becomes the
    execution's error), and that earlier request is returned so the canceller can record the
    second one as an event of its own; None when this request raised the flag."""
    name = _key(execution_id)
    request = {"reason": reason, "by": by, "at": timezone.now().isoformat()}
    earlier: dict[str, Any] | None = None
    with unavailable_on_connection_error(key=name, primitive="cancel"):
        client = get_client()
        if not client.set(name, json.dumps(request), ex=REQUEST_TTL, nx=True):
            raw = client.get(name)
            earlier = request_from(raw) if raw else None
            if earlier is None:  # expired in between: this request is the first now
                client.set(name, json.dumps(request), ex=REQUEST_TTL)
    with _guard:
        if len(_requested_here) >= _CHECKED_KEPT:
            _requested_here.clear()  # only a shortcut: the poll still finds older requests
        _requested_here.add(str(execution_id))
    return earlier


def cancel_request(*execution_ids: Any, fresh: bool = True) -> dict[str, Any] | None:
    """The cancel request of the first of ``execution_ids`` that has one, else None.

    Polled by the engine; an unreachable Redis reads as "not cancelled" (a run is never failed
    by the poll itself). After a failed read the poll rests for ``POLL_REST`` seconds, so an
    outage does not add a connection timeout to every step of runs that need no Redis; the rest
    ends early when the ``REACTOR_*`` settings change (another Redis may be configured now).
    ``fresh=False`` (step boundaries, checkpoints) answers "not cancelled" without reading when
    the same run's flag was read clear less than ``REACTOR_CANCEL_POLL`` seconds ago."""
    global _rest
    ids = _ids(execution_ids)
    now = time.monotonic()
    if not ids or (now < _rest[1] and _rest[0] == reactor_settings.version()):
        return None
    if fresh and len(ids) == 1 and _read_with_claim:
        with _guard:
            read = _read_with_claim.pop(ids[0], None)
        # a cancel this process requested since that read is not in it: read again then
        if (
            read is not None
            and ids[0] not in _requested_here
            and now - read[1] < reactor_settings.CANCEL_POLL
        ):
            if read[0]:
                return request_from(read[0])
            _note_checked(ids, read[1])
            return None
    if not fresh and not _requested_here.intersection(ids):
        with _guard:
            last = _checked.get(ids)
        if last is not None and now - last < reactor_settings.CANCEL_POLL:
            return None
    try:
        client = get_client()
        # one key at a time: the ids need not share a cluster slot
        for execution_id in ids:
            raw = client.get(_key(execution_id))
            if raw:
                return request_from(raw)
        _note_checked(ids, now)
    except ConfigurationError:
        # no coordination Redis configured: nothing can have been cancelled through it
        _rest = (reactor_settings.version(), time.monotonic() + POLL_REST)
    except SoftTimeLimitExceeded:
        # the task's time limit, not an outage: it stops the delivery here, and no rest
        # hides a cancel from this process's next polls (docs/operations.md, "Celery time
        # limits")
        raise
    except Exception as exc:
        _rest = (reactor_settings.version(), time.monotonic() + POLL_REST)
        # one line, no traceback: an outage is the expected cause, and the poll goes on for
        # every run and step of this process (the rest keeps it to one line per POLL_REST)
        logger.warning(
            "could not read the cancel flag of %s (%s: %s); read as not cancelled, next read "
            "in %gs",
            ", ".join(ids),
            type(exc).__name__,
            exc,
            POLL_REST,
        )
    return None


def note_clear(*execution_ids: Any) -> None:
    """Count the flags of ``execution_ids`` as read clear now.

    For an execution this process has just created: a cancel names an execution by its id,
    which nobody can know before the row exists, so the first pass of that run need not read
    the flag at its start. And after a release that read the flags in its own round trip
    (``flag_keys``). Step boundaries poll from here on (at most ``REACTOR_CANCEL_POLL``
    later, as after any read)."""
    _note_checked(_ids(execution_ids), time.monotonic())


def note_read(execution_id: Any, raw: Any) -> None:
    """The flag of ``execution_id`` as a delivery's claim read it, in the claim's own round
    trip (``engine.claim.ExecutionClaim.acquire``). The start of that delivery's pass — a
    fresh read of this one flag — takes it instead of reading again, if it is younger than
    ``REACTOR_CANCEL_POLL``: the guarantee every boundary's poll gives. Used once."""
    with _guard:
        if len(_read_with_claim) >= _CHECKED_KEPT:
            _read_with_claim.clear()  # only a shortcut: an unused read means one more read
        _read_with_claim[str(execution_id)] = (raw, time.monotonic())


def flag_keys(*execution_ids: Any) -> list[str]:
    """The Redis keys of the cancel requests of ``execution_ids``: a step's release reads them
    in its own round trip and does not happen while one is raised (``Gate.exit_unless``), so
    the check after a body costs no read of its own."""
    return [_key(execution_id) for execution_id in _ids(execution_ids)]


def request_from(raw: Any) -> dict[str, Any]:
    """A raised flag's value as the request ``cancel_request`` answers."""
    data = json.loads(raw)
    return data if isinstance(data, dict) else {"reason": str(data)}


def _ids(execution_ids: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(str(i) for i in execution_ids if i))


def _note_checked(ids: tuple[str, ...], at: float) -> None:
    if not ids:
        return
    with _guard:
        _checked[ids] = at
        _checked.move_to_end(ids)
        if len(_checked) > _CHECKED_KEPT:
            _checked.popitem(last=False)


def raise_if_cancelled(
    *execution_ids: Any, reactor: str | None = None, step: str | None = None
) -> None:
    """``context.checkpoint()``: stop the step body when its execution was cancelled (the
    flag read at most every ``REACTOR_CANCEL_POLL``, see the module docstring)."""
    request = cancel_request(*execution_ids, fresh=False)
    if request is not None:
        raise cancelled_error(request, execution_ids[-1], reactor=reactor, step=step)


def cancelled_error(
    request: dict[str, Any], execution_id: Any, *, reactor: str | None, step: str | None = None
) -> ExecutionCancelled:
    reason = request.get("reason") or ""
    by = request.get("by")
    return ExecutionCancelled(
        f"execution {execution_id} was cancelled"
        + (f" by {by}" if by else "")
        + (f": {reason}" if reason else ""),
        reactor=reactor,
        step=step,
        execution_id=str(execution_id),
        reason=reason,
        by=by,
    )


def clean_reason(reason: Any) -> str:
    """The reason as stored; ``InputValidationError`` when it is not text."""
    if reason is None:
        return ""
    if not isinstance(reason, str):
        raise InputValidationError(
            f"a cancel reason must be text, got {type(reason).__name__}",
            field_errors={"reason": "must be a string"},
        )
    return reason.strip()[:MAX_REASON]
