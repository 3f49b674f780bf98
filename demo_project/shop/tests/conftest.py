"""The shop's tests use only what ``reactor_app`` ships for testing: the pytest plugin
(enabled in the top-level ``conftest.py``) and ``reactor_app.testing``'s state and assertions.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def key_space(reactor_key_space: str) -> str:
    """Every shop test coordinates in a key space of its own, deleted afterwards."""
    return reactor_key_space
