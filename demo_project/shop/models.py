"""Models of the demo shop: accounts written only under a fencing token."""

from __future__ import annotations

from django.db import models


class Account(models.Model):
    """A ledger account; ``fencing_token`` is the token of the last holder that wrote it."""

    number = models.PositiveIntegerField(unique=True)
    balance = models.IntegerField(default=0)
    fencing_token = models.BigIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return f"account {self.number} ({self.balance})"
