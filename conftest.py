"""Top-level pytest configuration: enables reactor_app's own pytest plugin for every test
(``tests/`` and the demo project's tests), the way a project using reactor_app would."""

from __future__ import annotations

pytest_plugins = ["reactor_app.testing.pytest_plugin"]
