"""The lean path of a single-lock ``Step.call`` (``engine.locked_call``) against the general
runner, with real Redis: each scenario runs through both paths, and what a caller, an observer
and an operator see — the outcome, the coordination signals, the event rows, the holds listed
while the body runs, the fencing tokens and the nesting — must be the same. The general path is
forced by making ``runner.lone_lock`` answer None, as it does for any other step."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from reactor_app import (
    Failure,
    Halt,
    Skipped,
    Step,
    Success,
    signals,
    with_lock,
    with_semaphore,
)
from reactor_app.coordination.admission import Coordinator
from reactor_app.engine import locked_call, runner
from reactor_app.exceptions import ReactorError
from reactor_app.models import CoordinationEvent
from reactor_app.testing import coordination_state
from reactor_app.write_behind import flush
from tests.concurrency.harness import held_elsewhere, now_ns, overlaps

pytestmark = pytest.mark.django_db(transaction=True)

PATHS = ["general", "lean"]
SEEN: list[dict[str, Any]] = []  # what bodies and hooks observed, per run


def observe(context: Any, what: str) -> None:
    holds = [
        (h.get("primitive"), h.get("key"), h.get("step"), h.get("reactor") or None)
        for h in coordination_state().holds()
    ]
    SEEN.append(
        {
            "at": what,
            "token": context.fencing_token(),
            "holds": sorted(holds),
            "held": context.held_keys.snapshot() if context.held_keys else None,
            "execution": context.execution_id,
            "step": context.step_name,
            "attempt": context.attempt,
        }
    )


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The step names the lean path ran (a spy around ``call_locked``, which still runs)."""
    names: list[str] = []
    real = locked_call.call_locked

    def spy(step_class: type[Step], *args: Any) -> Any:
        names.append(step_class.__qualname__)
        return real(step_class, *args)

    monkeypatch.setattr(runner, "call_locked", spy)
    yield names


def through(path: str, monkeypatch: pytest.MonkeyPatch, call: Callable[[], Any]) -> Any:
    with monkeypatch.context() as patch:
        if path == "general":
            patch.setattr(runner, "lone_lock", lambda step_class: None)
        return call()


#: fields that read a clock (or a lease's time left): they differ between any two runs
CLOCK_READINGS = {"since", "ttl", "ttl_left", "acquired_at", "expires_at", "retry_after", "time"}


