"""The saga model's reactors: a fixed family of shapes, importable by worker processes.

A worker finds a reactor by dotted path and imports its module, so a generated reactor cannot
be a class made inside a test. Instead a *shape* — one slot per step, each a kind (plain step,
``compose``, sequential ``map_step``, ``map_step(parallel=True)``, ``async_step``), the hooks
its step class defines (undo, compensate, both, neither) and its step-level coordination (none,
a lock, a semaphore) — names a class, ``Saga_<slot>_<slot>...``. ``reactor_for(shape)`` builds
(once) and registers the class of any shape in this process; ``WORKER_SHAPES``, a fixed family
drawn with a fixed seed, are built at import, so a worker knows every one of them.

Everything a run *does* is read at run time from a script in Redis keyed by the run's
``scenario`` input (``SagaScript``): which body fails at which attempt, where a cancel is
requested (before or during a body), where the run halts, how long a body works. The test
rewrites the script between a failed run and its retry. ``where`` suppression is an input
(``suppress``), so it is the same for a run and its retries, as inputs are.

Every body, undo and compensate appends to the scenario's ledger (a Redis list under the
test's key prefix): ``(root, execution, label, kind, attempt, pid, t)``. Labels name effects:
``s2`` a plain step, ``s3[1]`` element 1 of a map, ``s4/c2`` the second step of a composed
child.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from reactor_app import (
    Failure,
    Halt,
    Reactor,
    Retries,
    Step,
    Success,
    async_step,
    compose,
    element,
    from_input,
    map_step,
    step,
    value,
    with_lock,
    with_semaphore,
)
from reactor_app.conf import reactor_settings
from reactor_app.coordination.redis import get_client

#: every body is tried at most this often (the script fails some attempts)
MAX_ATTEMPTS = 2
#: seconds between a failed attempt and its retry: long enough for a ``later`` cancel
#: (``LATER``) to come while no body runs
RETRY_DELAY = 0.2
#: seconds after its body asked that a ``later`` cancel is requested, from another thread
LATER = 0.05
KINDS = "tcmpa"  # t: step, c: compose, m: map_step, p: map_step(parallel=True), a: async_step
HOOKS = "nucb"  # n: neither, u: undo, c: compensate, b: both
COORDS = "xls"  # x: none, l: a step lock, s: a step semaphore
#: a semaphore's limit (elements of a parallel map share it)
SEMAPHORE_LIMIT = 2
#: the steps of a composed child: the slot's hooks first, then a step with both hooks
CHILD_STEPS = 2


# --------------------------------------------------------------------------------------------
# the script and the ledger
# --------------------------------------------------------------------------------------------


@dataclass
class SagaScript:
    """What the bodies of one scenario do (JSON in Redis, rewritten by the test between runs).

    * ``fail``: label → the attempts that return a retryable ``Failure``;
    * ``cancel``: the label whose body (first attempt it reaches) requests a cancel of the
      run's root, ``cancel_mode`` ``before`` (then the body completes) or ``during`` (then it
      calls ``checkpoint()``, which stops it), or ``later``: another thread requests it
      ``LATER`` seconds after the body asked — after the body returned, while a failed
      attempt waits for its retry or the next step runs; ``second_cancel`` asks a second
      time;
    * ``halt``: the label whose body returns ``Halt``;
    * ``work``: label → seconds the body works (checking ``checkpoint()``) before its effect;
      ``"<label>:undo"`` / ``"<label>:compensate"`` → seconds that hook works before its
      effect (it notes ``undo-enter`` / ``compensate-enter`` first);
    * ``after``: label → an event the body waits for (checking ``checkpoint()``) before
      anything else, ``"<label>:<kind>"``: that ledger entry (``enter``, ``do``, a test's
      ``signal``); ``ended``: the ``do``, and the row of the execution that made it ended (an
      async step's child, so its parent can see it). A regression test orders two bodies
      running in different deliveries by an event, not by time.
    """

    fail: dict[str, list[int]] = field(default_factory=dict)
    cancel: str | None = None
    cancel_mode: str = "before"
    second_cancel: bool = False
    halt: str | None = None
    work: dict[str, float] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)


#: seconds a body waits for the event it comes ``after`` (a test bug if it is reached)
AFTER_TIMEOUT = 20.0


def _script_key(scenario: str) -> str:
    return f"{reactor_settings.KEY_PREFIX}:test:saga-script:{scenario}"


def _ledger_key(scenario: str) -> str:
    return f"{reactor_settings.KEY_PREFIX}:test:saga-ledger:{scenario}"


def write_script(scenario: str, script: SagaScript) -> None:
    get_client().set(_script_key(scenario), json.dumps(asdict(script)), ex=3600)


def read_script(scenario: str) -> SagaScript:
    raw = get_client().get(_script_key(scenario))
    return SagaScript(**json.loads(raw)) if raw else SagaScript()


def note(scenario: str, context: Any, label: str, kind: str, **extra: Any) -> None:
    entry = {
        "root": str(context.root_execution_id or context.execution_id),
        "execution": str(context.execution_id),
        "label": label,
        "kind": kind,
        "attempt": getattr(context, "attempt", None),
        "pid": os.getpid(),
        "t": time.time_ns(),
        **extra,
    }
    # one round trip: a body's ``do`` is noted as close as can be to its return, when the
    # engine stamps its completion (the order of a rollback)
    pipe = get_client().pipeline(transaction=False)
    pipe.rpush(_ledger_key(scenario), json.dumps(entry))
    pipe.expire(_ledger_key(scenario), 3600)
    pipe.execute()


def note_outside(scenario: str, root: str, label: str, kind: str) -> None:
    """A ledger entry of the test itself (a cancel it sent, a child it killed)."""
    entry = {
        "root": root,
        "execution": root,
        "label": label,
        "kind": kind,
        "attempt": None,
        "pid": os.getpid(),
        "t": time.time_ns(),
        "outside": True,
    }
    get_client().rpush(_ledger_key(scenario), json.dumps(entry))


def ledger(scenario: str) -> list[dict[str, Any]]:
    return [json.loads(item) for item in get_client().lrange(_ledger_key(scenario), 0, -1)]


# --------------------------------------------------------------------------------------------
# step classes: one per (hooks, coordination)
# --------------------------------------------------------------------------------------------


def lock_key(args: dict[str, Any]) -> str:
    return f"saga-lock:{args['scenario']}:{args['label']}"


def semaphore_key(args: dict[str, Any]) -> str:
    return f"saga-sem:{args['scenario']}:{args['label']}"


def effect_label(args: dict[str, Any]) -> str:
    item = args.get("item")
    return args["label"] if item is None else f"{args['label']}[{item}]"


def _request_cancel(root: str, reason: str) -> None:
    from reactor_app.engine.cancel import cancel_execution

    cancel_execution(root, reason, by="saga-model")


def _request_cancels_from_thread(root: str, reasons: list[str]) -> None:
    from django.db import connection

    try:
        for reason in reasons:
            _request_cancel(root, reason)
    except Exception:  # the run may have ended meanwhile: the model judges the end
        pass
    finally:
        connection.close()  # this thread's own


class ModelStep(Step):
    """The body every slot runs: follows the scenario's script, writes the ledger."""

    inputs = ("scenario", "label", "item")
    retries = Retries(max_attempts=MAX_ATTEMPTS, backoff="fixed", base_delay=RETRY_DELAY)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        scenario, label = args["scenario"], effect_label(args)
        script = read_script(scenario)
        attempt = context.attempt
        note(scenario, context, label, "enter")
        if label in script.after:
            _wait_for(scenario, script.after[label], context)
        if script.cancel == label and not _cancel_requested(scenario, label):
            note(scenario, context, label, "cancel", mode=script.cancel_mode)
            root = str(context.root_execution_id or context.execution_id)
            reasons = ["first", "second"] if script.second_cancel else ["first"]
            if script.cancel_mode == "later":
                threading.Timer(LATER, _request_cancels_from_thread, (root, reasons)).start()
            else:
                for reason in reasons:
                    _request_cancel(root, reason)
            if script.cancel_mode == "during":
                deadline = time.monotonic() + 2.0
                while time.monotonic() < deadline:  # the checkpoint raises ExecutionCancelled
                    time.sleep(0.02)
                    context.checkpoint()
        seconds = float(script.work.get(label, 0.0))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)
            context.checkpoint()
        if attempt in script.fail.get(label, []):
            note(scenario, context, label, "fail")
            return Failure(f"{label} fails at attempt {attempt}", retryable=True)
        if script.halt == label:
            note(scenario, context, label, "halt")
            return Halt(f"{label} halts")
        note(scenario, context, label, "do")
        return Success({"label": label, "execution": str(context.execution_id)})


