"""Every foreign key of the app's tables is the leading column of exactly one index.

At least one: deleting an execution cascades to (or nulls) the rows that name it, and every
admin and API view looks rows up by their execution — without an index each of those is a
scan. At most one: a second index leading with the same column serves no look-up the first
does not, and costs every insert (and every write that changes the column) one more index
entry (migration ``0011``). Read from the migrated database itself, on every backend.
"""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import connection

pytestmark = pytest.mark.django_db


def leading_columns(table: str) -> list[str]:
    """The first column of each index and unique constraint of ``table`` (its primary key
    aside: no foreign key leads it)."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    return [
        c["columns"][0]
        for c in constraints.values()
        if (c["index"] or c["unique"]) and not c["primary_key"] and c["columns"]
    ]


@pytest.mark.parametrize(
    "model",
    [m for m in apps.get_app_config("reactor_app").get_models()],
    ids=lambda m: m.__name__,
)
def test_each_foreign_key_leads_exactly_one_index(model: type) -> None:
    meta = model._meta  # type: ignore[attr-defined]
    leading = leading_columns(meta.db_table)
    for field in meta.concrete_fields:
        if field.is_relation:
            count = leading.count(field.column)
            assert count == 1, f"{meta.db_table}.{field.column} leads {count} indexes: {leading}"
