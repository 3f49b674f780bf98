"""Unit tests of the coordination layer against a real Redis (no fakes, no mocked clocks).

They need no Django database. Redis is the configured coordination Redis (``REDIS_URL`` / the
embedded server); each test works under the suite's per-test key prefix (``redis_prefix``),
whose keys alone are deleted afterwards.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import zipfile
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

import reactor_app.coordination
from reactor_app.coordination import embedded, ordered_lock, period, rate_limit, state
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    Admitted,
    ChainFailed,
    Holder,
    LockClaim,
    OrderedLockClaim,
    PeriodClaim,
    PeriodHit,
    RateLimitClaim,
    RateWindow,
    Refused,
    SemaphoreClaim,
)
from reactor_app.coordination.keys import hash_slot, key, split_key
from reactor_app.coordination.redis import get_client, redis_url
from reactor_app.coordination.refusals import refusal_error
from reactor_app.coordination.renewal import Renewal
from reactor_app.coordination.scripts import (
    STATUSES,
    Status,
    decode_reply,
    primitive_sections,
    script_sources,
    scripts_for,
)
from reactor_app.exceptions import (
    ConfigurationError,
    CoordinationUnavailable,
    LeaseLost,
    LockAcquisitionError,
    OrderedLockWaitError,
    RateLimitExceeded,
    SemaphoreAcquisitionError,
)
from tests.renewing import KEPT_LEASE, wait_for_rounds

ALICE = Holder(owner="alice", execution_id="exec-a", step="charge", reactor="shop.Payment")
BOB = Holder(owner="bob", execution_id="exec-b", step="charge", reactor="shop.Payment")


@pytest.fixture(scope="module")
def url() -> str:
    return redis_url()


@pytest.fixture
def prefix(redis_prefix: str) -> str:
    """The suite's per-test key prefix (set in settings, cleaned up after the test)."""
    return redis_prefix


@pytest.fixture
def coordinator(url: str, prefix: str) -> Coordinator:
    return Coordinator(client=get_client(url), prefix=prefix)


def one_window(seconds: float, limit: int) -> tuple[RateWindow, ...]:
    return rate_limit.windows_from(limit=limit, period=seconds)


# -- package, keys, status table ------------------------------------------------------------


def test_lua_scripts_load_from_the_package_resources() -> None:
    folder = resources.files("reactor_app.coordination").joinpath("lua")
    files = {entry.name for entry in folder.iterdir() if entry.name.endswith(".lua")}
    operations = {name[: -len(".lua")] for name in files if not name.startswith("_")}
    assert {"admit", "release", "extend", "heartbeat", "ordered_position", "force_release"} <= (
        operations
    )
    sources = script_sources()
    assert set(sources) == operations
    for name, source in sources.items():
        # every operation opens with its contract (after a "#!lua flags=..." line, if any)
        # and has its fragments spliced in
        body = re.sub(r"\A#!lua[^\n]*\n", "", source)
        assert body.startswith(f"--[[ {name}.lua"), name
        assert "Returns" in source, name
        assert not re.search(r"^-- @include", source, re.MULTILINE), name
        # the clock: every script but the three that never look at it
        assert "local function redis_now" in source or name in (
            "period_bucket",
            "holds_shards",
            "limits_publish",
        )


def test_lua_files_are_declared_package_data() -> None:
    import tomllib
    from pathlib import Path

    project = Path(__file__).resolve().parents[2] / "pyproject.toml"
    package_data = tomllib.loads(project.read_text())["tool"]["setuptools"]["package-data"]
    assert "coordination/lua/*.lua" in package_data["reactor_app"]


def test_lua_scripts_load_from_a_zipped_package(tmp_path: Path) -> None:
    """No filesystem paths: the scripts load through importlib.resources even from a zip."""
    source_root = Path(reactor_app.coordination.__file__).resolve().parents[2]
    archive = tmp_path / "packaged.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("reactor_app/__init__.py", "")  # the package root without the DSL
        for name in ("conf.py", "exceptions.py"):
            bundle.write(source_root / "reactor_app" / name, f"reactor_app/{name}")
        coordination = source_root / "reactor_app" / "coordination"
        for path in sorted(coordination.rglob("*")):
            if path.suffix in (".py", ".lua"):
                bundle.write(path, str(path.relative_to(source_root)))
    probe = (
        "import sys, json; sys.path.insert(0, sys.argv[1]);"
        "from reactor_app.coordination import scripts;"
        "print(json.dumps([scripts.__file__, sorted(scripts.script_sources())]))"
    )
    site_packages = [p for p in sys.path if p.endswith("site-packages")]
    completed = subprocess.run(
        [sys.executable, "-c", probe, str(archive)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(site_packages)},
    )
    module_file, operations = json.loads(completed.stdout)
    assert module_file.startswith(str(archive))
    assert operations == sorted(script_sources())


