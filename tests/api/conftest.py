"""Fixtures of the API tests (the user fixtures live in ``users`` to be shared)."""

from __future__ import annotations

import threading

import pytest

from tests.api.users import (  # noqa: F401 - pytest fixtures
    anonymous_client,
    operator_client,
    operator_user,
    plain_client,
    plain_user,
    staff_client,
    staff_user,
    superuser,
    superuser_client,
)


@pytest.fixture
def connection_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The threads that check the tracking writer's database connection from now on, one entry
    per check (``write_behind._check_connections``: the writer thread, before each flush)."""
    from reactor_app import write_behind

    checked: list[str] = []
    check = write_behind._check_connections

    def counted() -> None:
        checked.append(threading.current_thread().name)
        check()

    monkeypatch.setattr(write_behind, "_check_connections", counted)
    return checked
