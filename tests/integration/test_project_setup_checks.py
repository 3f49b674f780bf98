"""What a project adopting reactor_app is told at setup: the Redis setting (no silent local
server), ``reactors.py`` autodiscovery, and the public typing surface."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import run_checks

import reactor_app
from reactor_app.checks import check_redis_url
from reactor_app.coordination.redis import redis_url
from reactor_app.exceptions import ConfigurationError

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _ids(settings_values: dict[str, Any], settings: Any) -> set[str]:
    for name, value in settings_values.items():
        setattr(settings, name, value)
    return {problem.id for problem in check_redis_url()}


def test_an_unset_redis_url_is_an_error_not_a_private_server(settings: Any) -> None:
    del settings.REACTOR_REDIS_URL
    assert _ids({"DEBUG": True}, settings) == {"reactor_app.E002"}
    with pytest.raises(ConfigurationError, match='"embedded"'):
        redis_url()


def test_the_embedded_server_is_an_error_once_debug_is_off(settings: Any) -> None:
    assert _ids({"REACTOR_REDIS_URL": "embedded", "DEBUG": False}, settings) == {"reactor_app.E003"}
    assert _ids({"REACTOR_REDIS_URL": "embedded", "DEBUG": True}, settings) == set()
    assert _ids({"REACTOR_REDIS_URL": "redis://redis:6379/0", "DEBUG": False}, settings) == set()


def test_manage_py_check_deploy_reports_it(settings: Any) -> None:
    settings.REACTOR_REDIS_URL = "embedded"
    settings.DEBUG = False
    assert "reactor_app.E003" in {
        problem.id for problem in run_checks(include_deployment_checks=True)
    }


def test_retention_setting_is_checked(settings: Any) -> None:
    settings.REACTOR_RETENTION = -1
    errors = {e.obj for e in run_checks() if e.id == "reactor_app.E001"}
    assert errors == {"REACTOR_RETENTION"}


def test_apps_reactors_modules_are_imported_at_startup() -> None:
    """``django.setup()`` alone imports every installed app's reactors.py (demo: shop)."""
    code = (
        "import sys, django; django.setup(); "
        "print('demo_project.shop.reactors' in sys.modules); "
        "from reactor_app.dsl.registry import all_reactors; "
        "print(any(p.startswith('demo_project.shop.reactors.') for p in all_reactors()))"
    )
    env = dict(
        os.environ, DJANGO_SETTINGS_MODULE="demo_project.settings", PYTHONPATH=str(PROJECT_ROOT)
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


def test_typing_surface_is_shipped() -> None:
    assert (Path(reactor_app.__file__).parent / "py.typed").is_file()
    from reactor_app.engine.context import StepContext

    assert reactor_app.StepContext is StepContext
    assert "StepContext" in reactor_app.__all__


def test_the_admin_works_without_the_api_extra() -> None:
    """Without [api] (no DRF, no drf-spectacular) the app, its admin and its tasks still load."""
    code = textwrap.dedent(
        """
        import sys

        class NoApiExtra:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("rest_framework", "drf_spectacular"):
                    raise ImportError(f"{name} is not installed (blocked by the test)")
                return None

        sys.meta_path.insert(0, NoApiExtra())
        import django
        from django.conf import settings

        settings.configure(
            INSTALLED_APPS=[
                "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
                "django.contrib.sessions", "django.contrib.messages", "reactor_app",
            ],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            REACTOR_REDIS_URL="redis://127.0.0.1:1/0",
        )
        django.setup()
        import reactor_app.admin, reactor_app.admin.dashboard, reactor_app.tasks  # noqa: E401
        from django.contrib import admin
        from reactor_app.models import Execution

        assert admin.site.is_registered(Execution)
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok"]