def test_key_layout_keeps_every_key_of_a_user_key_in_one_hash_slot() -> None:
    assert key("lock", "acct:1", prefix="p") == "p:lock:{acct:1}"
    assert key("lock", "acct:1", "fence", prefix="p") == "p:lock:{acct:1}:fence"
    # braces in a user key would move the hash tag: they are escaped, reversibly
    braced = key("lock", "a{b}%c", prefix="p")
    assert braced == "p:lock:{a%7Bb%7D%25c}"
    assert split_key(braced, "lock", prefix="p") == "a{b}%c"
    assert split_key("p:lock:{acct:1}:fence", "lock", prefix="p") is None

    from reactor_app.coordination import lock, semaphore

    position = ordered_lock.OrderedPosition(nonce=1, epoch=1)
    claims: list[Any] = [
        LockClaim("acct:1"),
        SemaphoreClaim("acct:1", limit=2),
        RateLimitClaim("acct:1", one_window(1, 3) + one_window(60, 100)),
        PeriodClaim("acct:1", "hour"),
        OrderedLockClaim("acct:1", position),
    ]
    modules = {"lock": lock, "semaphore": semaphore, "rate_limit": rate_limit}
    modules.update({"period": period, "ordered_lock": ordered_lock})
    names = [name for c in claims for name in modules[c.primitive].admit_keys(c, "p")]
    assert len({hash_slot(name) for name in names}) == 1
    assert all("{acct:1}" in name for name in names)


def test_status_table_covers_every_code() -> None:
    assert set(STATUSES) == set(Status)
    assert STATUSES[Status.LOCKED].error is LockAcquisitionError
    assert STATUSES[Status.RATE_LIMITED].error is RateLimitExceeded
    assert STATUSES[Status.LOST].error is LeaseLost


def lua_status_codes() -> dict[str, int]:
    """The status constants of ``lua/_common.lua``: the ``local NAME, ... = 0, ...`` lines
    under its "Status codes" comment, up to the first blank line."""
    folder = resources.files("reactor_app.coordination").joinpath("lua")
    text = folder.joinpath("_common.lua").read_text(encoding="utf-8")
    block = text.split("-- Status codes", 1)[1].split("\n\n", 1)[0]
    codes: dict[str, int] = {}
    for names, values in re.findall(r"^local ([A-Z_, ]+) = ([0-9, ]+)$", block, re.MULTILINE):
        pairs = list(zip(names.split(","), values.split(","), strict=True))
        codes.update({name.strip(): int(value) for name, value in pairs})
    return codes


def test_lua_status_codes_match_the_python_enum() -> None:
    """Both directions: every Lua constant is a ``Status`` of that value, and every ``Status``
    has its Lua constant (a code added on one side only fails here, not in production)."""
    lua = lua_status_codes()
    assert lua, "no status constants found in _common.lua"
    assert lua == {status.name: status.value for status in Status}


def test_a_reply_reads_every_empty_table_as_a_list_and_the_rest_as_is() -> None:
    """cjson encodes an empty Lua table as ``{}``; the payload's fields are read as lists."""
    nested = decode_reply([1, b'{"blocker":{},"holds":[{"woken":{}}],"key":"a{}b"}'])
    assert nested.status is Status.LOCKED
    assert nested.data == {"blocker": [], "holds": [{"woken": []}], "key": "a{}b"}
    plain = decode_reply([0, '{"holds":[{"fresh":true,"token":"17"}],"time":"1.5"}'])
    assert plain.data == {"holds": [{"fresh": True, "token": "17"}], "time": "1.5"}
    assert decode_reply([0, b""]).data == decode_reply([0, None]).data == {}


def test_lua_scripts_reply_only_known_status_codes() -> None:
    known = {status.name for status in Status}
    for name, source in script_sources().items():
        used = set(re.findall(r"\breply\(([A-Z_]+)\b", source))
        assert used <= known, (name, used - known)


def test_the_primitive_registry_and_the_scripts_name_the_same_primitives() -> None:
    """One registry (``coordination.primitives``) names the primitives; the scripts dispatch on
    the same names. A primitive added on one side only fails here."""
    from reactor_app.coordination import primitives
    from reactor_app.coordination.claims import ADMISSION_ORDER

    assert primitives.NAMES == ADMISSION_ORDER
    assert all(name == primitives.get(name).PRIMITIVE for name in primitives.NAMES)
    # one Lua file per primitive, registering itself in each general script's dispatch table
    assert set(primitive_sections()) == set(primitives.NAMES)
    sources = script_sources()

    def registered(table: str, script: str) -> set[str]:
        return set(re.findall(rf"^{table}\['(\w+)'\]", sources[script], re.MULTILINE))

    assert set(re.findall(r"^CHECK\['(\w+)'\], TAKE\['\1'\]", sources["admit"], re.M)) == set(
        primitives.NAMES
    )
    assert registered("RELEASE", "release") == set(primitives.NAMES)
    assert registered("EXTEND", "extend") == set(primitives.RENEWABLE)
    # the owned holds are what the live-holds index, the held-key registry and rollback know
    assert primitives.HOLDING == ("lock", "semaphore")


