"""Real holds for observability tests: a reactor runs in a thread and waits inside its step.

``PaymentReactor``'s ``charge`` step holds a step-level lock on ``acct:<id>``;
``ShopSyncReactor`` holds a reactor-level lock on ``shop:<id>`` around its ``sync`` step;
``FragileReactor`` holds a 1.5 s auto-extended lock and notices a lost lease at once. Each
step body signals that it is inside (so the hold is live in Redis) and then waits until the
test lets it finish. ``running(...)`` wraps that in a context manager.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from reactor_app import Reactor, Step, Success, from_input, step, with_lock
from reactor_app.exceptions import LeaseLost
from reactor_app.models import Execution

#: seconds a test waits for a step to be inside its body, and a body waits to be let go
WAIT = 30.0


@dataclass
class Gate:
    """How a test and a waiting step body meet."""

    inside: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    lost: threading.Event = field(default_factory=threading.Event)
    seen: dict[str, Any] = field(default_factory=dict)


GATES: dict[str, Gate] = {}


def _wait_inside(name: str, context: Any) -> None:
    gate = GATES[name]
    gate.seen.update(execution_id=context.execution_id, token=context.fencing_token())
    gate.inside.set()
    if not gate.release.wait(WAIT):
        raise TimeoutError(f"test never released {name}")


class AuditStep(Step):
    inputs = ("account_id",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success("audited")


@with_lock(lambda args: f"acct:{args['account_id']}", ttl=30)
class ChargeStep(Step):
    inputs = ("account_id", "gate")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        _wait_inside(args["gate"], context)
        return Success({"charged": args["account_id"]})


class PaymentReactor(Reactor):
    """audit → charge (step-level lock ``acct:<account_id>``)."""

    inputs = ("account_id", "gate")

    audit = step(AuditStep, account_id=from_input("account_id"))
    charge = step(ChargeStep, account_id=from_input("account_id"), gate=from_input("gate"))


class SyncStep(Step):
    inputs = ("gate",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        _wait_inside(args["gate"], context)
        return Success("synced")


@with_lock(lambda inputs: f"shop:{inputs['shop_id']}", ttl=30)
class ShopSyncReactor(Reactor):
    """One step under a reactor-level lock ``shop:<shop_id>``."""

    inputs = ("shop_id", "gate")

    sync = step(SyncStep, gate=from_input("gate"))


@dataclass
class Running:
    gate: Gate
    thread: threading.Thread
    outcome: dict[str, Any]

    @property
    def execution_id(self) -> str:
        return str(self.gate.seen["execution_id"])

    @property
    def execution(self) -> Execution:
        return Execution.objects.get(pk=self.execution_id)

    def finish(self) -> Any:
        self.gate.release.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "the reactor thread did not finish"
        return self.outcome.get("result")


@contextmanager
def running(reactor: type[Reactor], name: str, **inputs: Any) -> Iterator[Running]:
    """Run ``reactor`` in a thread until its step body is inside (holding its key); yield;
    then let the body finish and join the thread.

    Needs a ``transactional_db`` test: the thread has its own database connection.
    """
    gate = GATES[name] = Gate()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = reactor.run(gate=name, **inputs)
        except BaseException as exc:  # reported by the test, not lost in the thread
            outcome["error"] = exc
            gate.inside.set()
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, name=f"reactor-{name}", daemon=True)
    thread.start()
    run = Running(gate, thread, outcome)
    try:
        if not gate.inside.wait(WAIT):
            raise AssertionError(f"{reactor.__name__} never reached its step body")
        if "error" in outcome:
            raise AssertionError(f"{reactor.__name__} crashed: {outcome['error']!r}")
        yield run
    finally:
        gate.release.set()
        thread.join(WAIT)
        GATES.pop(name, None)


@with_lock(lambda args: f"lease:{args['account_id']}", ttl=1.5)
class FragileStep(Step):
    """Holds a short-lived auto-extended lock and checks it at every tick, so a lost lease
    surfaces within a renewal interval (``ttl / 3`` = 0.5 s)."""

    inputs = ("account_id", "gate")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        gate = GATES[args["gate"]]
        gate.seen.update(execution_id=context.execution_id, token=context.fencing_token())
        gate.inside.set()
        deadline = time.monotonic() + WAIT
        while not gate.release.is_set() and time.monotonic() < deadline:
            try:
                context.checkpoint()
            except LeaseLost as lost:
                gate.seen["lost"] = lost
                gate.lost.set()
                raise
            time.sleep(0.02)
        return Success("done")


class FragileReactor(Reactor):
    """One step holding ``lease:<account_id>`` with a 1.5 s auto-extended lease."""

    inputs = ("account_id", "gate")

    work = step(FragileStep, account_id=from_input("account_id"), gate=from_input("gate"))
