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


class Activity(models.Model):
    """One run of a shop step body: which execution, which step, in which process, and when.

    The bodies of the demo reactors write one row each as they finish, so overlaps can be read
    from the database afterwards: ``demo_step_lock`` proves "charge bodies never overlap" from
    these intervals, not from timing assumptions.
    """

    class Kind(models.TextChoices):
        RUN = "run", "run"
        UNDO = "undo", "undo"

    execution_id = models.UUIDField(null=True, blank=True, help_text="None for Step.call")
    step = models.CharField(max_length=64)
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.RUN)
    account_number = models.PositiveIntegerField()
    amount = models.IntegerField(null=True, blank=True)
    fencing_token = models.BigIntegerField(null=True, blank=True)
    pid = models.PositiveIntegerField(help_text="the process that ran the body")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ("started_at", "id")
        verbose_name_plural = "activities"
        indexes = [
            models.Index(fields=["account_number", "step"], name="shop_activity_account_idx"),
            models.Index(fields=["execution_id"], name="shop_activity_exec_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.step} {self.kind} of account {self.account_number}"