# -- lock -----------------------------------------------------------------------------------


def test_fencing_tokens_increase_per_key_and_never_fall_below_redis_time(
    coordinator: Coordinator,
) -> None:
    from reactor_app.coordination import lock

    client = coordinator.client
    tokens = []
    for _ in range(30):  # back to back: faster than the clock's resolution matters
        held = coordinator.admit([LockClaim("fenced", ttl=5)], ALICE)
        assert isinstance(held, Admitted)
        tokens.append(held.token_for("fenced"))
        coordinator.release(held, "success")
    assert tokens == sorted(set(tokens))  # strictly increasing

    # every key lost (a restart without persistence): the floor is the Redis clock in µs
    client.delete(lock.fence_key("fenced", coordinator.prefix))
    seconds, micros = client.time()
    held = coordinator.admit([LockClaim("fenced", ttl=5)], ALICE)
    assert isinstance(held, Admitted)
    floor = int(seconds) * 1_000_000 + int(micros)
    assert (held.token_for("fenced") or 0) >= floor > (tokens[-1] or 0)
    coordinator.release(held, "success")

    # a counter ahead of the clock is never pulled back to it
    ahead = floor + 10**9
    client.set(lock.fence_key("fenced", coordinator.prefix), ahead)
    held = coordinator.admit([LockClaim("fenced", ttl=5)], ALICE)
    assert isinstance(held, Admitted) and held.token_for("fenced") == ahead + 1


def test_lock_is_reentrant_counts_nesting_and_frees_at_the_outermost_release(
    coordinator: Coordinator,
) -> None:
    claim = LockClaim("acct:1", ttl=30)
    outer = coordinator.admit([claim], ALICE)
    inner = coordinator.admit([LockClaim("acct:1", ttl=5)], ALICE)
    assert isinstance(outer, Admitted) and isinstance(inner, Admitted)
    assert outer.holds[0].fresh and not inner.holds[0].fresh
    assert inner.holds[0].token == outer.holds[0].token
    snapshot = state.lock_state("acct:1", client=coordinator.client)
    assert (snapshot.owner, snapshot.count, snapshot.step) == ("alice", 2, "charge")
    assert snapshot.ttl is not None and snapshot.ttl > 25  # re-entry never shortens the lease

    refused = coordinator.admit([claim], BOB)
    assert isinstance(refused, Refused)
    assert refused.blocker is not None and refused.blocker["owner"] == "alice"
    assert refused.blocker["execution"] == "exec-a" and refused.blocker["step"] == "charge"
    assert 25 < (refused.retry_after or 0) <= 30

    assert coordinator.release(inner, "success").freed == []
    assert state.lock_state("acct:1", client=coordinator.client).count == 1
    assert isinstance(coordinator.admit([claim], BOB), Refused)
    assert coordinator.release(outer, "success").freed == [("lock", "acct:1")]
    assert not state.lock_state("acct:1", client=coordinator.client).held

    again = coordinator.admit([claim], BOB)
    assert isinstance(again, Admitted)
    # fencing survives release: the next holder's token is strictly larger
    assert (again.holds[0].token or 0) > (outer.holds[0].token or 0)
    coordinator.release(again, "success")


def test_release_by_a_non_owner_is_reported_not_applied(coordinator: Coordinator) -> None:
    held = coordinator.admit([LockClaim("acct:2")], ALICE)
    assert isinstance(held, Admitted)
    impostor = Admitted(holds=held.holds, holder=BOB)
    assert coordinator.release(impostor, "success").not_held == [("lock", "acct:2")]
    assert state.lock_state("acct:2", client=coordinator.client).held
    coordinator.release(held, "success")