def _wait_for(scenario: str, event: str, context: Any) -> None:
    """Wait for ``event`` (``"<label>:<kind>"``, see ``SagaScript.after``)."""
    label, kind = event.split(":")
    deadline = time.monotonic() + AFTER_TIMEOUT
    while not _seen(scenario, label, kind):
        if time.monotonic() > deadline:
            raise AssertionError(f"{event} never came ({AFTER_TIMEOUT}s)")
        context.checkpoint()
        time.sleep(0.02)


def _seen(scenario: str, label: str, kind: str) -> bool:
    from reactor_app.models import Execution
    from reactor_app.status import TERMINAL_STATUSES

    wanted = "do" if kind == "ended" else kind
    entries = [e for e in ledger(scenario) if e["label"] == label and e["kind"] == wanted]
    if kind != "ended":
        return bool(entries)
    ids = [e["execution"] for e in entries]
    return Execution.objects.filter(pk__in=ids, status__in=TERMINAL_STATUSES).exists()


def _cancel_requested(scenario: str, label: str) -> bool:
    """Whether this scenario's ledger already shows the scripted cancel (once per script)."""
    return any(e["kind"] == "cancel" and e["label"] == label for e in ledger(scenario))


def _undo(self: Any, result: Any, args: dict[str, Any], context: Any) -> None:
    scenario, label = args["scenario"], effect_label(args)
    _hook_work(scenario, context, label, "undo")
    note(scenario, context, label, "undo", of=result)


