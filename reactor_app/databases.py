"""Which database the app's rows live on: where they are written, for reads too.

A project's ``DATABASE_ROUTERS`` route every model, this app's included. The common one — the
primary/replica router of Django's documentation — sends reads to a replica. This app reads
its rows to decide what to do next, right after writing them: a delivery claims the row it
was just sent for, a waiter polls the status a worker has just written, a retry reads the run
that has just failed — and ``ExecutionManager.claim`` runs its statement on the manager's
database. Sent to a replica that had not caught up, a delivery found no row and reported an
execution enqueued a moment ago as "missing", dropping it, and so did every delivery the
sweeper sent after it (a read-only standby refused the claim instead). So every manager of the app
(``RowManager``) reads where the router writes the model (``router.db_for_write``), as a
queryset pinned with ``using()`` would.

Writes must go to the ``default`` database: a run's rows are written in ``transaction.atomic``
blocks and ``on_commit`` hooks of that connection (the outbox of ``run_async``: the message is
sent once the row is committed), and the tracking writer's statements use it. A router that
sends them elsewhere is refused by ``manage.py check`` (``reactor_app.E050``,
``write_database_errors``) instead of losing messages at run time. docs/operations.md,
"Database routers", says the same for users.
"""

from __future__ import annotations

from typing import Any, cast

from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, models, router


class RowManager(models.Manager):
    """A manager whose reads go to the database its model is written to."""

    # (Django's own ``Manager.db`` and ``get_queryset``, with ``db_for_write`` for reads; the
    # attributes they read have no public name)

    @property
    def db(self) -> str:
        manager = cast(Any, self)
        return manager._db or router.db_for_write(self.model, **manager._hints)

    def get_queryset(self) -> models.QuerySet:
        manager = cast(Any, self)
        return manager._queryset_class(model=self.model, using=self.db, hints=manager._hints)


def write_database_errors() -> list[tuple[str, str]]:
    """``(model label, alias)`` for each model of the app that the routers write elsewhere
    than ``default``."""
    wrong = []
    for model in apps.get_app_config("reactor_app").get_models():
        alias = router.db_for_write(model)
        if alias != DEFAULT_DB_ALIAS:
            wrong.append((model._meta.label, str(alias)))
    return wrong


def describe(wrong: list[tuple[str, str]]) -> str:
    """One line naming the models routed elsewhere."""
    return ", ".join(f"{label} -> {alias!r}" for label, alias in wrong)