def test_refusal_errors_name_reactor_step_and_key(coordinator: Coordinator) -> None:
    held = coordinator.admit([LockClaim("acct:3", ttl=20)], ALICE)
    refused = coordinator.admit([LockClaim("acct:3")], BOB)
    assert isinstance(held, Admitted) and isinstance(refused, Refused)
    error = refusal_error(refused, "shop.Payment", "charge")
    assert isinstance(error, LockAcquisitionError)
    assert (error.reactor, error.step, error.key, error.primitive) == (  # type: ignore[attr-defined]
        "shop.Payment",
        "charge",
        "acct:3",
        "lock",
    )
    assert "shop.Payment" in error.message and "'charge'" in error.message
    assert "'acct:3'" in error.message and error.retry_after  # type: ignore[attr-defined]
    coordinator.release(held, "success")

    full = coordinator.admit([SemaphoreClaim("pool", limit=1)], ALICE)
    refused = coordinator.admit([SemaphoreClaim("pool", limit=1)], BOB)
    assert isinstance(full, Admitted) and isinstance(refused, Refused)
    error = refusal_error(refused, "R", "s")
    assert isinstance(error, SemaphoreAcquisitionError) and error.limit == 1  # type: ignore[attr-defined]

    claim = RateLimitClaim("api", one_window(60, 1))
    assert isinstance(coordinator.admit([claim], ALICE), Admitted)
    refused = coordinator.admit([claim], BOB)
    assert isinstance(refused, Refused)
    error = refusal_error(refused, "R", "s")
    assert isinstance(error, RateLimitExceeded)
    assert (error.limit, error.period) == (1, "minute")  # type: ignore[attr-defined]


# -- admission is all-or-nothing ------------------------------------------------------------


def five_claims(user_key: str, position: ordered_lock.OrderedPosition, limit: int = 1) -> list:
    return [
        RateLimitClaim(user_key, one_window(60, 10)),
        SemaphoreClaim(user_key, limit=limit),
        LockClaim(user_key, ttl=10),
        PeriodClaim(user_key, "hour"),
        OrderedLockClaim(user_key, position, poison_pill_timeout=30),
    ]


@pytest.mark.parametrize("atomic", [None, False], ids=["one-call", "one-by-one"])
def test_nothing_is_taken_unless_everything_is(
    coordinator: Coordinator, atomic: bool | None
) -> None:
    coordinator = Coordinator(client=coordinator.client, prefix=coordinator.prefix, atomic=atomic)
    blocker = coordinator.admit([SemaphoreClaim("k", limit=1)], BOB)
    assert isinstance(blocker, Admitted)
    position = coordinator.assign_position("k", ALICE)
    refused = coordinator.admit(five_claims("k", position), ALICE)
    assert isinstance(refused, Refused) and refused.claim.primitive == "semaphore"
    client = coordinator.client
    assert not state.lock_state("k", client=client).held  # the lock was not taken (or given back)
    assert state.rate_limit_count("k", "minute", client=client) == 0  # nor the rate charged
    assert state.ordered_state("k", client=client).in_flight is None
    assert state.period_reserved("k", "hour", client=client) is None  # nor the bucket reserved

    coordinator.release(blocker, "success")
    admitted = coordinator.admit(five_claims("k", position), ALICE)
    assert isinstance(admitted, Admitted)
    assert [h.claim.primitive for h in admitted.holds] == [
        "ordered_lock",
        "period",
        "lock",
        "semaphore",
        "rate_limit",
    ]
    assert state.rate_limit_count("k", "minute", client=client) == 1
    released = coordinator.release(admitted, "success")
    assert set(released.freed) == {
        ("lock", "k"),
        ("semaphore", "k"),
        ("ordered_lock", "k"),
        ("period", "k"),  # the reservation ends: marked done
    }
    assert released.marked == [("period", "k")]


def test_period_hit_completes_the_ordered_position(coordinator: Coordinator) -> None:
    done = coordinator.admit([PeriodClaim("daily", "day")], ALICE)
    assert isinstance(done, Admitted)
    coordinator.release(done, "success")
    position = coordinator.assign_position("daily", BOB)
    claims = [OrderedLockClaim("daily", position), PeriodClaim("daily", "day")]
    hit = coordinator.admit(claims, BOB)
    assert isinstance(hit, PeriodHit) and hit.marked_by == "exec-a"
    # a skipped step is a terminal outcome for its place in line
    assert state.ordered_state("daily", client=coordinator.client).last_completed == position.nonce


def test_a_skip_at_admission_wakes_the_next_position(coordinator: Coordinator) -> None:
    done = coordinator.admit([PeriodClaim("digest", "day")], ALICE)
    assert isinstance(done, Admitted)
    coordinator.release(done, "success")  # the bucket is marked
    first = coordinator.assign_position("digest", BOB)
    second = coordinator.assign_position("digest", ALICE)
    waiting = coordinator.admit(
        [OrderedLockClaim("digest", second)], ALICE, waiter_id="parked-second"
    )
    assert isinstance(waiting, Refused)  # not its turn: parked as a waiter
    hit = coordinator.admit([OrderedLockClaim("digest", first), PeriodClaim("digest", "day")], BOB)
    assert isinstance(hit, PeriodHit)
    # The skip completed the head; the parked second position is handed its wake-up.
    assert hit.woken == ["parked-second"]


