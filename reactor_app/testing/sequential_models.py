"""Sequential models of the coordination primitives, for ``linearizability.check``.

Each model says which operations are legal in which state. What a history's operations carry
(``Operation.value``, the invocation's values updated with the completion's):

* every hold (acquire ... release): ``session`` — one id shared by a hold's acquire, extends
  and release (the shrink drops a hold as a whole);
* ``acquire`` / ``admit``: ``admitted`` (False: refused — nothing taken, nothing checked),
  ``ttl`` (lease seconds), ``token`` (lock), ``position`` (ordered lock), ``limit``
  (semaphore), ``cost``, ``window``, ``limit`` (rate limit);
* ``release``: ``released`` (the store found the hold and freed it);
* ``extend``: ``extended``;
* ``complete`` (period): ``marked`` (the bucket was marked done);
* ``write`` (fenced register): ``token``, ``accepted``;
* ``lose`` (the nemesis, key ``None``): state may have been lost (a Redis restarted empty, a
  failover that lost the last writes).

**Leases are modelled honestly.** A hold taken at some instant of ``[call, ret]`` with lease
``ttl`` can expire no earlier than ``call + ttl`` (``slack_ns`` earlier, for the server's own
clock). After that, another holder may legitimately take it — that is what a lease is, and
why a holder paused past its lease must be *fenced*: the fenced register is where "a stale
holder's write is refused" is checked. Renewals nobody recorded (a step's auto-extend) only
make this bound early, which lets more histories pass, never fewer; record ``extend`` for a
tighter check.

**Only grants are checked, never refusals.** A refusal takes nothing, so it cannot break
safety, and leaving it unchecked keeps a property the shrink relies on: dropping a hold from a
history only removes constraints.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from itertools import combinations
from typing import Any, cast

from reactor_app.testing.history import Operation

#: how early a lease may lapse against the client's clock (Redis's own clock, its rounding)
DEFAULT_SLACK_NS = 25_000_000
#: holds up to which every subset of a state's expirable holds is explored
SUBSETS_UP_TO = 5


def _ttl_ns(op: Operation, default: float) -> int:
    ttl = op.value.get("ttl")
    return int(float(default if ttl is None else ttl) * 1e9)


def _comparable(value: Any) -> Any:
    return tuple(_comparable(v) for v in value) if isinstance(value, list | tuple) else value


def _granted(op: Operation, flag: str = "admitted") -> bool:
    """An op that took something: ``ok`` with the flag true, or ``info`` (outcome unknown:
    placed by the search, it happened)."""
    return op.status == "info" or bool(op.value.get(flag, True))


def _subsets(items: tuple[Any, ...], at_least: int = 0) -> Iterator[tuple[Any, ...]]:
    """Subsets of ``items`` with at least ``at_least`` members (all of them for few items,
    else the smallest and the whole)."""
    if len(items) <= SUBSETS_UP_TO:
        for size in range(max(at_least, 0), len(items) + 1):
            yield from combinations(items, size)
    else:
        if at_least <= len(items):
            yield items[: max(at_least, 0)]
        yield items


@dataclass(frozen=True)
class MutexModel:
    """A lock with leases: one holder at a time; a holder's lease lapses no earlier than its
    acquisition's ``call + ttl``; the values of ``order_field`` (fencing ``token``; the ordered
    lock's ``position``) strictly increase in acquisition order, across lost state too (the
    token floor is Redis ``TIME``) — except that the holder itself may take its hold again
    with the same value while nobody else took it in between (an ordered lock's execution
    redelivered after a crash resumes its own place in line).

    State: ``(holder session | None, lease lower bound ns | None, last order value | None)``.
    """

    name: str = "mutex"
    order_field: str | None = "token"
    #: whether the order survives lost state (tokens do: their floor is Redis TIME; an
    #: ordered lock's line restarted empty numbers its positions again)
    order_survives_loss: bool = True
    default_ttl: float = 60.0
    slack_ns: int = DEFAULT_SLACK_NS

    def init(self) -> Hashable:
        return (None, None, None)

    def relevant(self, op: Operation) -> bool:
        if op.key is None:
            return op.f == "lose"
        if op.f == "acquire":
            return _granted(op)
        return op.f in ("release", "extend")

    def only_constrains(self, op: Operation) -> bool:
        return op.f == "acquire"

    def _may_have_lapsed(self, bound: int | None, op: Operation) -> bool:
        return bound is None or op.ret is None or bound - self.slack_ns <= op.ret

    def step(self, state: Hashable, op: Operation) -> Iterable[Hashable]:
        holder, bound, last = cast(tuple[str | None, int | None, Any], state)
        session = op.value.get("session", op.id)
        if op.f == "lose":
            return [state, (None, None, last if self.order_survives_loss else None)]
        if op.f == "acquire":
            if holder is not None and holder != session and not self._may_have_lapsed(bound, op):
                return []
            seen = op.value.get(self.order_field) if self.order_field else None
            if seen is not None:
                seen = _comparable(seen)
                # the holder taking its own hold again (an ordered lock's redelivery resuming
                # its place in line) keeps its value; anyone else's must be higher
                again = holder == session and seen == last
                if last is not None and seen <= last and not again:
                    return []
                last = seen
            lease = op.call + _ttl_ns(op, self.default_ttl)
            if holder == session and bound is not None:
                lease = max(lease, bound)
            return [(session, lease, last)]
        if op.f == "extend" and _granted(op, "extended"):
            if op.status == "info" and holder != session:
                return [state]
            if holder != session:
                return []
            return [(session, max(bound or 0, op.call + _ttl_ns(op, self.default_ttl)), last)]
        # release, or an extend that found nothing: the hold is gone after it
        if holder != session:
            # "freed" a hold it did not have: it freed someone else's
            return [] if op.status == "ok" and op.value.get("released", False) else [state]
        if op.status == "info" or op.value.get("released", False):
            return [(None, None, last)]
        # "not held" while it was ours: legal only once the lease may have lapsed
        return [(None, None, last)] if self._may_have_lapsed(bound, op) else []


@dataclass(frozen=True)
class SemaphoreModel:
    """``limit`` slots (the acquire's ``limit``, else the model's) with leases, as
    ``MutexModel``'s. State: a frozen set of ``(session, lease lower bound ns)``."""

    name: str = "semaphore"
    limit: int = 1
    default_ttl: float = 60.0
    slack_ns: int = DEFAULT_SLACK_NS

    def init(self) -> Hashable:
        return frozenset()

    def relevant(self, op: Operation) -> bool:
        if op.key is None:
            return op.f == "lose"
        if op.f == "acquire":
            return _granted(op)
        return op.f in ("release", "extend")

    def only_constrains(self, op: Operation) -> bool:
        return op.f == "acquire"

    def step(self, state: Hashable, op: Operation) -> Iterable[Hashable]:
        holds = cast(frozenset[tuple[str, int]], state)
        session = op.value.get("session", op.id)
        mine = [h for h in holds if h[0] == session]
        if op.f == "lose":
            return [holds - set(gone) for gone in _subsets(tuple(sorted(holds)))]
        if op.f == "acquire":
            lease = op.call + _ttl_ns(op, self.default_ttl)
            if mine:
                return [holds - set(mine) | {(session, max(lease, mine[0][1]))}]
            limit = int(op.value.get("limit") or self.limit)
            lapsable = tuple(
                sorted(h for h in holds if op.ret is None or h[1] - self.slack_ns <= op.ret)
            )
            need = len(holds) + 1 - limit
            return [holds - set(gone) | {(session, lease)} for gone in _subsets(lapsable, need)]
        if op.f == "extend" and _granted(op, "extended"):
            if not mine:
                return [holds] if op.status == "info" else []
            lease = op.call + _ttl_ns(op, self.default_ttl)
            return [holds - set(mine) | {(session, max(lease, mine[0][1]))}]
        if not mine:
            return [] if op.status == "ok" and op.value.get("released", False) else [holds]
        if op.status == "info" or op.value.get("released", False):
            return [holds - set(mine)]
        lapsed = op.ret is None or mine[0][1] - self.slack_ns <= op.ret
        return [holds - set(mine)] if lapsed else []


