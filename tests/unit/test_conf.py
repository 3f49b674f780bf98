"""``reactor_app.conf``: settings are read once per settings object, and every way Django
supports for changing them is seen at once."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.test import override_settings

from reactor_app.conf import ReactorSettings, reactor_settings


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