# -- period -----------------------------------------------------------------------------------


def test_period_marks_only_on_success_with_the_execution(coordinator: Coordinator) -> None:
    claim = PeriodClaim("report:1", "hour")
    first = coordinator.admit([claim], ALICE)
    assert isinstance(first, Admitted)
    assert coordinator.release(first, "failure").marked == []
    assert state.period_marked("report:1", "hour", client=coordinator.client) is None
    second = coordinator.admit([claim], BOB)
    assert isinstance(second, Admitted)  # a failed run does not use the bucket up
    coordinator.release(second, "success")
    assert state.period_marked("report:1", "hour", client=coordinator.client) == "exec-b"
    hit = coordinator.admit([claim], ALICE)
    assert isinstance(hit, PeriodHit) and hit.marked_by == "exec-b"
    # another bucket size is another dedup window
    assert isinstance(coordinator.admit([PeriodClaim("report:1", 7)], ALICE), Admitted)


def test_validate_every() -> None:
    assert period.validate_every("Hour") == "hour"
    assert period.validate_every(90) == 90
    assert period.validate_every(60.0) == 60
    for bad in ("fortnight", 0, -5, 1.5, True, None, [1]):
        with pytest.raises(ValueError, match="every"):
            period.validate_every(bad)


MOMENTS = [
    "1970-01-01T00:00:00",
    "1999-12-31T23:59:59",
    "2000-02-29T12:00:00",
    "2023-01-01T00:00:00",  # a Sunday: ISO week began 2022-12-26
    "2024-02-29T23:59:59",
    "2024-03-01T00:00:00",
    "2024-12-30T08:00:00",  # ISO week 1 of 2025
    "2100-03-01T00:00:01",
    "2026-09-10T17:42:13",
]


def test_lua_calendar_buckets_match_python_datetime(coordinator: Coordinator) -> None:
    for text in MOMENTS:
        at = datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()
        for every in (*period.UNITS, 7, 900):
            lua = period.current_bucket(every, at=at, client=coordinator.client)
            assert lua == period.bucket_bounds(every, at), (text, every)
            assert lua[0] <= at < lua[1]
    monday = datetime(2023, 1, 1, tzinfo=UTC).timestamp()
    start, end = period.current_bucket("week", at=monday, client=coordinator.client)
    assert datetime.fromtimestamp(start, UTC).isoformat() == "2022-12-26T00:00:00+00:00"
    assert end - start == 7 * 86400


# -- rate limit --------------------------------------------------------------------------------


def test_parse_period_and_windows() -> None:
    assert rate_limit.parse_period("minute") == 60.0
    assert rate_limit.parse_period(2.5) == 2.5
    with pytest.raises(ValueError, match="fortnight"):
        rate_limit.parse_period("fortnight")
    windows = rate_limit.windows_from(limits={"minute": 100, "second": 3})
    assert [(w.seconds, w.limit, w.label) for w in windows] == [
        (1.0, 3, "second"),
        (60.0, 100, "minute"),
    ]
    with pytest.raises(ValueError):
        rate_limit.windows_from(limit=0, period="second")


def test_named_limits_resolve_from_settings() -> None:
    limits = {
        "stripe": {"limit": 100, "period": "second"},
        "mail": {"limits": {"second": 3, "minute": 100}, "strategy": "fixed"},
    }
    with override_settings(REACTOR_RATE_LIMITS=limits):
        assert rate_limit.named_windows("stripe") == (RateWindow(1.0, 100, "second"),)
        assert [w.limit for w in rate_limit.named_windows("mail")] == [3, 100]
        assert rate_limit.named_claim("mail").strategy == "fixed"
        with pytest.raises(ConfigurationError, match="unknown named rate limit 'sms'"):
            rate_limit.named_windows("sms")


def test_fixed_window_strategy_counts_and_refuses(coordinator: Coordinator) -> None:
    claim = RateLimitClaim("bulk", one_window(3600, 2), strategy="fixed")
    for holder in (ALICE, BOB):
        assert isinstance(coordinator.admit([claim], holder), Admitted)
    refused = coordinator.admit([claim], ALICE)
    assert isinstance(refused, Refused) and refused.claim.primitive == "rate_limit"
    assert 0 < (refused.retry_after or 0) <= 3600  # until the epoch-aligned hour ends
    client = coordinator.client
    assert state.rate_limit_count("bulk", "hour", strategy="fixed", client=client) == 2


# -- semaphore ----------------------------------------------------------------------------------