@dataclass(frozen=True)
class FencedRegisterModel:
    """A row written with ``fenced_update``: a write is accepted only with a token at least
    the highest accepted so far (equal: the same holder writing again). State: that token.
    A database is not the coordination store: lost Redis state does not concern it."""

    name: str = "fenced register"

    def init(self) -> Hashable:
        return None

    def relevant(self, op: Operation) -> bool:
        return op.f == "write" and op.key is not None and _granted(op, "accepted")

    def only_constrains(self, op: Operation) -> bool:
        return True  # an accepted write only raises the bar

    def step(self, state: Hashable, op: Operation) -> Iterable[Hashable]:
        token = int(op.value["token"])
        if state is not None and token < state:  # type: ignore[operator]
            # an accepted write below an accepted token is the violation; an unknown one was
            # refused (which the row's condition decides, not the search)
            return [state] if op.status == "info" else []
        return [token]


@dataclass(frozen=True)
class RateLimitModel:
    """A sliding window: the admissions of any ``window`` seconds cost at most ``limit``
    (the acquire's ``window`` / ``limit`` / ``cost``, else the model's).

    An admission placed at ``p`` counts against one at ``p'`` while ``p' - p < window``.
    Only the times' bounds are known, so an earlier admission is certainly inside a later
    one's window when ``later.ret - earlier.call < window`` (minus the slack), and those are
    the ones summed. State: ``(admissions (call, ret, cost) that may still count, the
    latest invocation placed)`` — later placements are at least that late, which retires
    admissions for good.
    """

    name: str = "rate limit"
    window: float = 1.0
    limit: int = 1
    slack_ns: int = DEFAULT_SLACK_NS

    def init(self) -> Hashable:
        return ((), 0)

    def relevant(self, op: Operation) -> bool:
        if op.key is None:
            return op.f == "lose"
        return op.f == "acquire" and _granted(op)

    def only_constrains(self, op: Operation) -> bool:
        return op.f == "acquire"

    def step(self, state: Hashable, op: Operation) -> Iterable[Hashable]:
        admissions, floor = cast(tuple[tuple[tuple[int, int, int], ...], int], state)
        if op.f == "lose":
            return [state, ((), floor)]
        window = int(float(op.value.get("window") or self.window) * 1e9)
        limit = int(op.value.get("limit") or self.limit)
        cost = int(op.value.get("cost") or 1)
        latest = op.ret if op.ret is not None else None
        if latest is not None:
            inside = sum(c for call, _, c in admissions if latest - call < window - self.slack_ns)
            if inside + cost > limit:
                return []
        floor = max(floor, op.call)
        end = op.ret if op.ret is not None else 2**63
        kept = [a for a in admissions if floor - a[1] < window + self.slack_ns]
        return [(tuple(sorted([*kept, (op.call, end, cost)])), floor)]


