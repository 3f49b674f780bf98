"""Fixtures of the API tests (the user fixtures live in ``users`` to be shared)."""

from __future__ import annotations

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
