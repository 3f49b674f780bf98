"""The primitive interface (``coordination.primitives``): every registered module provides what
the ``Primitive`` protocol lists (and ``Renewable``/``Holding`` for the modules registered as
such), and the name tables callers use derive from the modules' flags.

Mypy checks the modules against the protocols where the registry is built; this test checks the
same at run time, from the protocols themselves, so a member added to a protocol and missing in
a module (or a module registered without one) fails here too.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import pytest

from reactor_app.coordination import primitives
from reactor_app.coordination.claims import ADMISSION_ORDER, LockClaim, SemaphoreClaim


def protocol_members(protocol: type) -> tuple[dict[str, Any], dict[str, inspect.Signature]]:
    """``(flags: name -> annotation, callables: name -> signature without self)`` that
    ``protocol`` and the protocols it extends declare."""
    flags: dict[str, Any] = {}
    methods: dict[str, inspect.Signature] = {}
    for klass in reversed(protocol.__mro__):
        if klass in (object,) or klass.__module__ != primitives.__name__:
            continue
        flags.update(getattr(klass, "__annotations__", {}))
        for name, value in vars(klass).items():
            if inspect.isfunction(value) and not name.startswith("_"):
                signature = inspect.signature(value)
                parameters = list(signature.parameters.values())[1:]  # without self
                methods[name] = signature.replace(parameters=parameters)
    return flags, methods


def missing_members(module: Any, protocol: type) -> list[str]:
    """What ``module`` lacks of ``protocol``: absent or mistyped flags, absent callables, or
    callables whose parameters are not the protocol's (names and kinds)."""
    flags, methods = protocol_members(protocol)
    missing = []
    for name, annotation in flags.items():
        value = getattr(module, name, None)
        wanted = {"str": str, "bool": bool}[str(annotation)]
        if type(value) is not wanted:
            missing.append(f"{name}: {annotation}")
    for name, signature in methods.items():
        function = getattr(module, name, None)
        if not callable(function):
            missing.append(f"{name}()")
            continue
        have = [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]
        want = [(p.name, p.kind) for p in signature.parameters.values()]
        if have != want:
            missing.append(f"{name}{inspect.signature(function)} (wanted {name}{signature})")
    return missing


@pytest.mark.parametrize("name", primitives.NAMES)
def test_every_registered_module_provides_the_primitive_interface(name: str) -> None:
    module = primitives.get(name)
    assert name == module.PRIMITIVE
    assert missing_members(module, primitives.Primitive) == []
    if name in primitives.RENEWABLE:
        assert missing_members(module, primitives.Renewable) == []
    if module.HOLDS:
        # a holding module is a Holding, and its leases are renewed while the work runs
        assert primitives.holding(name) is module
        assert name in primitives.RENEWABLE
        assert missing_members(module, primitives.Holding) == []
    else:
        assert name not in primitives.HOLDING_MODULES


def test_the_check_finds_a_missing_member() -> None:
    """A module lacking one member of the interface (or taking other parameters) is caught."""
    lock = primitives.get("lock")
    incomplete = types.ModuleType("incomplete")
    incomplete.__dict__.update(
        {name: getattr(lock, name) for name in dir(lock) if name not in ("HINTED", "inspect")}
    )
    incomplete.summary = lambda data: ""  # type: ignore[attr-defined]
    missing = missing_members(incomplete, primitives.Primitive)
    assert "HINTED: bool" in missing
    assert "inspect()" in missing
    assert any(entry.startswith("summary") for entry in missing)
    assert missing_members(lock, primitives.Holding) == []


def test_the_tables_callers_use_derive_from_the_flags() -> None:
    assert primitives.NAMES == ADMISSION_ORDER
    assert tuple(primitives.REGISTRY) == ADMISSION_ORDER
    # owned holds: the live-holds index, the held-key registry, parks, rollback, force release
    assert primitives.HOLDING == ("lock", "semaphore")
    assert tuple(primitives.HOLDING_MODULES) == primitives.HOLDING
    # a refusal's retry_after is when to come back (the worker requeues a park then)
    assert primitives.HINTED == ("ordered_lock", "rate_limit")
    # parked waits the contention ceiling does not cap
    assert primitives.UNCAPPED_WAITS == ("ordered_lock",)
    # budget never given back: charged once per run, waiting past retry_after is useless
    assert primitives.CHARGING == ("rate_limit",)
    assert set(primitives.RENEWABLE) == {"period", "lock", "semaphore"}
    for name in primitives.NAMES:
        assert primitives.holds(name) is primitives.get(name).HOLDS


def test_a_hold_known_by_its_key_is_claimed_by_its_module() -> None:
    assert primitives.holding("lock").hold_claim("k", None) == LockClaim("k")
    assert primitives.holding("semaphore").hold_claim("k", None) == SemaphoreClaim("k", limit=1)
    assert primitives.holding("semaphore").hold_claim("k", 3) == SemaphoreClaim("k", limit=3)
    with pytest.raises(KeyError):
        primitives.holding("rate_limit")


@pytest.mark.parametrize("name", primitives.NAMES)
def test_every_primitive_reports_a_key_nobody_used(name: str, redis_prefix: str) -> None:
    """The operator view of an untouched key: a report, its summary line, nobody to link."""
    module = primitives.get(name)
    report = {"primitive": name, "key": "untouched", **module.inspect("untouched")}
    assert isinstance(module.summary(report), str) and module.summary(report)
    assert module.attributed(report) == []
    if module.HOLDS:
        assert primitives.holding(name).holders("untouched") == {}