@dataclass(frozen=True)
class PeriodModel:
    """One success per bucket. Use one key per bucket (``"<key>@<bucket start>"``). An
    ``admit`` reserves the bucket (a lease, as ``MutexModel``'s); a ``complete`` that
    ``marked`` it ends it for good: no later admission, no second mark. A complete that did
    not mark frees the holder's reservation. State: ``(phase, session, lease lower bound)``.
    """

    name: str = "period"
    default_ttl: float = 60.0
    slack_ns: int = DEFAULT_SLACK_NS

    def init(self) -> Hashable:
        return ("free", None, None)

    def relevant(self, op: Operation) -> bool:
        if op.key is None:
            return op.f == "lose"
        if op.f == "admit":
            return _granted(op)
        return op.f == "complete"

    def only_constrains(self, op: Operation) -> bool:
        return op.f == "admit"

    def step(self, state: Hashable, op: Operation) -> Iterable[Hashable]:
        phase, holder, bound = cast(tuple[str, str | None, int | None], state)
        session = op.value.get("session", op.id)
        if op.f == "lose":
            return [state, ("free", None, None)]
        if op.f == "admit":
            if phase == "done":
                return []
            in_flight = phase == "reserved" and holder != session
            if in_flight and op.ret is not None and (bound or 0) - self.slack_ns > op.ret:
                return []  # another's reservation, whose lease cannot have lapsed yet
            return [("reserved", session, op.call + _ttl_ns(op, self.default_ttl))]
        # complete
        if op.status == "info":
            # It may not have happened; or, if it came to Redis, a success marked the bucket
            # and a failure freed the holder's reservation. The invocation's ``outcome`` says
            # which it was asked to do; without one, either.
            outcome = op.value.get("outcome")
            options: list[Hashable] = [state]
            if phase != "done" and outcome != "failure":
                options.append(("done", None, None))
            if phase == "reserved" and holder == session and outcome != "success":
                options.append(("free", None, None))
            return options
        if op.value.get("marked", False):
            return [] if phase == "done" else [("done", None, None)]
        if phase == "reserved" and holder == session:
            return [("free", None, None)]
        return [state]