def test_semaphore_is_reentrant_one_slot_per_owner(coordinator: Coordinator) -> None:
    outer = coordinator.admit([SemaphoreClaim("pool", limit=2)], ALICE)
    inner = coordinator.admit([SemaphoreClaim("pool", limit=2)], ALICE)
    assert isinstance(outer, Admitted) and isinstance(inner, Admitted)
    snapshot = state.semaphore_state("pool", 2, client=coordinator.client)
    assert (snapshot.held, snapshot.available, snapshot.holders[0].count) == (1, 1, 2)
    coordinator.release(inner, "success")
    assert state.semaphore_state("pool", client=coordinator.client).held == 1
    assert coordinator.release(outer, "success").freed == [("semaphore", "pool")]
    assert state.semaphore_state("pool", client=coordinator.client).held == 0


# -- ordered lock ------------------------------------------------------------------------------


def test_ordered_lock_strict_chain_fails_after_a_failure_until_reset(
    coordinator: Coordinator,
) -> None:
    positions = [coordinator.assign_position("line", h) for h in (ALICE, BOB, ALICE)]
    assert [p.nonce for p in positions] == [1, 2, 3]
    claims = [OrderedLockClaim("line", p, poison_pill_timeout=30) for p in positions]

    assert isinstance(coordinator.admit([claims[1]], BOB), Refused)  # not its turn
    first = coordinator.admit([claims[0]], ALICE)
    assert isinstance(first, Admitted)
    coordinator.release(first, "failure")
    chain = coordinator.admit([claims[2]], ALICE)  # not even the head: the line is stopped
    assert isinstance(chain, ChainFailed) and chain.first_failed == 1
    chain = coordinator.admit([claims[1]], BOB)
    assert isinstance(chain, ChainFailed)
    snapshot = state.ordered_state("line", client=coordinator.client)
    assert (snapshot.last_completed, snapshot.first_failed, snapshot.head) == (3, 1, None)

    epoch = coordinator.reset("line")
    assert epoch > positions[0].epoch
    stale = coordinator.admit([claims[1]], BOB)
    assert isinstance(stale, Refused) and stale.detail.stale and stale.detail.reason == "epoch"
    assert isinstance(refusal_error(stale, "R", "s"), OrderedLockWaitError)
    fresh = coordinator.assign_position("line", BOB)
    assert fresh.nonce == 1 and fresh.epoch == epoch
    assert isinstance(coordinator.admit([OrderedLockClaim("line", fresh)], BOB), Admitted)


def test_ordered_lock_retry_keeps_the_position_and_skip_passes_the_head(
    coordinator: Coordinator,
) -> None:
    first, second = (coordinator.assign_position("q", h) for h in (ALICE, BOB))
    head = coordinator.admit([OrderedLockClaim("q", first)], ALICE)
    assert isinstance(head, Admitted)
    coordinator.release(head, "retry")
    assert state.ordered_state("q", client=coordinator.client).last_completed == 0
    peeked = coordinator.peek("q")
    assert peeked is not None and (peeked.nonce, peeked.owner) == (1, "alice")
    assert coordinator.skip("q") == 1
    assert isinstance(coordinator.admit([OrderedLockClaim("q", second)], BOB), Admitted)
    stale = coordinator.admit([OrderedLockClaim("q", first)], ALICE)
    assert isinstance(stale, Refused) and stale.detail.stale  # skipped: re-assign


def test_non_strict_ordered_lock_continues_after_a_failure(coordinator: Coordinator) -> None:
    first, second = (coordinator.assign_position("loose", h) for h in (ALICE, BOB))
    head = coordinator.admit([OrderedLockClaim("loose", first, strict=False)], ALICE)
    assert isinstance(head, Admitted)
    coordinator.release(head, "failure")
    assert isinstance(
        coordinator.admit([OrderedLockClaim("loose", second, strict=False)], BOB), Admitted
    )


# -- parked waiters, force release, renewal ---------------------------------------------------


def test_release_returns_the_parked_waiter_registered_by_the_refusal(
    coordinator: Coordinator,
) -> None:
    claim = LockClaim("acct:9", ttl=30)
    held = coordinator.admit([claim], ALICE)
    assert isinstance(held, Admitted)
    assert isinstance(coordinator.admit([claim], BOB, waiter_id="exec-b"), Refused)
    coordinator.register_waiter(claim, "exec-c")
    assert coordinator.waiters(claim) == ["exec-b", "exec-c"]
    released = coordinator.release(held, "success")
    assert released.woken == ["exec-b"] and list(released) == ["exec-b"]
    bob = coordinator.admit([claim], BOB, waiter_id="exec-b")
    assert isinstance(bob, Admitted)
    assert coordinator.waiters(claim) == ["exec-c"]
    assert coordinator.release(bob, "success").woken == ["exec-c"]


