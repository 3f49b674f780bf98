"""Hypothesis profiles of the saga model (tests/sagas), chosen by ``REACTOR_SAGA_PROFILE``.

* ``ci`` (the default, what ``make test`` runs): 60 generated workflows in this process, 10 on
  a real Celery worker and 2 with a worker child SIGKILLed mid-body (about 3 minutes with the
  regression tests), not shrunk;
* ``soak`` (``make soak``): the same tests in batches (``saga-soak`` examples each) until
  ``REACTOR_SAGA_SOAK_SECONDS`` (default 1800), split between them, is spent.

``ci`` generates the same workflows on every run (derandomized, as every Hypothesis test of
``make test``); ``soak`` draws new ones and Hypothesis keeps what it found under .hypothesis/,
so a failure found once is replayed first next time. The case is printed with its ledger
(minimal after the soak's shrinking), to be kept as a named regression test in
test_regressions*.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings

PROFILE = os.environ.get("REACTOR_SAGA_PROFILE", "ci")
if PROFILE not in ("ci", "soak"):
    raise ValueError(f"REACTOR_SAGA_PROFILE must be 'ci' or 'soak', not {PROFILE!r}")

_common = {
    "deadline": None,
    "suppress_health_check": [
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
    "print_blob": True,
}
# max_examples is per batch: ci runs one batch per test; soak runs batches until its time is up.
# ci does not shrink (a worker example costs seconds, shrinking one takes minutes): it reports
# the failing case as generated; the soak shrinks it to the minimal case worth keeping.
settings.register_profile(
    "saga-ci",
    max_examples=60,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    derandomize=True,  # the same workflows every run (tests/conftest.py)
    **_common,
)
settings.register_profile("saga-soak", max_examples=50, derandomize=False, **_common)


@pytest.fixture(scope="module")
def celery_worker_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The module's ``WORKER_SETTINGS``, shared by its real worker and its tests."""
    return dict(getattr(request.module, "WORKER_SETTINGS", {}))


@pytest.fixture
def worker(celery_worker_process: Any) -> Iterator[Any]:
    """The module's real Celery worker, checked alive before and after each test."""
    assert celery_worker_process.alive(), f"the worker died:\n{celery_worker_process.log()}"
    yield celery_worker_process
    assert celery_worker_process.alive(), f"the worker died:\n{celery_worker_process.log()}"
