"""Django settings of Celery workers started by the pytest plugin (``celery_worker_process``).

A worker started for a test must use what the test uses: the test database (pytest-django's
``test_<name>``, or the SQLite test file), the test's key prefix and queue, and any settings
the test module asked for. Project settings modules do not read those from the environment,
so the plugin points the worker's ``DJANGO_SETTINGS_MODULE`` here, and this module

1. imports every upper-case name of ``REACTOR_TEST_BASE_SETTINGS`` (the project's settings
   module, read in the worker's environment exactly as in the test process),
2. applies ``REACTOR_TEST_SETTINGS`` — a JSON object of setting name → value,
3. points each database alias of ``REACTOR_TEST_DATABASES`` (JSON alias → name) at that name.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

_base = importlib.import_module(os.environ["REACTOR_TEST_BASE_SETTINGS"])
globals().update({name: value for name, value in vars(_base).items() if name.isupper()})
globals().update(json.loads(os.environ.get("REACTOR_TEST_SETTINGS") or "{}"))

_databases: dict[str, Any] = {
    alias: dict(config) for alias, config in globals().get("DATABASES", {}).items()
}
for _alias, _name in json.loads(os.environ.get("REACTOR_TEST_DATABASES") or "{}").items():
    _databases.setdefault(_alias, {})["NAME"] = _name
DATABASES = _databases
