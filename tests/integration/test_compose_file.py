"""``docker-compose.yml`` runs the demo project the way the README describes.

Docker is not available to the suite, so the file is checked statically: it parses, it has the
four services the README's table names, ``web`` and ``worker`` run exactly the README's
commands with its ``DATABASE_URL`` / ``REDIS_URL``, and what those commands rely on exists
(the Celery app, the queue the engine sends to, the Dockerfile's requirements block).
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import pytest
import yaml

from tests.conftest import PROJECT_ROOT

COMPOSE = PROJECT_ROOT / "docker-compose.yml"
README = PROJECT_ROOT / "README.md"
DOCKERFILE = PROJECT_ROOT / "Dockerfile"
SERVICES = {"web", "worker", "redis", "postgres"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


@pytest.fixture(scope="module")
def readme_services() -> dict[str, str]:
    """``service -> command or "image <name>"`` from the README's Docker Compose table."""
    section = README.read_text().split("### With Docker Compose", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w-]+)` \| (.+?) \|$", section, flags=re.MULTILINE)
    return {name: cell.strip() for name, cell in rows}


def _readme_env(name: str) -> str:
    found = re.search(rf"`{name}=([^`]+)`", README.read_text().split("### With Docker Compose")[1])
    assert found, f"the README's compose section does not give {name}"
    return found.group(1)


def test_the_four_services_are_the_readmes(
    compose: dict[str, Any], readme_services: dict[str, str]
) -> None:
    default = {name for name, config in compose["services"].items() if not config.get("profiles")}
    assert default == SERVICES
    assert set(readme_services) == SERVICES


@pytest.mark.parametrize("service", ["web", "worker"])
def test_app_services_run_the_readmes_commands(
    compose: dict[str, Any], readme_services: dict[str, str], service: str
) -> None:
    config = compose["services"][service]
    command = config["command"]
    assert isinstance(command, str)
    shown = readme_services[service].strip("`")
    if command.startswith("sh -c "):
        command = command[len("sh -c ") :].strip("\"'")
    assert command == shown
    assert config["build"] == "."
    environment = config["environment"]
    assert environment["DATABASE_URL"] == _readme_env("DATABASE_URL")
    assert environment["REDIS_URL"] == _readme_env("REDIS_URL")
    assert {"postgres", "redis"} <= set(config["depends_on"])
    for dependency in ("postgres", "redis"):
        assert config["depends_on"][dependency]["condition"] == "service_healthy"


def test_backing_services_use_the_readmes_images(
    compose: dict[str, Any], readme_services: dict[str, str]
) -> None:
    for service in ("redis", "postgres"):
        config = compose["services"][service]
        assert readme_services[service] == f"image `{config['image']}`"
        assert config["healthcheck"]["test"]
    postgres = compose["services"]["postgres"]["environment"]
    database_url = _readme_env("DATABASE_URL")
    user, password, database = re.fullmatch(
        r"postgres://(\w+):(\w+)@postgres:5432/(\w+)", database_url
    ).groups()  # type: ignore[union-attr]
    assert (postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"]) == (user, password)
    assert postgres["POSTGRES_DB"] == database
    assert _readme_env("REDIS_URL").startswith("redis://redis:6379/")


def test_what_the_commands_rely_on_exists(compose: dict[str, Any], settings: Any) -> None:
    worker = compose["services"]["worker"]["command"].split()
    app = worker[worker.index("-A") + 1]
    queue = worker[worker.index("-Q") + 1]
    assert importlib.import_module(app).celery_app.main == app  # celery -A demo_project
    assert queue == settings.REACTOR_CELERY_QUEUE  # the queue the engine sends to
    web = compose["services"]["web"]["command"]
    assert "manage.py migrate" in web and "0.0.0.0:8000" in web
    assert "8000:8000" in compose["services"]["web"]["ports"]

    dockerfile = DOCKERFILE.read_text()
    requirements = (PROJECT_ROOT / "requirements.txt").read_text()
    # the Dockerfile installs the runtime block of requirements.txt by its markers
    for marker in ("# --- runtime", "# --- development"):
        assert marker in dockerfile and marker in requirements
    assert dockerfile.startswith("#") and "FROM python:3.11" in dockerfile


def test_the_cluster_profile_forms_a_three_master_cluster(compose: dict[str, Any]) -> None:
    """``--profile cluster``: three cluster-enabled nodes and a one-shot init that assigns
    the slots; the app services reach them through ``REACTOR_REDIS_URL`` (docs: Scaling out)."""
    services = compose["services"]
    nodes = [f"redis-node-{n}" for n in (1, 2, 3)]
    for number, name in enumerate(nodes, start=1):
        config = services[name]
        assert config["profiles"] == ["cluster"]
        assert "--cluster-enabled yes" in config["command"]
        assert f"--port 700{number}" in config["command"]
        assert f"--cluster-announce-hostname {name}" in config["command"]
    init = services["redis-cluster-init"]
    assert init["profiles"] == ["cluster"]
    assert set(init["depends_on"]) == set(nodes)
    create = " ".join(init["command"].split())
    assert "--cluster create redis-node-1:7001 redis-node-2:7002 redis-node-3:7003" in create
    assert "--cluster-replicas 0" in create
    for app in ("web", "worker"):
        assert services[app]["environment"]["REACTOR_REDIS_URL"] == "${REACTOR_REDIS_URL:-}"
    operations = (PROJECT_ROOT / "docs" / "operations.md").read_text()
    assert "redis+cluster://redis-node-1:7001,redis-node-2:7002,redis-node-3:7003" in operations
