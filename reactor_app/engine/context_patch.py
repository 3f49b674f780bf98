"""The ``context`` column patched in the database: one SQL expression per write.

Split from ``engine.progress`` (which decides *what* a checkpoint writes) because this is the
other question, *how* a change of the small fixed part of the state reaches the column without
sending it whole: PostgreSQL ``jsonb_set`` / ``#-``, SQLite ``json_set`` / ``json_remove``,
nested one call per op. ``patchable`` says when a path cannot be named that way, and the
store then writes the whole skeleton instead (docs/operations.md, "Checkpoints").
"""

from __future__ import annotations

import json
from typing import Any, Literal

OpKind = Literal["set", "extend", "remove"]
#: one change of the stored state: set a path, append a list of entries to the array at a
#: path, remove a path (a progress row; the context itself only sees set and remove)
Op = tuple[OpKind, tuple[str, ...], Any]

#: the backends whose JSON functions a patch is written in; others get the whole skeleton
PATCHING_VENDORS = ("postgresql", "sqlite")
#: a context patch of more ops than this (its SQL nests one call per op; SQLite's parser
#: stack is ~100 deep) writes the whole skeleton instead
MAX_NESTING = 40


class ContextPatch:
    """The ``context`` column with ``ops`` applied, as one SQL expression (see the module
    docstring for the functions per backend). Not a Django ``Expression``: a delivery's
    statements are built without the ORM's compiler (``row_statements.conditional_update``
    calls ``sql_on``), and an expression built a ``JSONField`` per write."""

    def __init__(self, ops: list[Op]) -> None:
        self.ops = ops

    def sql_on(self, column: str, vendor: str) -> tuple[str, list[Any]]:
        """The patched value of ``column`` (its SQL) on ``vendor``, with its params: what a
        delivery's statement carries (``row_statements.conditional_update``)."""
        sql, params = column, []
        postgres = vendor == "postgresql"
        for kind, path, value in self.ops:
            # (a context patch only sets and removes top-level keys: what grows is in rows)
            if postgres:
                if kind == "set":
                    sql = f"jsonb_set({sql}, %s::text[], %s::jsonb, true)"
                    params += [list(path), json.dumps(value)]
                else:
                    sql = f"({sql} #- %s::text[])"
                    params.append(list(path))
            elif kind == "set":
                sql = f"json_set({sql}, %s, json(%s))"
                params += [sqlite_path(path), json.dumps(value)]
            else:
                sql = f"json_remove({sql}, %s)"
                params.append(sqlite_path(path))
        return sql, params


def sqlite_path(path: tuple[str, ...]) -> str:
    return "$" + "".join(f'."{part}"' for part in path)


def patchable(path: tuple[str, ...], vendor: str) -> bool:
    """Whether a patch can name ``path``. A SQLite JSON path has no escape for a double quote
    in a key, and SQLite (3.40) matches a key against its stored text, escapes and all, while
    a new key is stored as the path spells it: the stored JSON escapes non-ASCII characters
    (``json.dumps``, as Django's ``JSONField`` writes it), so a key that JSON escapes (``ü`` is
    stored ``\\u00fc``) can be neither found nor created under its own name — such a write
    sends the whole context instead (a step named with a non-ASCII character)."""
    if vendor == "sqlite":
        return all(json.dumps(part)[1:-1] == part and '"' not in part for part in path)
    return all('"' not in part and "\\" not in part for part in path)
