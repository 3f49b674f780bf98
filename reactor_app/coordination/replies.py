"""Reading admission answers: the scripts' replies as ``Admitted``, ``Refused``, ``PeriodHit``
or ``ChainFailed``.

``admit.lua`` answers ``{status, json}`` for any claims (``admission_result``); the one-lock
fast path's ``lock_admit.lua`` answers a flat list, no JSON (``lock_admission``). Both carry the
same facts: the holds taken, with what their release needs (``TrackedHold``), or the refusal,
with the primitive's ``retry_after`` hint and a snapshot of the blocker in seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from reactor_app.coordination.claims import (
    AdmissionResult,
    Admitted,
    ChainFailed,
    Claim,
    Hold,
    Holder,
    LockClaim,
    OrderedLockClaim,
    OrderedPosition,
    PeriodClaim,
    PeriodHit,
    RefusalDetail,
    Refused,
    with_positions,
)
from reactor_app.coordination.scripts import ScriptReply, Status


@dataclass
class TrackedHold(Hold):
    """A ``Hold`` with what release needs from its admission (period bucket, rate-limit entry)
    and the Redis time of admission (``detail["time"]``, ``"seconds.micros"``)."""

    detail: dict[str, Any] = field(default_factory=dict)


def admission_result(reply: ScriptReply, claims: list[Claim], holder: Holder) -> AdmissionResult:
    """A general script's (``admit.lua``) answer for ``claims``, in admission order."""
    data = reply.data
    assigned = {
        claims[int(entry["index"])].key: OrderedPosition(
            nonce=int(entry["nonce"]), epoch=int(entry["epoch"])
        )
        for entry in data.get("assigned") or []
    }
    claims = with_positions(claims, assigned)
    if reply.status is Status.OK:
        holds: list[Hold] = []
        for claim, raw in zip(claims, data["holds"], strict=True):
            detail = {k: v for k, v in raw.items() if k not in ("fresh", "token", "lease")}
            detail["time"] = data["time"]
            holds.append(
                TrackedHold(
                    claim=claim,
                    fresh=bool(raw.get("fresh")),
                    token=int(raw["token"]) if raw.get("token") is not None else None,
                    lease=str(raw["lease"]) if raw.get("lease") else None,
                    detail=detail,
                )
            )
        return Admitted(holds=holds, holder=holder, assigned=assigned, woken=_ids(data))
    claim = claims[int(data.get("index", 0))]
    if reply.status is Status.PERIOD_MARKED:
        assert isinstance(claim, PeriodClaim)
        return PeriodHit(
            claim=claim,
            marked_by=data.get("marked_by") or None,
            woken=_ids(data),
            assigned=assigned,
        )
    if reply.status is Status.CHAIN_FAILED:
        assert isinstance(claim, OrderedLockClaim)
        return ChainFailed(
            claim=claim, first_failed=data.get("first_failed"), woken=_ids(data), assigned=assigned
        )
    window_ms = data.get("window_ms")
    refusal = RefusalDetail(
        status=int(reply.status),
        time=str(data.get("time", "")),
        stale=reply.status is Status.ORDERED_STALE,
        limit=_whole(data.get("limit")),
        held=_whole(data.get("held")),
        label=data.get("label"),
        window=None if window_ms is None else window_ms / 1000,
        count=_whole(data.get("count")),
        cost=_whole(data.get("cost")),
        bucket=data.get("bucket"),
        bucket_end=data.get("bucket_end"),
        nonce=data.get("nonce"),
        epoch=data.get("epoch"),
        head=data.get("head"),
        last_completed=data.get("last_completed"),
        reason=data.get("reason"),
    )
    return Refused(
        claim=claim,
        retry_after=_seconds(data.get("retry_after_ms")),
        blocker=_blocker(data.get("blocker")),
        detail=refusal,
        assigned=assigned,
        woken=_ids(data),
    )


def lock_admission(claim: LockClaim, holder: Holder, raw: Sequence[Any]) -> AdmissionResult:
    """``lua/lock_admit.lua``'s flat answer for one lock (see ``Coordinator._admit_lock``)."""
    if int(raw[0]) == Status.OK:
        hold = TrackedHold(
            claim=claim, fresh=bool(raw[2]), token=int(raw[3]), detail={"time": raw[1]}
        )
        return Admitted(holds=[hold], holder=holder)
    _, at, retry_ms, owner, step, execution, reactor, since, ttl_ms, granted_to = raw
    return Refused(
        claim=claim,
        retry_after=None if int(retry_ms) < 0 else _seconds(retry_ms),
        blocker=_blocker(
            {
                "owner": owner or None,
                "step": step,
                "execution": execution,
                "reactor": reactor,
                "since": int(since) if int(since) > 0 else None,
                "ttl_ms": None if int(ttl_ms) < 0 else int(ttl_ms),
                "granted_to": granted_to,
            }
        ),
        detail=RefusalDetail(status=int(Status.LOCKED), time=str(at)),
    )


def _ids(data: dict[str, Any]) -> list[str]:
    """The ``woken`` waiter ids of a reply (cjson encodes an empty list as ``{}``)."""
    woken = data.get("woken")
    return [str(w) for w in woken] if isinstance(woken, list) else []


def _whole(count: Any) -> Any:
    """A count as the int it is: the scripts' JSON writes numbers from 1e14 up with an
    exponent, which reads back as a float (a limit of 10**15 said "allows 1e+15.0")."""
    return int(count) if isinstance(count, float) and count.is_integer() else count


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else max(float(ms), 0.0) / 1000


def _blocker(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """Blocker snapshot with seconds: owner, step, execution, reactor, since, ttl."""
    if not raw:
        return None
    since = raw.get("since", raw.get("acquired_at", raw.get("assigned_at")))
    blocker = {
        "owner": raw.get("owner"),
        "step": raw.get("step") or None,
        "execution": raw.get("execution") or None,
        "reactor": raw.get("reactor") or None,
        "since": since / 1000 if since else None,
        "ttl": _seconds(raw.get("ttl_ms")),
    }
    if raw.get("granted_to"):
        # a free lock the last release handed to this waiter (FIFO hand-off), not yet taken
        blocker["granted_to"] = raw["granted_to"]
    return blocker
