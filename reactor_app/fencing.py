"""Fencing tokens for downstream writes (Kleppmann's fencing, docs/design.md §2.7).

Every fresh lock acquisition gets a per-key, strictly increasing token
(``context.fencing_token()``) — never below the Redis clock in microseconds, so tokens keep
increasing across a Redis restart that lost every key (docs/coordination.md, "Guarantees"). A
token is a large integer (about 1.8e15 today): store it in a ``BigIntegerField``. A model
that stores the token of its last writer can refuse a write from a holder whose lease lapsed
and whose key was taken by someone newer::

    updated = fenced_update(Account.objects.filter(pk=1), context.fencing_token(), balance=10)
    if not updated:
        ...  # a newer holder already wrote: this holder is stale

The check and the write are one ``UPDATE ... WHERE token IS NULL OR token <= %s``, so there is no
window between them.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from reactor_app.exceptions import LeaseLost


def fenced_update(
    queryset: models.QuerySet[Any],
    token: int | None,
    *,
    token_field: str = "fencing_token",
    **values: Any,
) -> int:
    """Update the rows of ``queryset`` whose stored token is not newer than ``token``.

    The stored token is set to ``token`` with the other ``values``. Returns the number of rows
    updated (0 means every matching row was written by a newer holder). ``token`` must come
    from ``context.fencing_token()``; ``None`` means the work holds no lock, which is refused.
    """
    if token is None:
        raise LeaseLost(
            "fenced_update needs a fencing token: the work holds no lock (declare with_lock)",
            token=None,
        )
    newer_or_equal = models.Q(**{f"{token_field}__isnull": True}) | models.Q(
        **{f"{token_field}__lte": token}
    )
    return queryset.filter(newer_or_equal).update(**{token_field: token}, **values)
