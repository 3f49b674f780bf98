"""A Sentinel failover under real workers (issue 31 item 2; the same fault on threads is
``test_fault_histories::test_sentinel_failover``): executions of the small reactors of
``worker_fault_reactors`` — every primitive at step and reactor level, and a step lock whose
holder writes a row through ``fenced_update`` — run on one real ``celery worker -c 4`` whose
``REACTOR_REDIS_URL`` is a ``redis+sentinel://`` URL of a master + replica + sentinel set of
this module's own (not the plugin's ``reactor_redis_sentinel``, which is per test: the
worker's URL is fixed when it starts). Once bodies run, the master is SIGKILLed and the
sentinel promotes the replica; the worker follows it (docs/operations.md "Sentinel: failover
and what it can lose").

Replication is asynchronous, so the replica may lack the master's last writes: the failover is
a ``lose`` fault, and what is checked is what docs/coordination.md "Guarantees" promises across
lost state — the same as for a restart (``test_worker_restart_histories``), no more:

* each key's history as the bodies saw it, with the failover a ``lose`` fault — a lost hold
  may be taken again at once (a lock's or semaphore's exclusion is **not** promised across
  it), a window or a mark may be forgotten, a line numbers its positions again; but
  **fencing tokens never go backwards** per key;
* the fenced row: ``fenced_update`` never accepts a write below an accepted token;
* **nothing strands**: every execution ends terminal within the recovery bound without an
  operator, and once they have, no hold is left (after at most a lease) and no ordered line
  has anyone in flight — a completion the failover lost leaves a done execution's position in
  flight until a later arrival passes it over after the poison pill (docs/operations.md), so
  each line showing one gets one more execution first. A run whose hold was lost under its
  body (the master gone for longer than the 1 s leases: docs/operations.md sizes lock TTLs
  above the failover time, these are not) fails with ``LeaseLost``; no other failure is
  accepted;
* **a lease shorter than the failover is declared lost** (docs/operations.md): the anchor's
  step reports ``LeaseLost`` (its execution may still succeed: its delivery lost the
  execution claim with the master too, so the next delivery runs the step again).

That the failover met a live hold is made certain, not left to luck: an *anchor* — a step
semaphore on a key of its own whose body runs for ``ANCHOR_HOLD`` seconds, its lease renewed
meanwhile (a semaphore lease always is; these locks are not ``auto_extend``, so a lock's hold
would lapse under a long body) — is enqueued ahead of each round, and the master is killed as
soon as the anchor has entered its body.

A module of its own: its worker points at its sentinel. ``REACTOR_FAULT_SOAK_SECONDS``
(``make soak``) runs more rounds and failovers, the killed master started again as a replica of
the new one between them. The operations checked per primitive and level are printed
(``report``); one run's figures are in docs/operations.md "How coordination is tested".
"""

from __future__ import annotations

import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reactor_app.testing.clock_watch import ClockWatch
from reactor_app.testing.history import History, load, operations
from reactor_app.testing.linearizability import check
from reactor_app.testing.redis_processes import START_TIMEOUT, client, wait_until
from reactor_app.testing.servers import SentinelServers
from tests.chaos.fault_histories import SOAK, report, running
from tests.chaos.worker_histories import (
    FENCED_ACCOUNT,
    LOST_STATE_PLAN,
    enqueue,
    is_ordered,
    is_period,
    models_for,
    wait_settled,
    worker_histories,
    worker_settings,
)

pytestmark = [pytest.mark.chaos, pytest.mark.sentinel]

#: executions per recorded name (and keys) of one round; ``make soak`` runs one round (and one
#: failover) per 15 s of ``REACTOR_FAULT_SOAK_SECONDS``, each on keys of its own
FAILOVER_PLAN = LOST_STATE_PLAN
#: seconds the anchor's body holds its slot: the master is killed once it has entered, so the
#: kill lands inside it unless the machine stalls this long between two looks at the history
ANCHOR_HOLD = 6.0
#: seconds every execution gets to end, per round: failover, claim TTL, sweep, backoffs — with
#: margin for a loaded machine
SETTLED_WITHIN = 90.0


