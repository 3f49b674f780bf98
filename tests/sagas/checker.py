"""The checker of the saga promise: reads a scenario's ledger and rows, lists what is broken.

The promise (docs/reactors-and-steps.md, "The saga promise"): every effect a step's body made
either stands at the end of a successful run, or is undone exactly once — never both, never
neither. Per run (a root execution) the checker asserts, from the ledger alone and the rows:

* never an undo without its do (and never more undos than dos of an effect);
* ``succeeded``: every effect of the plan that this run executed stands once (one ``do``, no
  ``undo``, no ``compensate``), and every effect of the plan was either executed or reused;
* ``failed`` / ``cancelled``: every completed body that has an undo is undone exactly once,
  newest first; a completed body is never compensated; a body whose final attempt did not
  complete is compensated once when its step has ``compensate``; a cancelled run's error keeps
  the first cancel's reason;
* ``halted``: nothing is undone or compensated (a halt stops cleanly, nothing rolled back) —
  but an ``async_step`` that failed for good on its own, concurrently, is compensated once in
  its own delivery (its failure does not change the halt);
* nothing of the tree is left ``pending`` / ``running`` / ``parked``; every step lock and
  semaphore of the scenario is released.

Across a retry chain: a retry never reuses a result whose undo ran, and a chain that ends
``succeeded`` leaves exactly the effects of one successful run (an effect with an undo stands
exactly once; one without can only stand at least once, since nothing can take it back).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from reactor_app.models import Execution
from reactor_app.status import TERMINAL_STATUSES, ExecutionStatus
from reactor_app.testing import coordination_state
from tests.sagas.model_reactors import CHILD_STEPS, MAX_ATTEMPTS, SagaScript


@dataclass(frozen=True)
class Effect:
    """One effect of the plan: its label, the slot (top-level step) it belongs to, its hooks."""

    label: str
    slot: str
    hooks: str

    @property
    def undoable(self) -> bool:
        return self.hooks in "ub"

    @property
    def compensable(self) -> bool:
        return self.hooks in "cb"


@dataclass
class Case:
    """A generated workflow and what its operator does: the input of one model run."""

    shape: tuple[str, ...]
    items: int
    suppress: tuple[str, ...] = ()
    script: SagaScript = field(default_factory=SagaScript)
    #: each retry: (``from_step`` or None, the script the retry runs under)
    retries: tuple[tuple[str | None, SagaScript], ...] = ()

    @property
    def slots(self) -> list[str]:
        return [f"s{index}" for index in range(1, len(self.shape) + 1)]

    def inputs(self, scenario: str) -> dict[str, Any]:
        return {
            "scenario": scenario,
            "items": list(range(self.items)),
            "suppress": list(self.suppress),
        }

    def plan(self) -> list[Effect]:
        """Every effect a successful run makes, in plan order (suppressed slots make none)."""
        effects = []
        for slot, (kind, hooks, _coord) in zip(self.slots, self.shape, strict=True):
            if slot in self.suppress:
                continue
            if kind in "ta":
                effects.append(Effect(slot, slot, hooks))
            elif kind == "c":
                child_hooks = (hooks, "b")[:CHILD_STEPS]
                effects.extend(
                    Effect(f"{slot}/c{n}", slot, h) for n, h in enumerate(child_hooks, start=1)
                )
            else:
                effects.extend(Effect(f"{slot}[{i}]", slot, hooks) for i in range(self.items))
        return effects

    def coordination_keys(self, scenario: str) -> tuple[list[str], list[str]]:
        locks, semaphores = [], []
        for slot, (_kind, _hooks, coord) in zip(self.slots, self.shape, strict=True):
            labels = [slot] + [f"{slot}/c{n}" for n in range(1, CHILD_STEPS + 1)]
            for label in labels:
                if coord == "l":
                    locks.append(f"saga-lock:{scenario}:{label}")
                elif coord == "s":
                    semaphores.append(f"saga-sem:{scenario}:{label}")
        return locks, semaphores


def effects_by_label(case: Case) -> dict[str, Effect]:
    return {effect.label: effect for effect in case.plan()}


def check_run(
    case: Case,
    scenario: str,
    root: str,
    events: list[dict[str, Any]],
    *,
    reused: list[str] = (),  # type: ignore[assignment]
    killed_pids: frozenset[int] = frozenset(),
) -> list[str]:
    """What the run ``root`` broke of the promise (empty when it kept it)."""
    problems: list[str] = []
    plan = effects_by_label(case)
    row = Execution.objects.get(pk=root)
    status = row.status
    mine = [e for e in events if e["root"] == root]

    # never an undo without its do
    done: Counter[str] = Counter()
    undone: Counter[str] = Counter()
    for event in mine:
        if event["kind"] == "do":
            done[event["label"]] += 1
        elif event["kind"] == "undo":
            undone[event["label"]] += 1
            if undone[event["label"]] > done[event["label"]]:
                problems.append(f"undo of {event['label']} without a do before it")
    compensated = Counter(e["label"] for e in mine if e["kind"] == "compensate")
    for label, count in done.items():
        if count > 1:
            problems.append(f"{label}: its body completed {count} times in one run")

    if status == ExecutionStatus.SUCCEEDED:
        for label in done:
            if undone[label]:
                problems.append(f"succeeded, but {label} was undone ({undone[label]}x)")
        for label in compensated:
            problems.append(f"succeeded, but {label} was compensated")
        reused_slots = set(reused)
        for label, effect in plan.items():
            if effect.slot in reused_slots:
                if done[label]:
                    problems.append(f"{label} was reused, yet its body ran again")
            elif done[label] != 1:
                problems.append(f"succeeded, but {label}'s body completed {done[label]} times")
    elif status in (ExecutionStatus.FAILED, ExecutionStatus.CANCELLED):
        undoable_done = [
            e["label"] for e in mine if e["kind"] == "do" and plan[e["label"]].undoable
        ]
        for label in done:
            expected = 1 if plan[label].undoable else 0
            if undone[label] != expected:
                problems.append(
                    f"{status}: {label} completed and was undone {undone[label]}x "
                    f"(expected {expected}x: its step {'has' if expected else 'has no'} undo)"
                )
            if compensated[label]:
                problems.append(f"{status}: {label} completed, yet it was compensated")
        undo_order = [e["label"] for e in mine if e["kind"] == "undo"]
        dos = {e["label"]: e for e in mine if e["kind"] == "do" and plan[e["label"]].undoable}
        against = _against_completion(undo_order, dos)
        if against and all(undone[label] == 1 for label in undoable_done):
            problems.append(
                f"{status}: undone in the order {undo_order}, not newest first "
                f"{list(reversed(undoable_done))}: {against}"
            )
        for label in _unfinished(mine, killed_pids):
            effect = plan[label]
            if effect.compensable and compensated[label] != 1:
                problems.append(
                    f"{status}: {label}'s body did not complete and was compensated "
                    f"{compensated[label]}x (expected once)"
                )
        for label, count in compensated.items():
            if count > 1:
                problems.append(f"{label} compensated {count}x")
        if status == ExecutionStatus.CANCELLED:
            reason = (row.error or {}).get("reason")
            if reason != "first" and any(e["kind"] == "cancel" for e in mine):
                problems.append(f"cancelled, but the error's reason is {reason!r}, not 'first'")
    elif status == ExecutionStatus.HALTED:
        # an async step that failed for good on its own was compensated in its own delivery
        # (its failure does not change the halt: engine.settling.settle_on_halt): no rollback
        unfinished = set(_unfinished(mine, killed_pids))
        async_slots = {s for s, code in zip(case.slots, case.shape, strict=True) if code[0] == "a"}
        own = {
            label: count
            for label, count in compensated.items()
            if count == 1 and label in unfinished and plan[label].slot in async_slots
        }
        rolled_back = {label: n for label, n in compensated.items() if label not in own}
        if undone or rolled_back:
            problems.append(f"halted, yet undone {dict(undone)} / compensated {rolled_back}")
    else:
        problems.append(f"the run ended {status!r}")

    problems.extend(_started_after_cancel(mine))
    problems.extend(_expected_status(case, mine, status))
    problems.extend(leftovers(case, scenario, root))
    return problems


#: how far apart (ns) two bodies in different processes must have noted their ``do`` for the
#: ledger to tell which completed first. The engine orders a rollback by when each body
#: *returned*, stamped after the body's note has made its round trip to Redis; in between, a
#: loaded machine can stall one process while another notes and returns — a soak run saw two
#: bodies entered together in two worker processes undone in the order the other way round
#: from their notes. The same bound as ``CANCEL_GRACE_NS``; bodies in one process run one
#: after another, and their order is always checked.
CONCURRENT_NS = 1_000_000_000


def _against_completion(undo_order: list[str], dos: dict[str, dict[str, Any]]) -> str | None:
    """What in ``undo_order`` undoes an effect before one that surely completed after it
    (newest first is the promise), or None: surely, when the later ``do`` was noted in the
    same process, or at least ``CONCURRENT_NS`` after the earlier one."""
    for index, first in enumerate(undo_order):
        for later in undo_order[index + 1 :]:
            a, b = dos.get(first), dos.get(later)
            if a is None or b is None:
                continue
            if b["t"] > a["t"] and (b["pid"] == a["pid"] or b["t"] - a["t"] >= CONCURRENT_NS):
                # ``later`` completed after ``first``, yet was undone after it
                return (
                    f"{first} (pid {a['pid']}) undone before {later} (pid {b['pid']}), which "
                    f"completed {(b['t'] - a['t']) / 1e6:.1f} ms after it"
                )
    return None


def _unfinished(events: list[dict[str, Any]], killed_pids: frozenset[int]) -> list[str]:
    """Labels whose final attempt did not complete: its last attempt failed (every attempt
    failed, or the run ended before the retry: a cancel came first), or it was stopped inside
    the body by a cancel (entered, no do/fail/halt after its last enter)."""
    last: dict[str, str] = {}
    for event in events:
        if event["kind"] == "enter" and event["pid"] in killed_pids:
            continue
        if event["kind"] in ("enter", "do", "fail", "halt"):
            last[event["label"]] = event["kind"]
    return [label for label, kind in last.items() if kind in ("fail", "enter")]


#: how long after a cancel request a body may still start (ns): a run polls the flag at its
#: step boundaries every REACTOR_CANCEL_POLL (0.05 s) at most, plus a loaded machine's delays
CANCEL_GRACE_NS = 1_000_000_000


def _started_after_cancel(events: list[dict[str, Any]]) -> list[str]:
    """Bodies that started well after the run was asked to stop (a parked parallel map's
    unstarted elements must be cancelled without starting)."""
    cancels = [e["t"] for e in events if e["kind"] == "cancel"]
    if not cancels:
        return []
    asked = min(cancels)
    return [
        f"{e['label']}'s body started {(e['t'] - asked) / 1e9:.2f}s after the cancel"
        for e in events
        if e["kind"] == "enter" and e["t"] > asked + CANCEL_GRACE_NS
    ]


def _expected_status(case: Case, events: list[dict[str, Any]], status: str) -> list[str]:
    kinds = {e["kind"] for e in events}
    fails = Counter(e["label"] for e in events if e["kind"] == "fail")
    exhausted = any(count >= MAX_ATTEMPTS for count in fails.values())
    quiet = not exhausted and "halt" not in kinds
    if quiet and "cancel" not in kinds and status != ExecutionStatus.SUCCEEDED:
        return [f"nothing failed, halted or was cancelled, yet the run ended {status}"]
    ended = (ExecutionStatus.CANCELLED, ExecutionStatus.SUCCEEDED)
    if quiet and "cancel" in kinds and status not in ended:
        return [f"a cancel was requested, yet the run ended {status}"]
    return []


def leftovers(case: Case, scenario: str, root: str) -> list[str]:
    """Executions of the tree not ended, step holds not released."""
    problems = []
    for execution in Execution.objects.filter(root_id=root).exclude(status__in=TERMINAL_STATUSES):
        problems.append(f"execution {execution.pk} ({execution.reactor}) left {execution.status}")
    state = coordination_state()
    locks, semaphores = case.coordination_keys(scenario)
    for key in locks:
        lock = state.lock(key)
        if lock.held:
            problems.append(f"lock {key} still held by {lock.owner}")
    for key in semaphores:
        semaphore = state.semaphore(key)
        if semaphore.held:
            problems.append(f"semaphore {key} still held ({semaphore.held})")
    return problems


def check_retry(
    case: Case, failed_events: list[dict[str, Any]], failed_root: str, reused: list[str]
) -> list[str]:
    """A retry never reuses a result whose undo ran."""
    plan = effects_by_label(case)
    undone_slots = sorted(
        {
            plan[e["label"]].slot
            for e in failed_events
            if e["root"] == failed_root and e["kind"] == "undo"
        }
    )
    bad = sorted(set(reused) & set(undone_slots))
    return [f"the retry reused {bad}, whose undo ran in {failed_root}"] if bad else []


def check_chain(case: Case, roots: list[str], events: list[dict[str, Any]]) -> list[str]:
    """A retry chain that ends ``succeeded`` leaves the effects of one successful run."""
    chain = set(roots)
    net: Counter[str] = Counter()
    for event in events:
        if event["root"] not in chain:
            continue
        if event["kind"] == "do":
            net[event["label"]] += 1
        elif event["kind"] == "undo":
            net[event["label"]] -= 1
    problems = []
    for label, effect in effects_by_label(case).items():
        if effect.undoable and net[label] != 1:
            problems.append(
                f"after the retry chain {label}'s effect stands {net[label]}x, not once"
            )
        elif not effect.undoable and net[label] < 1:
            problems.append(f"after the retry chain {label}'s effect does not stand")
    return problems