def _hook_work(scenario: str, context: Any, label: str, kind: str) -> None:
    """A hook that works for a moment before its effect (``work["<label>:<kind>"]``) notes
    ``<kind>-enter`` first, so the test can act (kill its worker child) while it works."""
    seconds = float(read_script(scenario).work.get(f"{label}:{kind}", 0.0))
    if seconds:
        note(scenario, context, label, f"{kind}-enter")
        time.sleep(seconds)


def _compensate(self: Any, error: BaseException, args: dict[str, Any], context: Any) -> None:
    scenario, label = args["scenario"], effect_label(args)
    _hook_work(scenario, context, label, "compensate")
    note(scenario, context, label, "compensate", error=type(error).__name__)


def _make_step(hooks: str, coord: str) -> type[Step]:
    namespace: dict[str, Any] = {"__module__": __name__}
    if hooks in "ub":
        namespace["undo"] = _undo
    if hooks in "cb":
        namespace["compensate"] = _compensate
    name = f"Step_{hooks}{coord}"
    namespace["__qualname__"] = name
    cls: type[Step] = type(name, (ModelStep,), namespace)
    if coord == "l":
        cls = with_lock(lock_key, ttl=30)(cls)
    elif coord == "s":
        cls = with_semaphore(semaphore_key, limit=SEMAPHORE_LIMIT, ttl=30)(cls)
    return cls


STEPS: dict[str, type[Step]] = {h + c: _make_step(h, c) for h in HOOKS for c in COORDS}
for _cls in STEPS.values():
    setattr(sys.modules[__name__], _cls.__name__, _cls)


