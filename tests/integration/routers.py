"""Database routers for ``tests/integration/test_database_routers.py`` and its worker twin.

``ReadsFromAReplica`` is the primary/replica router of Django's documentation, for this app's
models only: reads go to ``"replica"``, writes to ``default``. The test settings have no
``"replica"`` database, so a read of the app's rows sent there fails at once
(``ConnectionDoesNotExist``) instead of finding a replica's stale copy now and then.
``WritesElsewhere`` sends the writes of the models it is given to another alias.
"""

from __future__ import annotations

import sys
from typing import Any

REPLICA = "replica"


class ReadsFromAReplica:
    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        if model._meta.app_label != "reactor_app":
            return None
        # A related manager of a row (``execution.step_runs``) asks the router for a read
        # database only to look up that connection's features, then queries through the
        # model's manager (the app's: where rows are written). With a real replica alias that
        # lookup is harmless; with this missing one it would fail without any read going there.
        caller = sys._getframe(1)
        for _ in range(3):  # (through the router's dispatch)
            if caller.f_code.co_name == "_apply_rel_filters":
                return None
            caller = caller.f_back or caller
        return REPLICA

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return None

    def allow_relation(self, first: Any, second: Any, **hints: Any) -> bool | None:
        return True


class WritesElsewhere:
    def __init__(self, labels: set[str], alias: str = "elsewhere") -> None:
        self.labels, self.alias = labels, alias

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self.alias if model._meta.label in self.labels else None
