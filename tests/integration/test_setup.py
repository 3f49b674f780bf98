"""The setup a fresh machine relies on: the embedded Redis server, migrations, package data.

Embedded-server tests use a temporary state folder each, never the suite's own server, and stop
what they start. Servers are observed from separate processes where reuse across processes is
the claim.
"""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import tomllib
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from reactor_app.coordination import embedded

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """A private state folder for an embedded server; the server is stopped afterwards."""
    folder = tmp_path / "state"
    yield folder
    embedded.stop_server(folder)


def _ensure_in_child(folder: Path, env: dict[str, str] | None = None) -> tuple[str, int]:
    """Run ``ensure_server`` in a fresh interpreter; its socket path and the server's pid."""
    code = textwrap.dedent(
        f"""
        from reactor_app.coordination import embedded
        print(embedded.ensure_server({str(folder)!r}))
        print(embedded.server_pid({str(folder)!r}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=PROJECT_ROOT,
        env=env,
        check=True,
    )
    path, pid = done.stdout.split()
    return path, int(pid)


def _wait_until_dead(pid: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while embedded._alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} did not exit"
        time.sleep(0.02)


# --------------------------------------------------------------------------------------------
# Embedded Redis server
# --------------------------------------------------------------------------------------------


def test_embedded_server_starts_on_demand_and_is_reused_by_another_process(
    state_dir: Path,
) -> None:
    assert not embedded.answers(state_dir)

    path, first_pid = _ensure_in_child(state_dir)
    again_path, second_pid = _ensure_in_child(state_dir)

    assert path == again_path == str(embedded.socket_path(state_dir))
    assert second_pid == first_pid
    assert embedded.answers(state_dir)
    assert embedded.server_pid(state_dir) == first_pid


def test_concurrent_starts_share_one_server(state_dir: Path) -> None:
    code = (
        "from reactor_app.coordination import embedded; "
        f"embedded.ensure_server({str(state_dir)!r}); "
        f"print(embedded.server_pid({str(state_dir)!r}))"
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=PROJECT_ROOT
        )
        for _ in range(4)
    ]
    pids = {int(child.communicate(timeout=60)[0]) for child in children}
    assert all(child.returncode == 0 for child in children)
    assert len(pids) == 1


def test_stale_socket_file_is_replaced_and_a_recycled_pid_is_left_alone(state_dir: Path) -> None:
    state_dir.mkdir(parents=True)
    # A socket file nobody listens on (a server that vanished without cleaning up) ...
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(embedded.socket_path(state_dir)))
    stale.close()
    # ... and a pidfile naming a live process that is not a redis-server (a recycled pid).
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (state_dir / embedded.PIDFILE_NAME).write_text(f"{bystander.pid}\n")
        assert not embedded.answers(state_dir)

        embedded.ensure_server(state_dir)

        assert embedded.answers(state_dir)
        assert embedded.server_pid(state_dir) not in (None, bystander.pid)
        assert bystander.poll() is None, "ensure_server signalled a process that is not ours"
    finally:
        bystander.kill()
        bystander.wait()


def test_killed_server_is_detected_and_replaced(state_dir: Path) -> None:
    embedded.ensure_server(state_dir)
    dead_pid = embedded.server_pid(state_dir)
    assert dead_pid is not None
    os.kill(dead_pid, signal.SIGKILL)  # no chance to remove its socket or pidfile
    _wait_until_dead(dead_pid)
    assert embedded.socket_path(state_dir).exists()
    assert not embedded.answers(state_dir)

    _, new_pid = _ensure_in_child(state_dir)

    assert new_pid != dead_pid
    assert embedded.answers(state_dir)


def test_stop_server_stops_only_a_running_server(state_dir: Path) -> None:
    assert embedded.stop_server(state_dir) is False
    embedded.ensure_server(state_dir)
    pid = embedded.server_pid(state_dir)
    assert pid is not None

    assert embedded.stop_server(state_dir) is True

    _wait_until_dead(pid)
    assert not embedded.answers(state_dir)
    assert not embedded.socket_path(state_dir).exists()
    assert embedded.stop_server(state_dir) is False


def test_long_state_folder_gets_a_short_socket_path(tmp_path: Path) -> None:
    folder = tmp_path / ("x" * 60) / ("y" * 60)
    assert len(str(folder / embedded.SOCKET_NAME)) > embedded.MAX_SOCKET_PATH_BYTES
    try:
        path = embedded.ensure_server(folder)

        assert path == embedded.socket_path(folder)
        assert len(os.fsencode(str(path))) <= embedded.MAX_SOCKET_PATH_BYTES
        assert path.parent.name.startswith("reactor-")
        assert (path.parent.stat().st_mode & 0o777) == 0o700
        assert embedded.url(folder) == f"unix://{path}?db=0"
        assert str(path) in embedded.broker_url(folder)
        assert (folder / embedded.PIDFILE_NAME).exists()  # state stays in the state folder
        assert embedded.answers(folder)
    finally:
        embedded.stop_server(folder)
        path = embedded.socket_path(folder)
        if path.parent != folder:
            path.parent.rmdir()


def test_celery_app_starts_the_embedded_server_before_connecting(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env["REACTOR_STATE_DIR"] = str(tmp_path / "state")
    code = textwrap.dedent(
        """
        from demo_project.celery import app
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1)
            print(connection.as_uri())
        """
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=PROJECT_ROOT,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().startswith("redis+socket://")
        assert embedded.answers(tmp_path / "state")
    finally:
        embedded.stop_server(tmp_path / "state")


def test_reactor_redis_command_starts_reports_and_stops(state_dir: Path) -> None:
    def run(action: str) -> str:
        out = io.StringIO()
        call_command("reactor_redis", action, "--dir", str(state_dir), stdout=out)
        return out.getvalue()

    with pytest.raises(CommandError, match="does not answer"):
        run("status")

    started = run("start")
    assert f"socket:       {embedded.socket_path(state_dir)}" in started
    assert "answers:      yes" in started
    pid = embedded.server_pid(state_dir)
    assert f"pid:          {pid}" in run("status")

    stopped = run("stop")
    assert f"stopped the embedded Redis server (pid {pid})" in stopped
    assert "answers:      no" in stopped


# --------------------------------------------------------------------------------------------
# Database and packaging
# --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_models_and_migrations_do_not_drift() -> None:
    out = io.StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exc:  # --check exits 1 when a migration would be written
        pytest.fail(f"models and migrations drift (exit {exc.code}):\n{out.getvalue()}")


def test_lua_scripts_ship_as_package_data() -> None:
    folder = resources.files("reactor_app.coordination") / "lua"
    scripts = sorted(entry.name for entry in folder.iterdir() if entry.name.endswith(".lua"))
    assert scripts, "no .lua files in reactor_app/coordination/lua"
    # each primitive's part of the general scripts, in a folder of its own
    primitives = folder / "primitives"
    scripts += sorted(
        f"primitives/{entry.name}" for entry in primitives.iterdir() if entry.name.endswith(".lua")
    )
    assert "primitives/lock.lua" in scripts

    # Every script is covered by the package-data patterns, so it is in a wheel too.
    pyproject = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["reactor_app"]

    def covered(path: str, pattern: str) -> bool:
        # as setuptools globs: a "*" never crosses a "/"
        return re.fullmatch(re.escape(pattern).replace(r"\*", "[^/]*"), path) is not None

    uncovered = [
        name
        for name in scripts
        if not any(covered(f"coordination/lua/{name}", pattern) for pattern in patterns)
    ]
    assert not uncovered, f"not in [tool.setuptools.package-data]: {uncovered}"


# --------------------------------------------------------------------------------------------
# The test harness itself (tests/conftest.py)
# --------------------------------------------------------------------------------------------


def test_each_test_gets_its_own_key_prefix(redis_prefix: str) -> None:
    from django.conf import settings

    from reactor_app.conf import reactor_settings

    assert redis_prefix.startswith(f"rt-{os.getpid()}-")
    assert settings.REACTOR_KEY_PREFIX == reactor_settings.KEY_PREFIX == redis_prefix


def test_prefixed_keys_are_deleted_and_others_kept(
    redis_prefix: str, request: pytest.FixtureRequest
) -> None:
    from reactor_app.coordination.redis import get_client

    conftest_file = str(PROJECT_ROOT / "tests" / "conftest.py")
    conftest = next(
        plugin
        for plugin in request.config.pluginmanager.get_plugins()
        if getattr(plugin, "__file__", None) == conftest_file
    )
    delete_prefixed_keys = conftest.delete_prefixed_keys

    client = get_client()
    neighbour = f"{redis_prefix}x"  # shares the prefix's text but is another key space
    client.set(f"{redis_prefix}:lock:{{a}}", "1")
    client.set(f"{redis_prefix}:sem:{{b}}:holders", "1")
    client.set(f"{neighbour}:lock:{{a}}", "1")
    try:
        assert delete_prefixed_keys(client, redis_prefix) == 2
        assert client.exists(f"{neighbour}:lock:{{a}}") == 1
    finally:
        client.unlink(f"{neighbour}:lock:{{a}}")


@pytest.mark.django_db(transaction=True)
def test_child_process_sees_the_test_database_redis_and_prefix(
    subprocess_env: Callable[..., dict[str, str]], redis_prefix: str
) -> None:
    from django.contrib.auth.models import Group

    from reactor_app.coordination.redis import get_client

    code = textwrap.dedent(
        """
        import django
        django.setup()
        from django.conf import settings
        from django.contrib.auth.models import Group
        from reactor_app.coordination.redis import get_client
        Group.objects.create(name="made-by-child")
        get_client().set(f"{settings.REACTOR_KEY_PREFIX}:probe", "child")
        print(settings.REACTOR_KEY_PREFIX)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PROJECT_ROOT,
        env=subprocess_env(),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == redis_prefix
    assert Group.objects.filter(name="made-by-child").exists()
    assert get_client().get(f"{redis_prefix}:probe") == "child"


def test_ci_run_stops_when_a_configured_service_does_not_answer(tmp_path: Path) -> None:
    env = dict(os.environ, CI="true", REDIS_URL="redis://127.0.0.1:1/0")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--no-header",
            f"{Path(__file__)}::test_lua_scripts_ship_as_package_data",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PROJECT_ROOT,
        env=env,
    )
    assert done.returncode != 0
    assert "REDIS_URL=redis://127.0.0.1:1/0 does not answer" in done.stdout + done.stderr