# --------------------------------------------------------------------------------------------
# shapes → reactor classes
# --------------------------------------------------------------------------------------------


def shape_name(shape: tuple[str, ...]) -> str:
    return "Saga_" + "_".join(shape)


def suppressed(label: str) -> Any:
    return lambda inputs, results: label not in inputs["suppress"]


def _child(label: str, hooks: str, coord: str) -> type[Reactor]:
    name = f"Child_{label}_{hooks}{coord}"
    existing = globals().get(name)
    if existing is not None:
        return existing  # type: ignore[no-any-return]
    namespace: dict[str, Any] = {
        "__module__": __name__,
        "__qualname__": name,
        "inputs": ("scenario",),
    }
    for index, child_hooks in enumerate((hooks, "b")[:CHILD_STEPS], start=1):
        namespace[f"c{index}"] = step(
            STEPS[child_hooks + coord],
            scenario=from_input("scenario"),
            label=value(f"{label}/c{index}"),
            item=value(None),
        )
    cls = type(name, (Reactor,), namespace)
    globals()[name] = cls
    return cls


def _slot(label: str, code: str) -> Any:
    kind, hooks, coord = code
    where = suppressed(label)
    common = {"scenario": from_input("scenario"), "label": value(label)}
    if kind == "t":
        return step(STEPS[hooks + coord], where=where, item=value(None), **common)
    if kind == "c":
        return compose(_child(label, hooks, coord), where=where, scenario=from_input("scenario"))
    if kind in "mp":
        return map_step(
            STEPS[hooks + coord],
            over=from_input("items"),
            parallel=kind == "p",
            where=where,
            item=element(),
            **common,
        )
    if kind == "a":
        return async_step(
            STEPS[hooks + coord], where=where, item=value(None), result_timeout=60, **common
        )
    raise ValueError(f"unknown slot kind {kind!r} in {code!r}")


def reactor_for(shape: tuple[str, ...]) -> type[Reactor]:
    """The reactor class of ``shape`` (built and registered once per process)."""
    for code in shape:
        if len(code) != 3 or code[0] not in KINDS or code[1] not in HOOKS or code[2] not in COORDS:
            raise ValueError(f"bad slot {code!r} in shape {shape!r}")
    name = shape_name(shape)
    existing = globals().get(name)
    if existing is not None:
        return existing  # type: ignore[no-any-return]
    namespace: dict[str, Any] = {
        "__module__": __name__,
        "__qualname__": name,
        "inputs": ("scenario", "items", "suppress"),
    }
    for index, code in enumerate(shape, start=1):
        namespace[f"s{index}"] = _slot(f"s{index}", code)
    cls = type(name, (Reactor,), namespace)
    globals()[name] = cls
    return cls


def random_shape(rng: random.Random, *, worker: bool) -> tuple[str, ...]:
    kinds = KINDS if worker else "tcmp"
    length = rng.randint(3, 8)
    return tuple(rng.choice(kinds) + rng.choice(HOOKS) + rng.choice(COORDS) for _ in range(length))


#: the shapes a worker knows (built at import in every process): a fixed seed, so the test
#: process and the workers build the same family
WORKER_SHAPES: list[tuple[str, ...]] = [
    random_shape(random.Random(f"saga-model-{n}"), worker=True) for n in range(48)
]
#: the shapes of the worker regression tests (test_regressions_workers.py), minimal cases the
#: model shrank to, built at import in every process too
REGRESSION_SHAPES: list[tuple[str, ...]] = [
    ("aux", "tux", "tux"),
    ("tux", "pux", "tux"),
    ("tux", "pul"),
    ("tux", "cux", "tux"),
    ("aux", "cux", "tux"),
    ("aux", "cul", "tux"),
    ("aux", "mux", "tux"),
    ("acx", "tux", "tux"),
    ("mbl",),
    ("tux", "tux", "tux"),
    ("tux", "cbx", "tux"),
]
for _shape in WORKER_SHAPES + REGRESSION_SHAPES:
    reactor_for(_shape)
