"""An ordered lock on a direct ``Step.call``: its place in line is taken by the admission itself.

A direct call has no execution to persist a position in, so it does not take one in a round
trip of its own before admission: ``admit.lua`` assigns it (``claims.UNASSIGNED``) and answers
it, and the caller keeps it for its further attempts, its release and leaving the line. Real
Redis (standalone, and the 3-master cluster through ``redis_topology``), real threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from reactor_app import Step, Success, with_lock, with_ordered_lock
from reactor_app.coordination import scripts
from reactor_app.exceptions import LockAcquisitionError
from reactor_app.testing import assert_ordered_lock
from tests.concurrency.harness import held_elsewhere

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def operations(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The coordination scripts this test's thread runs, by name, in order (the real calls go
    through: this only writes down their names)."""
    seen: list[str] = []
    original = scripts.Scripts.call
    caller = threading.get_ident()

    def recording(self: scripts.Scripts, operation: str, keys: Any, args: Any) -> Any:
        if threading.get_ident() == caller:
            seen.append(operation)
        return original(self, operation, keys, args)

    monkeypatch.setattr(scripts.Scripts, "call", recording)
    yield seen


@pytest.mark.usefixtures("redis_topology")
def test_a_direct_call_joins_the_line_and_passes_it_in_one_round_trip_each_way(
    operations: list[str],
) -> None:
    @with_ordered_lock(lambda a: f"ordered-call:{a['n']}", poison_pill_timeout=30)
    @with_lock(lambda a: f"ordered-call:{a['n']}")
    class Apply(Step):
        inputs = ("n",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success(args["n"])

    assert Apply.call(n=1).value == 1
    assert operations == ["admit", "release"]  # no ordered_position call of its own
    assert Apply.call(n=1).value == 1
    # two places taken, both completed in turn: the line is free
    assert_ordered_lock("ordered-call:1", next=3, last_completed=2, in_flight=None)


@pytest.mark.usefixtures("redis_topology")
def test_a_direct_call_refused_by_another_claim_leaves_the_line_it_joined() -> None:
    @with_ordered_lock(lambda a: "ordered-call:line", poison_pill_timeout=30)
    @with_lock(lambda a: "ordered-call:account", wait=0)
    class Charge(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success("charged")

    with held_elsewhere("ordered-call:account"):
        refused = Charge.call()
    assert isinstance(refused.error, LockAcquisitionError)
    # the place the refused admission took is given up: the line moved past it
    assert_ordered_lock("ordered-call:line", next=2, last_completed=1, in_flight=None)
    started = time.monotonic()
    assert Charge.call().ok  # not queued behind the abandoned place (a 30 s poison pill)
    assert time.monotonic() - started < 5
    assert_ordered_lock("ordered-call:line", next=3, last_completed=2)


def test_a_waiting_direct_call_keeps_its_place_across_attempts() -> None:
    inside = threading.Event()
    leave = threading.Event()
    spans: dict[str, tuple[float, float]] = {}

    @with_ordered_lock(lambda a: "ordered-call:turns", poison_pill_timeout=30, wait=10)
    class Turn(Step):
        inputs = ("name",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            entered = time.monotonic()
            if args["name"] == "first":
                inside.set()
                assert leave.wait(10)
            spans[args["name"]] = (entered, time.monotonic())
            return Success(args["name"])

    outcomes: dict[str, Any] = {}
    first = threading.Thread(target=lambda: outcomes.setdefault("first", Turn.call(name="first")))
    first.start()
    assert inside.wait(10)
    # the second call is refused (not its turn), waits, and tries again: several attempts
    threading.Timer(0.5, leave.set).start()
    outcomes["second"] = Turn.call(name="second")
    first.join(10)
    assert outcomes["first"].ok and outcomes["second"].ok, outcomes
    assert spans["second"][0] >= spans["first"][1]  # in line order, never together
    # exactly two places were ever taken: every retry of the second reused its own
    assert_ordered_lock("ordered-call:turns", next=3, last_completed=2, in_flight=None)


@pytest.mark.usefixtures("redis_topology")
def test_a_direct_call_whose_keys_span_cluster_slots_takes_its_place_before_admission(
    operations: list[str], redis_topology: str
) -> None:
    """On a cluster, keys in different hash slots cannot share a script call: the claims are
    admitted one by one, so no single admission can take the place in line for all of them —
    it is taken first, as an execution's is. A call refused by its lock still leaves the line
    it joined, and the next call passes it."""

    @with_ordered_lock(lambda a: "ordered-call:line-a", poison_pill_timeout=30)
    @with_lock(lambda a: "ordered-call:account-b", wait=0)
    class Settle(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success("settled")

    with held_elsewhere("ordered-call:account-b"):
        refused = Settle.call()
    assert isinstance(refused.error, LockAcquisitionError)
    assert_ordered_lock("ordered-call:line-a", next=2, last_completed=1, in_flight=None)
    operations.clear()
    started = time.monotonic()
    assert Settle.call().value == "settled"
    assert time.monotonic() - started < 5
    if redis_topology == "cluster":
        assert operations[0] == "ordered_position" and operations.count("admit") == 2
    else:
        assert operations == ["admit", "release"]
    assert_ordered_lock("ordered-call:line-a", next=3, last_completed=2, in_flight=None)
