"""``reactor_app.conf``: settings are read once per settings object, and every way Django
supports for changing them is seen at once."""

from __future__ import annotations

import math
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from reactor_app.bounds import LONGEST_SECONDS
from reactor_app.checks import check_settings
from reactor_app.conf import ReactorSettings, reactor_settings
from reactor_app.exceptions import ConfigurationError


def test_a_setting_is_read_once_then_served_from_the_cache(monkeypatch: Any) -> None:
    from reactor_app import conf

    reads: list[str] = []
    real = conf._read

    def counting(holder: Any, name: str, default: Any) -> Any:
        reads.append(name)
        return real(holder, name, default)

    monkeypatch.setattr(conf, "_read", counting)
    fresh = ReactorSettings()
    assert [fresh.CANCEL_POLL for _ in range(5)] == [fresh.CANCEL_POLL] * 5
    assert reads == ["REACTOR_CANCEL_POLL"]


def test_override_settings_is_seen_on_entry_and_on_exit() -> None:
    before = reactor_settings.KEY_PREFIX
    with override_settings(REACTOR_KEY_PREFIX="conf-test"):
        assert reactor_settings.KEY_PREFIX == "conf-test"
        with override_settings(REACTOR_KEY_PREFIX="conf-inner"):
            assert reactor_settings.KEY_PREFIX == "conf-inner"
        assert reactor_settings.KEY_PREFIX == "conf-test"
    assert before == reactor_settings.KEY_PREFIX


def test_the_settings_fixture_is_seen_including_a_deleted_setting(settings: Any) -> None:
    settings.REACTOR_WORKER_WAIT = 0.25
    assert reactor_settings.WORKER_WAIT == 0.25
    settings.REACTOR_WORKER_WAIT = 2.0
    assert reactor_settings.WORKER_WAIT == 2.0
    del settings.REACTOR_WORKER_WAIT
    assert reactor_settings.WORKER_WAIT == 1.0  # the default


def test_a_setting_deleted_by_an_override_gets_its_default_and_comes_back_after() -> None:
    with override_settings(REACTOR_CONTENTION_CEILING=3):
        assert reactor_settings.CONTENTION_CEILING == 3
        with override_settings():
            del django_settings.REACTOR_CONTENTION_CEILING
            assert reactor_settings.CONTENTION_CEILING == 20
        assert reactor_settings.CONTENTION_CEILING == 3


def test_the_configured_client_follows_a_change_of_the_redis_setting() -> None:
    from reactor_app.coordination.redis import get_client

    configured = get_client()
    assert get_client() is configured
    other_url = "redis://127.0.0.1:1/0"  # never connected to: clients connect lazily
    with override_settings(REACTOR_REDIS=None, REACTOR_REDIS_URL=other_url):
        switched = get_client()
        assert switched is not configured
        assert switched.connection_pool.connection_kwargs["port"] == 1
    assert get_client() is configured


#: every duration setting, and whether 0 is a value of it
DURATION_SETTINGS = {
    "TRACKING_FLUSH_INTERVAL": False,
    "MAP_CHECKPOINT_SECONDS": True,
    "EXECUTION_CLAIM_TTL": False,
    "SWEEP_AFTER": False,
    "LONGEST_COUNTDOWN": False,
    "SWEEP_INTERVAL": True,
    "EXTERNAL_SWEEP_INTERVAL": False,
    "WORKER_WAIT": True,
    "CANCEL_POLL": True,
}


@pytest.mark.parametrize("name", sorted(DURATION_SETTINGS))
@given(
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.floats(min_value=LONGEST_SECONDS / 2, max_value=LONGEST_SECONDS * 2),
        st.sampled_from([0, 0.0, -0.0, 1, True, False, None, "5", LONGEST_SECONDS]),
    )
)
def test_a_duration_setting_is_a_finite_number_of_seconds_within_the_bounds(
    name: str, value: Any
) -> None:
    """NaN passed the older ``value <= 0`` checks, an infinity overflowed the first
    ``timedelta`` made of it, and ``True`` was one second of claim lease."""
    allow_zero = DURATION_SETTINGS[name]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    shortest = 0.001 if name == "EXECUTION_CLAIM_TTL" else 0  # a lease: whole ms
    valid = (
        number
        and math.isfinite(value)
        and value <= LONGEST_SECONDS
        and (value > shortest or (allow_zero and value == 0) or value == shortest > 0)
    )
    with override_settings(**{f"REACTOR_{name}": value}):
        if valid:
            assert getattr(reactor_settings, name) == float(value)
        else:
            with pytest.raises(ConfigurationError, match=f"REACTOR_{name}"):
                getattr(reactor_settings, name)


#: values a settings file may hold by mistake
misconfigured = st.one_of(
    st.text(max_size=8),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([None, True, False, [], {}, ["x"], {"x": 1}, ("a", 1), object()]),
)


#: every setting of the typed settings (each property), found here rather than taken from
#: ``checks``: a setting the check leaves out fails the property below
EVERY_SETTING = sorted(
    name
    for name in dir(ReactorSettings)
    if name.isupper() and isinstance(getattr(ReactorSettings, name), property)
)


@pytest.mark.parametrize("name", EVERY_SETTING)
@given(value=misconfigured)
def test_every_value_a_setting_refuses_is_reported_by_manage_py_check(
    name: str, value: Any
) -> None:
    """``manage.py check`` read twelve settings of a hand-kept list: a bad value of nine others
    (``REACTOR_WORKER_WAIT = "1"``, ``REACTOR_MAP_CHECKPOINT_EVERY = 0``...) passed it and
    raised only where it was first read, in a worker; ``REACTOR_API_PERMISSION_CLASSES = 5``
    raised a ``TypeError`` there. Every setting is read now, and refuses with a
    ``ConfigurationError`` only."""
    with override_settings(**{f"REACTOR_{name}": value}):
        try:
            getattr(reactor_settings, name)
            refused = False
        except ConfigurationError:
            refused = True
        reported = {problem.obj for problem in check_settings() if problem.id == "reactor_app.E001"}
    assert reported == ({f"REACTOR_{name}"} if refused else set())