@dataclass
class FailingOverSentinel(SentinelServers):
    """``SentinelServers`` whose killed master can come back as the new master's replica, so a
    long run fails over again and again.

    The sentinel waits 3 s of silence, not 1 s, before it fails over: on a loaded two-core
    machine a master that does not answer for a second is no rarity — a soak run beside a
    full suite saw the sentinel fail over a second time on its own while the killed master
    rejoined, a failover outside the schedule's recorded ``lose`` faults. Every failover must
    be the schedule's: one the sentinel makes on its own is reported as such (``rejoin``),
    not waited out."""

    down_after_ms: int = 3000

    def rejoin(self, old_port: int) -> None:
        """Start a server on ``old_port`` replicating the current master; return once it has
        synced and the sentinel counts it as a healthy replica again."""
        master = self.master_port()
        self.servers = [s for s in self.servers if s.port != old_port]
        args = [*self._common(old_port), "--replicaof", "127.0.0.1", str(master)]
        self._await_ping(self._spawn(old_port, args, f"rejoined-{old_port}-{secrets.token_hex(2)}"))

        def healthy() -> bool:
            if client(old_port).info("replication").get("master_link_status") != "up":
                return False
            replicas = self.sentinel().execute_command("SENTINEL", "REPLICAS", self.service_name)
            # one dict per replica: healthy once its flags are just "slave", its link up
            return any(
                int(entry["port"]) == old_port
                and set(str(entry["flags"]).split(",")) == {"slave"}
                and entry.get("master-link-status") == "ok"
                for entry in replicas
            )

        try:
            wait_until(healthy, START_TIMEOUT * 2, "the killed master to rejoin as a replica")
        except RuntimeError as error:
            seen = self.sentinel().execute_command("SENTINEL", "REPLICAS", self.service_name)
            now = self.master_port()
            if now != master:
                raise RuntimeError(
                    f"the sentinel failed over on its own while {old_port} rejoined: its master "
                    f"is {now}, not {master} (the master did not answer the sentinel for "
                    f"{self.down_after_ms} ms: a stalled machine); the sentinel's replicas: "
                    f"{seen}"
                ) from error
            raise RuntimeError(f"{error}; the sentinel's replicas: {seen}") from error


@pytest.fixture(scope="module")
def sentinel_set() -> Iterator[FailingOverSentinel]:
    """The worker's coordination Redis: a master + replica + sentinel of this module's own."""
    with running(FailingOverSentinel) as servers:
        yield servers