def _plain(value: Any) -> Any:
    """Tokens and owners differ between two runs: keep what must not."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k not in CLOCK_READINGS}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _outcome(result: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {"type": type(result).__name__, "ok": result.ok}
    if isinstance(result, (Success, Skipped)):
        seen["value"] = result.value
    if isinstance(result, (Skipped, Halt)):
        seen["reason"] = result.reason
    if isinstance(result, Failure):
        seen["retryable"] = result.retryable
        error = result.exception()
        seen["error"] = type(error).__name__
        if isinstance(error, ReactorError):
            fields = dict(error.fields())
            failures = fields.pop("rollback_failures", None)
            seen["fields"] = _plain(fields)
            seen["rollback_failures"] = [
                {k: v for k, v in f.items() if k in {"step", "kind", "error_type"}}
                for f in failures or []
            ]
            seen["message"] = re.sub(r"\d+(\.\d+)?s\b", "<seconds>", error.message)
    return seen


def run_scenario(call: Callable[[], Any], key: str) -> dict[str, Any]:
    """One run: the outcome, the signals sent, the rows written, what the body observed."""
    SEEN.clear()
    sent: list[dict[str, Any]] = []

    def receiver(sender: Any, **payload: Any) -> None:
        sent.append(payload)

    signals.coordination_event.connect(receiver, weak=False)
    try:
        result = call()
    finally:
        signals.coordination_event.disconnect(receiver)
    flush()
    owners: dict[str, str] = {}

    def owner(name: str) -> str:
        return name if not name.startswith("call:") else owners.setdefault(name, f"o{len(owners)}")

    first = next((p["token"] for p in sent if p["token"] is not None), 0)

    def event(kind: str, primitive: str, step: Any, who: str, token: Any, detail: Any) -> Any:
        relative = None if token is None else token - first
        return (kind, primitive, step, owner(who), relative, _plain(detail))

    rows = CoordinationEvent.objects.filter(key=key).order_by("at", "pk")
    assert all(r.reactor == "" and r.execution_id is None for r in rows)
    return {
        "outcome": _outcome(result),
        "signals": [
            event(p["kind"], p["primitive"], p["step"], p["owner"], p["token"], p["detail"])
            for p in sent
            if p["key"] == key
        ],
        "rows": [
            event(r.kind, r.primitive, r.step or None, r.owner, r.token, r.detail) for r in rows
        ],
        "seen": [{**s, "token": None if s["token"] is None else s["token"] - first} for s in SEEN],
        "left": _plain(coordination_state().holds()),
    }


def both(monkeypatch: pytest.MonkeyPatch, call: Callable[[], Any], key: str) -> dict[str, Any]:
    observed = {}
    for path in PATHS:
        CoordinationEvent.objects.filter(key=key).delete()
        observed[path] = run_scenario(lambda path=path: through(path, monkeypatch, call), key)
    assert observed["lean"] == observed["general"]
    return observed["lean"]


# -- the scenarios ------------------------------------------------------------------------


@with_lock(lambda args: f"lean:{args['n']}", ttl=30)
class Locked(Step):
    inputs = ("n",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        observe(context, "body")
        mode = args.get("mode", "value")
        if mode == "success":
            return Success({"n": args["n"]})
        if mode == "value":
            return [args["n"]]  # not an outcome: a Success
        if mode == "skipped":
            return Skipped("partial", reason="nothing to do")
        if mode == "halt":
            return Halt("enough")
        if mode == "failure":
            return Failure(ValueError("declined"), retryable=True)  # one attempt all the same
        if mode == "lost":
            # the lock taken away under the body: the release finds it gone
            Coordinator().force_release("lock", f"lean:{args['n']}", hand_on=False)
            return Success("ran")
        raise RuntimeError(f"boom {args['n']}")


@with_lock(lambda args: f"lean:{args['n']}", ttl=30)
class Compensated(Step):
    inputs = ("n",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        observe(context, "body")
        raise RuntimeError("the charge failed")

    def compensate(self, error: BaseException, args: dict[str, Any], context: Any) -> Any:
        observe(context, "compensate")
        if args.get("mode") == "broken":
            raise LookupError("the refund failed too")
        return None


@with_lock(lambda args: f"lean:{args['n']}", ttl=30, wait=0.2)
class Waiting(Step):
    inputs = ("n",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        observe(context, "body")
        return Success("never")


@with_lock(lambda args: f"lean:{args['missing']}", ttl=30)
class BadKey(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        observe(context, "body")
        return Success("never")


@pytest.mark.parametrize(
    "mode", ["success", "value", "skipped", "halt", "failure", "raises", "lost"]
)
def test_a_body_ends_alike_on_both_paths(
    mode: str, monkeypatch: pytest.MonkeyPatch, taken: list[str]
) -> None:
    seen = both(monkeypatch, lambda: Locked.call(n=1, mode=mode), "lean:1")
    assert taken == ["Locked"]  # the general run did not take the lean path, the lean one did
    assert [s["at"] for s in seen["seen"]] == ["body"]
    body = seen["seen"][0]
    assert body["token"] == 0 and body["holds"] == [("lock", "lean:1", "Locked", None)]
    assert body["held"] == [{"primitive": "lock", "key": "lean:1", "count": 1, "steps": ["Locked"]}]
    kinds = [e[0] for e in seen["rows"]]
    assert kinds == ["acquired", "released"], kinds
    assert seen["left"] == []


@pytest.mark.parametrize("mode", ["quiet", "broken"])
def test_a_failed_body_is_compensated_under_its_lock_on_both_paths(
    mode: str, monkeypatch: pytest.MonkeyPatch, taken: list[str]
) -> None:
    seen = both(monkeypatch, lambda: Compensated.call(n=2, mode=mode), "lean:2")
    assert taken == ["Compensated"]
    assert [s["at"] for s in seen["seen"]] == ["body", "compensate"]
    # the compensation re-enters the lock its body holds: same token, nested once
    assert seen["seen"][1]["token"] == 0
    assert seen["seen"][1]["held"][0]["count"] == 2
    assert [e[0] for e in seen["rows"]] == ["acquired", "acquired", "released", "released"]
    assert bool(seen["outcome"]["rollback_failures"]) == (mode == "broken")


@pytest.mark.parametrize("step_class", [Locked, Waiting])
def test_contention_fails_alike_on_both_paths(
    step_class: type[Step], monkeypatch: pytest.MonkeyPatch, taken: list[str]
) -> None:
    with held_elsewhere("lean:3"):
        seen = both(monkeypatch, lambda: step_class.call(n=3), "lean:3")
    assert taken == [step_class.__qualname__]
    assert seen["seen"] == []  # the body never ran
    assert seen["outcome"]["error"] == "LockAcquisitionError"
    assert [e[0] for e in seen["rows"]] == ["acquisition_failed"]


def test_an_uncomputable_key_fails_alike_on_both_paths(
    monkeypatch: pytest.MonkeyPatch, taken: list[str]
) -> None:
    seen = both(monkeypatch, lambda: BadKey.call(), "lean:")
    assert taken == ["BadKey"]
    assert seen["seen"] == [] and seen["outcome"]["error"] == "CoordinationKeyError"


def test_an_unreachable_store_fails_alike_on_both_paths(
    monkeypatch: pytest.MonkeyPatch, taken: list[str], settings: Any
) -> None:
    settings.REACTOR_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    settings.REACTOR_REDIS = None
    seen = {path: through(path, monkeypatch, lambda: _outcome(Locked.call(n=4))) for path in PATHS}
    assert seen["lean"] == seen["general"]
    assert seen["lean"]["error"] == "CoordinationUnavailable"
    assert SEEN == []  # the body never ran unprotected
    assert taken == ["Locked"]


# -- when the lean path applies -------------------------------------------------------------


@with_semaphore(lambda args: "lean:sem", limit=2)
@with_lock(lambda args: "lean:5", ttl=30)
class LockAndSemaphore(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(None)


@with_lock(lambda args: "lean:6", ttl=30, on_contention="skip")
class SkipsWhenTaken(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(None)


class Outer(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Locked.call(n=7, mode="success", context=context).value


def test_the_lean_path_is_taken_only_for_one_queueing_lock_called_directly(
    taken: list[str],
) -> None:
    assert locked_call.lone_lock(Locked) is Locked.lock_config
    for other in (LockAndSemaphore, SkipsWhenTaken, Outer):
        assert locked_call.lone_lock(other) is None
    assert LockAndSemaphore.call().ok and SkipsWhenTaken.call().ok
    assert taken == []
    # called from a step body (re-entrancy per execution, the enclosing gates): the runner
    assert Outer.call().value == {"n": 7}
    assert taken == []
    assert Locked.call(n=7, mode="success").ok
    assert taken == ["Locked"]


# -- real concurrency -----------------------------------------------------------------------

INTERVALS: list[tuple[str, int, int, int]] = []  # (caller, start ns, end ns, fencing token)


@with_lock(lambda args: "lean:crowd", ttl=30, wait=10)
class Crowded(Step):
    inputs = ("caller",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        start = now_ns()
        time.sleep(0.01)
        INTERVALS.append((args["caller"], start, now_ns(), context.fencing_token()))
        return Success(args["caller"])


@pytest.mark.parametrize("path", PATHS)
def test_callers_of_one_key_wait_their_turn_on_both_paths(
    path: str, monkeypatch: pytest.MonkeyPatch, taken: list[str]
) -> None:
    """Eight threads call the same locked step at once: each waits (FIFO hand-off, woken by
    the release), none overlaps another, and the fencing tokens grow in the order of entry."""
    if path == "general":
        monkeypatch.setattr(runner, "lone_lock", lambda step_class: None)
    INTERVALS.clear()
    outcomes: dict[str, Any] = {}
    start = threading.Barrier(8)

    def caller(name: str) -> None:
        start.wait()
        outcomes[name] = Crowded.call(caller=name)

    threads = [threading.Thread(target=caller, args=(f"c{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert {name: o.value for name, o in outcomes.items()} == {f"c{i}": f"c{i}" for i in range(8)}
    assert overlaps([(name, begin, end) for name, begin, end, _ in INTERVALS]) == []
    tokens = [token for *_, token in sorted(INTERVALS, key=lambda i: i[1])]
    assert tokens == sorted(tokens) and len(set(tokens)) == 8
    assert len(taken) == (8 if path == "lean" else 0)
    assert coordination_state().holds() == []