def test_force_release_frees_whatever_the_nesting(coordinator: Coordinator) -> None:
    claim = LockClaim("stuck", ttl=60)
    for _ in range(3):
        assert isinstance(coordinator.admit([claim], ALICE), Admitted)
    assert coordinator.force_release("lock", "stuck", owner="bob").released == []
    assert coordinator.force_release("lock", "stuck").released == ["alice"]
    assert isinstance(coordinator.admit([claim], BOB), Admitted)
    for holder in (ALICE, BOB):
        coordinator.admit([SemaphoreClaim("slots", limit=5)], holder)
    assert coordinator.force_release("semaphore", "slots", owner="alice").released == ["alice"]
    assert [h.owner for h in state.semaphore_state("slots", client=coordinator.client).holders] == [
        "bob"
    ]


def test_force_releasing_a_semaphore_releases_only_live_leases(coordinator: Coordinator) -> None:
    """A lease that lapsed (not purged yet) holds nothing: it is not released, audited or
    counted, and wakes no waiter."""
    assert isinstance(
        coordinator.admit([SemaphoreClaim("slots:lapsed", limit=5, ttl=0.1)], ALICE), Admitted
    )
    assert isinstance(
        coordinator.admit([SemaphoreClaim("slots:lapsed", limit=5, ttl=60)], BOB), Admitted
    )
    time.sleep(0.3)  # alice's lease lapses
    assert coordinator.force_release("semaphore", "slots:lapsed", owner="alice").released == []
    assert coordinator.force_release("semaphore", "slots:lapsed").released == ["bob"]


def test_a_force_released_lock_goes_to_its_head_waiter_first(coordinator: Coordinator) -> None:
    """A forced release hands the lock on as a release does: the head waiter is granted the
    key for a moment, so a newcomer cannot take it first, and the waiters keep their order."""
    claim = LockClaim("forced", ttl=60)
    assert isinstance(coordinator.admit([claim], ALICE), Admitted)
    for waiter in ("exec-b", "exec-c"):
        assert not isinstance(coordinator.admit([claim], BOB, waiter_id=waiter), Admitted)
    assert coordinator.force_release("lock", "forced").woken == ["exec-b"]
    newcomer = coordinator.admit([claim], Holder(owner="newcomer"))
    assert isinstance(newcomer, Refused)
    assert newcomer.blocker and newcomer.blocker["granted_to"] == "exec-b"
    assert isinstance(coordinator.admit([claim], BOB, waiter_id="exec-b"), Admitted)
    assert coordinator.waiters(claim) == ["exec-c"]


def test_live_holds_are_attributed(coordinator: Coordinator) -> None:
    coordinator.admit([LockClaim("acct:{7}", ttl=30)], ALICE)
    coordinator.admit([SemaphoreClaim("pool", limit=3, ttl=30)], BOB)
    holds = state.live_holds(client=coordinator.client)
    assert [(h["primitive"], h["key"], h["owner"]) for h in holds] == [
        ("lock", "acct:{7}", "alice"),
        ("semaphore", "pool", "bob"),
    ]
    lock_hold = holds[0]
    assert lock_hold["step"] == "charge" and lock_hold["execution"] == "exec-a"
    assert lock_hold["reactor"] == "shop.Payment"
    assert lock_hold["token"] == state.lock_state("acct:{7}", client=coordinator.client).token
    assert lock_hold["count"] == 1 and 25 < lock_hold["ttl_left"] <= 30
    assert abs(lock_hold["acquired_at"] - time.time()) < 60


def test_renewal_reports_a_lost_lease(coordinator: Coordinator) -> None:
    held = coordinator.admit([LockClaim("lease", ttl=KEPT_LEASE)], ALICE)
    assert isinstance(held, Admitted)
    lost: list[LeaseLost] = []
    extended: list[tuple[str, int]] = []
    renewal = Renewal(
        held,
        coordinator=coordinator,
        on_lost=lost.append,
        on_extended=lambda key_, ms: extended.append((key_, ms)),
    ).start()
    try:
        wait_for_rounds(1)
        assert renewal.lost is None and extended and extended[0][0] == "lease"
        coordinator.force_release("lock", "lease")
        deadline = time.monotonic() + 5
        while renewal.lost is None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        started = time.monotonic()
        renewal.stop()
        # stop() waits for no sleep of the thread (a round every 0.5 s), nor its 5 s timeout
        assert time.monotonic() - started < 2.5
    assert renewal.lost is not None and lost == [renewal.lost]
    assert renewal.lost.key == "lease"  # type: ignore[attr-defined]
    assert renewal.lost.token == held.holds[0].token  # type: ignore[attr-defined]
    # gone from Redis while this process's clock still gave it most of a lease: said, with
    # what can cause it (an operator, as here, or a renewal that reached Redis late)
    reason = renewal.lost.fields()["reason"]
    left = float(reason.removeprefix("released with ").split(" s of its lease left")[0])
    assert 0 < left <= KEPT_LEASE, reason
    assert "by an operator" in reason and "stalled" in reason, reason
    with pytest.raises(LeaseLost):
        renewal.raise_if_lost()


