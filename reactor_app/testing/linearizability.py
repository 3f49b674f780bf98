"""A linearizability checker for recorded histories (``reactor_app.testing.history``).

A history is linearizable when one sequential order of its operations — each placed at one
instant between its invocation and its completion — is legal for a sequential model of the
object (``reactor_app.testing.sequential_models``: a mutex, a semaphore, a fenced register, a
rate limit, a period). This is the question Jepsen's Knossos and etcd's robustness tests
(with Porcupine) ask of lock services; overlap-free critical sections and increasing tokens
are necessary, not sufficient.

The search is Wing & Gong's, with Lowe's memoisation as Porcupine implements it: invocations
and completions on a doubly linked list in time order; take the first invocation whose model
step is legal, unlink it and its completion, go on; when a completion is reached whose
operation was not taken, no order exists from here — undo the last choice and try the next
invocation. ``(set of operations taken, model state)`` pairs already explored are cached, so
the search is polynomial in practice for the few concurrent clients tests have.

* Operations on different keys are independent (locality: a history is linearizable iff each
  key's is), so each key is searched on its own, with the nemesis's faults (key ``None``)
  added to every key.
* A nondeterministic model (a lease *may* have expired, state *may* have been lost) is made
  deterministic as Porcupine does: the search's state is the frozen set of every state the
  model could be in; a step is legal when that set stays non-empty.
* ``info`` operations (outcome unknown) complete at the end of time: they may be placed
  anywhere after their invocation, or nowhere — the search succeeds once every operation with
  a known completion is placed.

When a key's history is not linearizable, ``check`` shrinks it to a *minimal* violating
sub-history: whole units (a hold's acquire, extends and release share a unit) are dropped
while what remains still has no legal order — first the tail (a binary search over units by
invocation), then halves, quarters... down to single units. The models only check what was
granted, never a refusal, so dropping a unit only removes constraints: every sub-history the
shrink keeps is a real violation, not an artefact of what it dropped. Nemesis faults are
never dropped (dropping a "state may be lost" would make the rest stricter than it was), except
those invoked after every kept operation completed, which could only come after them all.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from reactor_app.testing.history import CLOCK, Operation

#: how many search steps one key may take before its verdict is "unknown" (not a pass)
DEFAULT_BUDGET = 2_000_000
#: how many states a nondeterministic model may be in at once before the verdict is "unknown"
MAX_STATES = 10_000


class Model(Protocol):
    """A sequential specification. States must be hashable (they are cached)."""

    name: str

    def init(self) -> Hashable: ...

    def relevant(self, op: Operation) -> bool:
        """Whether ``op`` constrains or changes the state (a refusal does neither)."""
        ...

    def step(self, state: Hashable, op: Operation) -> Iterable[Hashable]:
        """Every state ``op`` can lead to from ``state``; none when it is illegal there."""
        ...

    def only_constrains(self, op: Operation) -> bool:
        """Whether placing ``op`` can only make later operations of *other* holds less legal
        (an acquisition takes something; it never frees anything for another)."""
        ...


class CheckerGaveUp(RuntimeError):
    """The search ran out of its step budget: no verdict."""


@dataclass
class Violation:
    """A key whose history has no legal order, shrunk to a minimal violating sub-history."""

    key: str | None
    model: str
    operations: list[Operation]
    #: operations the key's history had before shrinking
    original_size: int

    def __str__(self) -> str:
        origin = min((op.call for op in self.operations), default=0)
        lines = [
            f"{self.model} on key {self.key!r}: no legal order for these "
            f"{len(self.operations)} operations (shrunk from {self.original_size}):"
        ]
        lines += ["  " + op.describe(origin) for op in self.operations]
        return "\n".join(lines)


@dataclass
class KeyResult:
    key: str | None
    operations: int  # operations of the key (nemesis faults included)
    checked: int  # of those, the ones the model checks (refusals are not)
    verdict: Literal["ok", "violation", "unknown"]


@dataclass
class CheckResult:
    model: str
    keys: list[KeyResult] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    #: how far the server's clock stepped ahead while the history was recorded (a
    #: ``ClockWatch``'s ``clock`` operation): the leases were checked with that much more slack
    clock_step_ns: int = 0

    @property
    def valid(self) -> bool:
        """True only when every key was searched to the end and found linearizable."""
        return all(k.verdict == "ok" for k in self.keys)

    @property
    def operations(self) -> int:
        return sum(k.operations for k in self.keys)

    @property
    def checked(self) -> int:
        return sum(k.checked for k in self.keys)

    def summary(self) -> str:
        unknown = sum(k.verdict == "unknown" for k in self.keys)
        return (
            f"{self.model}: {self.checked} operations checked ({self.operations} recorded) on "
            f"{len(self.keys)} keys, {len(self.violations)} violations"
            + (f", {unknown} keys without a verdict" if unknown else "")
            + (
                f"; the server's clock stepped {self.clock_step_ns / 1e6:.1f} ms ahead of this "
                "machine's monotonic clock: leases checked with that much more slack"
                if self.clock_step_ns
                else ""
            )
        )


def linearizable(ops: Sequence[Operation], model: Model, budget: int = DEFAULT_BUDGET) -> bool:
    """Whether some legal sequential order explains ``ops`` (one key's; all are searched).

    Raises ``CheckerGaveUp`` after ``budget`` search steps, or when the model could be in
    more than ``MAX_STATES`` states at once.
    """
    ops = searched_operations(ops, model)
    n = len(ops)
    if n == 0:
        return True
    infinity = max(op.call for op in ops) + 1 + max((op.ret or 0) for op in ops)
    # entries: (time, 0 = invocation / 1 = completion, op index); invocations first at a tie
    entries = sorted(
        [(op.call, 0, i) for i, op in enumerate(ops)]
        + [(infinity if op.ret is None else op.ret, 1, i) for i, op in enumerate(ops)]
    )
    # doubly linked list over the entries; node 0 is the head, entry j is node j + 1
    size = len(entries) + 1
    nxt = list(range(1, size + 1))
    nxt[-1] = 0  # 0 also ends the list (the head is never a real entry)
    prv = list(range(-1, size - 1))
    completion_node = [0] * n
    for j, (_, kind, i) in enumerate(entries):
        if kind == 1:
            completion_node[i] = j + 1

    def lift(node: int) -> None:
        for x in (node, completion_node[entries[node - 1][2]]):
            nxt[prv[x]] = nxt[x]
            if nxt[x]:
                prv[nxt[x]] = prv[x]

    def unlift(node: int) -> None:
        for x in (completion_node[entries[node - 1][2]], node):
            nxt[prv[x]] = x
            if nxt[x]:
                prv[nxt[x]] = x

    state: frozenset[Hashable] = frozenset([model.init()])
    taken = 0
    cache: set[tuple[int, frozenset[Hashable]]] = set()
    stack: list[tuple[int, frozenset[Hashable]]] = []
    node = nxt[0]
    steps = 0
    while nxt[0]:
        steps += 1
        if steps > budget:
            raise CheckerGaveUp(f"{model.name}: more than {budget} search steps")
        _, kind, i = entries[node - 1]
        if kind == 0:
            following = frozenset(s for before in state for s in model.step(before, ops[i]))
            if len(following) > MAX_STATES:
                raise CheckerGaveUp(f"{model.name}: more than {MAX_STATES} possible states")
            if following:
                now_taken = taken | (1 << i)
                if (now_taken, following) not in cache:
                    cache.add((now_taken, following))
                    stack.append((node, state))
                    state, taken = following, now_taken
                    lift(node)
                    node = nxt[0]
                    continue
            node = nxt[node]
        else:
            if ops[i].ret is None:
                return True  # only open (info) operations are left: they need not happen
            if not stack:
                return False
            node, state = stack.pop()
            taken &= ~(1 << entries[node - 1][2])
            unlift(node)
            node = nxt[node]
    return True


def searched_operations(ops: Sequence[Operation], model: Model) -> list[Operation]:
    """The operations the search places: not failed, relevant to the model — and not an open
    acquisition that is its hold's only operation.

    Such an operation (a reply lost, a client killed mid-call, and nothing more heard of that
    hold) may be left out of the order anyway, and placing it only constrains the others, so
    leaving it out changes no verdict — while keeping it would let every subset of the open
    acquisitions be tried at every point: an outage with dozens of them made the search
    exponential.
    """
    kept = [op for op in ops if op.status != "fail" and model.relevant(op)]
    sessions: dict[object, int] = defaultdict(int)
    for op in kept:
        sessions[op.value.get("session", op.id)] += 1
    return [
        op
        for op in kept
        if not (
            op.ret is None
            and op.key is not None
            and sessions[op.value.get("session", op.id)] == 1
            and model.only_constrains(op)
        )
    ]


def _unit(op: Operation) -> str | None:
    if op.key is None:
        return None  # a nemesis fault: kept
    session = op.value.get("session")
    return str(session) if session is not None else op.id


def minimal_violation(
    ops: Sequence[Operation], model: Model, budget: int = DEFAULT_BUDGET
) -> list[Operation]:
    """A minimal sub-history of the non-linearizable ``ops`` that is still not linearizable:
    dropping any one unit (a hold's operations) from it makes it linearizable."""
    fixed = [op for op in ops if _unit(op) is None]
    grouped: dict[str, list[Operation]] = defaultdict(list)
    for op in ops:
        unit = _unit(op)
        if unit is not None:
            grouped[unit].append(op)
    units = sorted(grouped.values(), key=lambda group: min(op.call for op in group))

    def violates(chosen: Sequence[list[Operation]]) -> bool:
        return not linearizable(fixed + [op for g in chosen for op in g], model, budget)

    # the shortest violating prefix of units (dropping later units only relaxes)
    low, high = 1, len(units)
    while low < high:
        middle = (low + high) // 2
        if violates(units[:middle]):
            high = middle
        else:
            low = middle + 1
    kept = units[:high]
    chunk = max(1, len(kept) // 2)
    while True:
        start = 0
        while start < len(kept):
            trial = kept[:start] + kept[start + chunk :]
            if trial and violates(trial):
                kept = trial
            else:
                start += chunk
        if chunk == 1:
            break
        chunk = max(1, chunk // 2)
    shown = [op for g in kept for op in g]
    ends = [op.ret for op in shown]
    if all(end is not None for end in ends):
        # a fault invoked after every kept operation completed can only come after them all
        last = max(end for end in ends if end is not None)
        fixed = [op for op in fixed if op.call <= last]
    return sorted(fixed + shown, key=lambda op: op.call)


def check(
    ops: Iterable[Operation], model: Model, *, budget: int = DEFAULT_BUDGET, shrink: bool = True
) -> CheckResult:
    """Check every key of ``ops`` against ``model``; violations are shrunk unless
    ``shrink=False``. A key whose search exceeds ``budget`` steps is ``unknown``, and makes
    ``valid`` false: a check that gave up has not passed.

    A ``clock`` operation (``testing.clock_watch.ClockWatch``) is not searched: the step of
    the server's clock it reports is added to the model's ``slack_ns`` (a lease may lapse that
    much earlier than this machine's clock says), and to the result."""
    by_key: dict[str | None, list[Operation]] = defaultdict(list)
    faults: list[Operation] = []
    step = 0
    for op in ops:
        if op.key is None and op.f == CLOCK:
            step = max(step, int(op.value.get("step_ns", 0) or 0))
        elif op.key is None:
            faults.append(op)
        else:
            by_key[op.key].append(op)
    if not hasattr(model, "slack_ns"):
        step = 0  # no leases in this model: nothing a clock could move
    elif step:
        model = replace(model, slack_ns=model.slack_ns + step)  # type: ignore[type-var]
    result = CheckResult(model=model.name, clock_step_ns=step)
    for key in sorted(by_key, key=str):
        key_ops = sorted(by_key[key] + faults, key=lambda op: op.call)
        checked = sum(
            1 for op in key_ops if op.key is not None and op.status != "fail" and model.relevant(op)
        )
        try:
            ok = linearizable(key_ops, model, budget)
        except CheckerGaveUp:
            result.keys.append(KeyResult(key, len(key_ops), checked, "unknown"))
            continue
        result.keys.append(KeyResult(key, len(key_ops), checked, "ok" if ok else "violation"))
        if not ok:
            shown = minimal_violation(key_ops, model, budget) if shrink else key_ops
            result.violations.append(Violation(key, model.name, shown, len(key_ops)))
    return result