@pytest.fixture(scope="module")
def celery_worker_settings(
    sentinel_set: FailingOverSentinel, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The worker (and the test) coordinate through ``sentinel_set``."""
    return worker_settings(
        tmp_path_factory.mktemp("worker-failover-deliveries"), REACTOR_REDIS_URL=sentinel_set.url
    )


@pytest.fixture(scope="module")
def celery_worker_concurrency() -> int:
    """More pool processes than the semaphore's slots."""
    return 4


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_all_primitives_on_real_workers_through_a_sentinel_failover(
    worker: Any,
    sentinel_set: FailingOverSentinel,
    tmp_path: Path,
    clock_watch: Callable[[History], ClockWatch],
) -> None:
    def fail_over() -> tuple[int, int]:
        old = sentinel_set.kill_master()
        return old, sentinel_set.wait_for_failover(old)

    failover_schedule(
        tmp_path / "history.jsonl",
        "Sentinel failover",
        fail_over,
        rejoin=lambda killed: sentinel_set.rejoin(killed[0]),
        rounds=1 + int(SOAK // 15),
        anchor_lease_lost=True,
        clock_watch=clock_watch,
    )


#: seconds an operator read (the test's own, after the run) may meet the old topology
OPERATOR_READ_WITHIN = 30.0


def operator_read(read: Callable[[], Any]) -> Any:
    """``read()``, asked again while it raises ``CoordinationUnavailable``: the test process's
    client may still know the killed master (a cluster client that has not sent a keyed
    command since maps it until a failed call makes it ask the cluster again; under Sentinel
    the first call on a connection to the old master fails) — docs/operations.md "Sentinel:
    failover and what it can lose"."""
    from reactor_app.exceptions import CoordinationUnavailable

    deadline = time.monotonic() + OPERATOR_READ_WITHIN
    while True:
        try:
            return read()
        except CoordinationUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def failover_schedule(
    path: Path,
    title: str,
    fail_over: Callable[[], tuple[int, int]],
    *,
    rejoin: Callable[[tuple[int, int]], None] | None,
    rounds: int,
    anchor_lease_lost: bool,
    clock_watch: Callable[[History], ClockWatch],
) -> None:
    """Run ``rounds`` rounds of ``FAILOVER_PLAN`` on the module's worker, each after its
    anchor, ``fail_over()`` (kill a master, wait for its replica to serve; returns (killed
    port, promoted port)) once the round's anchor has entered its body, ``rejoin`` before the
    next round; then check everything the module docstring lists, and with
    ``anchor_lease_lost`` that the anchor's lease was declared lost (its key's server was
    the one killed). Shared with ``test_worker_cluster_failover_histories``."""
    from demo_project.shop.models import Account
    from reactor_app.models import Execution
    from reactor_app.testing import coordination_state
    from tests.chaos.worker_fault_reactors import REACTORS, deliveries

    Account.objects.create(number=FENCED_ACCOUNT, balance=0)
    history = History(path)
    watch = clock_watch(history)  # stopped before the history is read back
    rng = random.Random(31)
    plan: list[tuple[str, str]] = []
    enqueued: dict[str, tuple[str, int]] = {}
    anchors: list[str] = []
    failovers: list[tuple[int, int]] = []  # (killed port, promoted port)
    # per failover: whether the anchor's semaphore lease was live in Redis just before the kill
    held_at_kill: list[bool] = []

    def entered(execution: str) -> bool:
        return any(
            e.f == "entered" and e.type == "ok" and e.process.startswith(f"{execution}:")
            for e in load(path)
        )

    for round_ in range(rounds):
        # Each round is enqueued once the previous failover is over (and its master back),
        # its anchor first (the queue is first in, first out), so that the failover meets
        # the round's executions running: a step semaphore (renewed) on a key of its own.
        key = f"semaphore:anchor:{secrets.token_hex(3)}"
        at = time.monotonic_ns()
        run = REACTORS["semaphore"].run_async(key=key, history=str(path), hold=ANCHOR_HOLD)
        enqueued[str(run.id)] = ("semaphore", at)
        anchors.append(str(run.id))
        batch, more = enqueue(FAILOVER_PLAN, 1, path, rng)
        plan, enqueued = plan + batch, {**enqueued, **more}
        end = time.monotonic() + SETTLED_WITHIN
        while not entered(anchors[-1]):
            assert time.monotonic() < end, "the anchor never entered its body"
            time.sleep(0.02)
        live = operator_read(coordination_state().holds)
        held_at_kill.append(any(h["key"] == key for h in live))
        fault = history.nemesis("lose", what=f"{title}: master SIGKILLed")
        failovers.append(fail_over())
        fault.ok()
        if round_ < rounds - 1:
            assert rejoin is not None, "a second failover needs the killed master back"
            rejoin(failovers[-1])

    wait_settled(enqueued, SETTLED_WITHIN)
    # A completion the failover lost (sent while the master was down, or not yet replicated)
    # leaves its position in flight on the promoted replica, its execution done: what bounds
    # it is the poison pill (docs/operations.md, "Sentinel: failover and what it can lose"),
    # and only a later arrival on the line passes it over. One more execution on each such
    # line must be admitted after the pill and leave the line empty (checked below).
    state = coordination_state()
    stuck = {
        (name, key)
        for name, key in plan
        if is_ordered(name)
        and (lambda line: line.in_flight is not None or line.positions)(
            operator_read(lambda key=key: state.ordered_lock(key))
        )
    }
    followers: dict[str, tuple[str, int]] = {}
    for name, key in sorted(stuck):
        at = time.monotonic_ns()
        run = REACTORS[name].run_async(key=key, history=str(path), hold=0.1)
        followers[str(run.id)] = (name, at)
    wait_settled(followers, SETTLED_WITHIN)
    plan, enqueued = plan + sorted(stuck), {**enqueued, **followers}

    # every execution ended; a failure only where its step's hold was lost under its body
    runs = Execution.objects.filter(pk__in=list(enqueued))
    outcomes = Counter(run.status for run in runs)
    for run in runs:
        name = enqueued[str(run.pk)][0]
        if run.status == "failed":
            assert "LeaseLost" in str(run.error), (name, run.error)
        else:
            allowed = ("succeeded", "halted") if name == "reactor_period" else ("succeeded",)
            assert run.status in allowed, (name, run.status, run.error)

    # nothing is left held: every hold was released, or lapses with its lease
    deadline = time.monotonic() + 10
    while operator_read(state.holds) and time.monotonic() < deadline:
        time.sleep(0.1)
    holds = operator_read(state.holds)
    assert holds == [], holds
    for key in {key for name, key in plan if is_ordered(name)}:
        line = operator_read(lambda key=key: state.ordered_lock(key))
        assert line.in_flight is None and not line.positions, (key, line)

    watch.stop()
    ops = operations(load(path))
    started = deliveries()
    assert {o.value["pid"] for o in ops if o.f == "entered"} <= set(started)
    histories = worker_histories(ops, enqueued, started)
    models = models_for(histories, lost_state=True)
    results = {
        name: check(histories[name], models[name]) for name in [*FAILOVER_PLAN, "fenced row"]
    }
    text = report(f"{title} ({len(failovers)}) on real workers", results)
    print(text)
    faults = [o for o in ops if o.f == "lose"]
    # what the failover met: bodies entered while the master was down or being replaced
    during = [
        o
        for o in ops
        if o.f == "entered"
        and any(f.call <= (o.ret or 0) <= (f.ret or 2**63) for f in ops if f.f == "lose")
    ]
    ends_at = {o.value["session"]: o.call for o in ops if o.f in ("release", "complete")}
    holding = [
        o
        for o in ops
        if o.f == "entered"
        and any((o.ret or 2**63) < f.call < ends_at.get(o.value["session"], 0) for f in faults)
    ]
    failed = [
        (enqueued[str(run.pk)][0] + (" (anchor)" if str(run.pk) in anchors else ""), run.error)
        for run in runs
        if run.status == "failed"
    ]
    print(
        f"  executions: {dict(outcomes)}, failed: {failed}; "
        f"failovers (killed, promoted): {failovers}, "
        f"{sum((f.ret or f.call) - f.call for f in ops if f.f == 'lose') / 1e9:.1f} s in all; "
        f"bodies holding at a kill: {len(holding)}, entered meanwhile: {len(during)}"
    )
    print(f"  ordered lines a lost completion left in flight: {sorted(k for _, k in stuck)}")
    for result in results.values():
        assert result.valid, text

    # every failover landed while its anchor's body held its key (the anchor made it so): its
    # lease was live in Redis just before the kill, and the kill came before its body ended
    assert all(held_at_kill) and len(held_at_kill) == rounds, held_at_kill
    assert len(faults) == rounds
    for fault, anchor in zip(faults, anchors, strict=True):
        bodies = [o for o in ops if o.f == "entered" and o.value["execution"] == anchor]
        runs_of_held = [
            (status, (error or {}).get("type"))
            for status, error in runs.get(pk=anchor)
            .step_runs.filter(step="held")
            .values_list("status", "error")
        ]
        print(f"  anchor: {len(bodies)} bodies ran; its held step's runs: {runs_of_held}")
        if anchor_lease_lost:
            # its 1 s lease is shorter than any failover (the sentinel waits a second before
            # it even calls the master down): declared lost, as docs/operations.md says
            assert ("failed", "LeaseLost") in runs_of_held, runs_of_held
        assert any(
            o.ret is not None and o.ret < fault.call < ends_at.get(o.value["session"], 2**63)
            for o in bodies
        ), f"the failover did not land inside the anchor's body: {fault.describe()}"

    # the row counts exactly the writes it accepted; some were made, and a write was refused
    # only after one with a higher token had begun (a stale holder's, not a current one's)
    writes = [o for o in ops if o.f == "write" and o.status == "ok"]
    accepted = [o for o in writes if o.value["accepted"]]
    assert accepted
    assert Account.objects.get(number=FENCED_ACCOUNT).balance == len(accepted)
    for refused in (o for o in writes if not o.value["accepted"]):
        assert any(
            a.value["token"] > refused.value["token"] and a.call < (refused.ret or 2**63)
            for a in accepted
        ), refused
    # every execution that succeeded, but a period's (whose bucket may be done), ran its body
    ran = {o.value["execution"] for o in ops if o.f == "entered"}
    succeeded = {str(pk) for pk in runs.filter(status="succeeded").values_list("pk", flat=True)}
    assert {e for e in succeeded if not is_period(enqueued[e][0])} <= ran