def test_many_holds_are_renewed_by_one_thread_in_shared_pipelines(
    coordinator: Coordinator,
) -> None:
    """One renewal thread per process, not one per hold; holds due together share a round
    (one pipeline of extend calls)."""
    import threading

    from reactor_app.coordination.renewal import scheduler

    before = {t.ident for t in threading.enumerate() if t.name.startswith("reactor-renewal")}
    renewals: list[Renewal] = []
    admissions: list[Admitted] = []
    try:
        for n in range(20):
            claim = LockClaim(f"many:{n}", ttl=KEPT_LEASE)
            admitted = coordinator.admit([claim], Holder(owner=f"o{n}"))
            assert isinstance(admitted, Admitted)
            admissions.append(admitted)
            renewals.append(Renewal(admitted, coordinator=coordinator).start())
        rounds_before = scheduler().rounds
        # four renewals, a third of a lease apart: past the lease, so without them every lock
        # would have lapsed
        deadline = time.monotonic() + 15
        while min(r.renewals for r in renewals) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        threads = [t for t in threading.enumerate() if t.name.startswith("reactor-renewal")]
        assert len(threads) == 1 and len(before - {t.ident for t in threads}) == 0
        for n, renewal in enumerate(renewals):
            assert renewal.lost is None and renewal.renewals >= 4, (n, renewal.renewals)
            assert state.lock_state(f"many:{n}", client=coordinator.client).held
        rounds = scheduler().rounds - rounds_before
        renewed = sum(r.renewals for r in renewals)
        assert rounds * 4 <= renewed, (rounds, renewed)  # shared rounds, not one per hold
    finally:
        for renewal in renewals:
            renewal.stop()
        for admitted in admissions:
            coordinator.release(admitted, "success")


# -- unreachable Redis ----------------------------------------------------------------------


def test_unreachable_redis_is_coordination_unavailable(tmp_path: Any) -> None:
    for dead in ("redis://127.0.0.1:1/0", embedded.url(tmp_path / "nowhere")):
        coordinator = Coordinator(client=get_client(dead), prefix="dead")
        with pytest.raises(CoordinationUnavailable) as caught:
            coordinator.admit([LockClaim("acct:1")], ALICE)
        assert caught.value.cause is not None  # type: ignore[attr-defined]
        assert caught.value.key == "acct:1"  # type: ignore[attr-defined]
        with pytest.raises(CoordinationUnavailable):
            state.lock_state("acct:1", client=coordinator.client, prefix="dead")


def test_scripts_are_registered_per_client(url: str) -> None:
    client = get_client(url)
    assert scripts_for(client) is scripts_for(client)
    assert set(scripts_for(client).names) == set(script_sources())


def test_the_lua_waiting_prefix_is_pythons() -> None:
    """Scripts tell waiters waiting in-process (short hand-off grants) by the id prefix the
    Python side gives them."""
    from reactor_app.coordination.claims import WAITING_PREFIX

    folder = resources.files("reactor_app.coordination").joinpath("lua")
    text = folder.joinpath("_common.lua").read_text(encoding="utf-8")
    assert re.findall(r"^local WAITING_PREFIX = '([^']*)'$", text, re.MULTILINE) == [WAITING_PREFIX]


def test_a_forked_child_inherits_the_assembled_scripts_and_the_renewal_module() -> None:
    """A process that forks its workers before any coordination (a prefork pool) prepares
    what each child would otherwise build again before its first admission: the assembled
    sources, the Functions library and the renewal module (``scripts._prepare_before_fork``,
    ``leases._import_renewal_before_fork``). A fresh interpreter, so nothing is built yet."""
    probe = (
        "import json, os, sys\n"
        "from reactor_app.coordination import function_library, leases, script_sources\n"
        "def state():\n"
        "    return [script_sources.script_sources.cache_info().currsize,\n"
        "            function_library.library.cache_info().currsize,\n"
        "            'reactor_app.coordination.renewal' in sys.modules,\n"
        "            leases._start_renewal is not None]\n"
        "before = state()\n"
        "read, write = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.write(write, json.dumps(state()).encode())\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print(json.dumps([before, json.loads(os.read(read, 1000))]))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    before, in_child = json.loads(completed.stdout)
    assert before == [0, 0, False, False]
    assert in_child == [1, 1, True, True]
