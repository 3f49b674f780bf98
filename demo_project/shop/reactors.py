"""The shop's reactors: the step-lock showcase (``manage.py demo_step_lock``) runs these.

* ``PaymentReactor`` — audit → **charge** → notify. Only ``charge`` is locked, on the account
  (``acct:<number>``), so two payments of one account never charge at once while their audits
  and receipts run side by side. ``charge`` writes the balance with ``fenced_update``: a
  holder whose lease lapsed cannot overwrite a newer holder's write.
* ``FaxedPaymentReactor`` — the same payment with a receipt by fax, which this shop cannot send:
  ``notify`` fails, and the rollback undoes ``charge`` (a refund) **while holding the account
  key again**, so a concurrent payment of the account waits for the refund.
* ``StatementReactor`` — a statement with this month's offer; ``offer`` runs at most once a day
  per account (a step-level period): a second statement the same day skips the offer and is
  still sent.
* ``LowBalanceAlertReactor`` — a text message, rate-limited to ``SMS_LIMIT`` per
  ``SMS_WINDOW`` seconds per account: on a worker, an alert over the limit parks until the
  window frees instead of failing.

Step bodies sleep for the ``*_SECONDS`` below so that overlaps (and their absence) are
visible, and write an ``Activity`` row with their interval: the evidence the showcase and the
shop's tests read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from demo_project.shop.models import Account, Activity
from reactor_app import (
    Reactor,
    Step,
    Success,
    from_input,
    from_result,
    step,
    value,
    with_lock,
    with_period,
    with_rate_limit,
)
from reactor_app.engine.context import StepContext
from reactor_app.fencing import fenced_update

#: seconds each step body takes. ``charge`` outlasts ``audit``, so a payment that starts while
#: another charges reaches ``charge`` before the key is free; ``notify`` outlasts ``charge``,
#: so the receipts of two serialized payments still overlap.
AUDIT_SECONDS = 0.2
CHARGE_SECONDS = 1.2
NOTIFY_SECONDS = 1.6
REFUND_SECONDS = 1.5
#: texts allowed per account and window (seconds)
SMS_LIMIT = 2
SMS_WINDOW = 3
#: receipt channels this shop can send
CHANNELS = ("email", "sms")


class ReceiptUndeliverable(Exception):
    """The receipt could not be sent on the requested channel."""


class StaleWriteRefused(Exception):
    """A newer lock holder already wrote the account: this holder's lease had lapsed."""


def account_key(args: Mapping[str, Any]) -> str:
    """The coordination key of one account: what ``charge`` and its undo lock."""
    return f"acct:{args['account_id']}"


@contextmanager
def activity(
    step_name: str, args: Mapping[str, Any], context: StepContext, **fields: Any
) -> Iterator[dict[str, Any]]:
    """Record the body's interval as an ``Activity`` row when it ends (even if it raises).

    Yields a dict the body may fill with ``detail`` entries or model fields (``amount``,
    ``fencing_token``, ``kind``).
    """
    record: dict[str, Any] = {"detail": {}, **fields}
    started = timezone.now()
    try:
        yield record
    except Exception as exc:
        record["detail"]["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        Activity.objects.create(
            execution_id=context.execution_id,
            step=step_name,
            account_number=args["account_id"],
            pid=os.getpid(),
            started_at=started,
            finished_at=timezone.now(),
            **record,
        )


# --------------------------------------------------------------------------------------------
# a payment: audit → charge (step lock on the account) → notify


class AuditStep(Step):
    """Write the audit trail of a payment request (not locked: audits run side by side)."""

    inputs = ("account_id",)

    def run(self, args: dict[str, Any], context: StepContext) -> Success:
        with activity("audit", args, context):
            time.sleep(AUDIT_SECONDS)
        return Success({"audited": True})


@with_lock(account_key, ttl=30, wait=60)
class ChargeStep(Step):
    """Take the amount from the account while holding ``acct:<number>`` — this step only.

    ``wait=60``: an in-process run waits (woken by the release) for the other payments of the
    account; on a worker the execution parks instead and is woken when the key frees.
    """

    inputs = ("account_id", "amount")

    def run(self, args: dict[str, Any], context: StepContext) -> Success:
        token = context.fencing_token()
        with activity("charge", args, context, amount=args["amount"], fencing_token=token):
            time.sleep(CHARGE_SECONDS)
            _move_money(args["account_id"], -args["amount"], token)
        return Success({"account_id": args["account_id"], "amount": args["amount"], "token": token})

    def undo(self, result: dict[str, Any], args: dict[str, Any], context: StepContext) -> None:
        """A later step failed: refund. The engine re-took the account lock for this (a fresh
        acquisition, so a newer fencing token than the charge's)."""
        token = context.fencing_token()
        with activity(
            "charge",
            args,
            context,
            kind=Activity.Kind.UNDO,
            amount=result["amount"],
            fencing_token=token,
        ):
            time.sleep(REFUND_SECONDS)
            _move_money(args["account_id"], result["amount"], token)


def _move_money(account_number: int, delta: int, token: int | None) -> None:
    with transaction.atomic():
        updated = fenced_update(
            Account.objects.filter(number=account_number), token, balance=F("balance") + delta
        )
    if not updated:
        raise StaleWriteRefused(
            f"account {account_number} was written by a holder newer than token {token}"
        )


class NotifyStep(Step):
    """Send the receipt (not locked). Fails for a channel the shop cannot send on."""

    inputs = ("charge", "channel")

    def run(self, args: dict[str, Any], context: StepContext) -> Success:
        charge = args["charge"]
        with activity("notify", charge, context) as record:
            record["detail"]["channel"] = args["channel"]
            time.sleep(NOTIFY_SECONDS)
            if args["channel"] not in CHANNELS:
                raise ReceiptUndeliverable(f"no {args['channel']} gateway is configured")
        return Success({"sent": True, "via": args["channel"]})


class PaymentReactor(Reactor):
    """Audit, charge (locked on the account), send a receipt; refund if the receipt fails."""

    inputs = ("account_id", "amount")

    audit = step(AuditStep, account_id=from_input("account_id"))
    charge = step(ChargeStep, account_id=from_input("account_id"), amount=from_input("amount"))
    notify = step(NotifyStep, charge=from_result("charge"), channel=value("email"))

    returns = "notify"


class FaxedPaymentReactor(PaymentReactor):
    """A payment whose receipt goes by fax: ``notify`` fails, so ``charge`` is undone."""

    notify = step(NotifyStep, charge=from_result("charge"), channel=value("fax"))


# --------------------------------------------------------------------------------------------
# a statement: the offer runs at most once a day per account (a step-level period)


@with_period(lambda args: f"offer:{args['account_id']}", every="day")
class OfferStep(Step):
    """Attach this month's offer. Once a day per account: a second statement the same day
    skips this step (``Skipped(reason="period")``) and the statement is still sent."""

    inputs = ("account_id",)

    def run(self, args: dict[str, Any], context: StepContext) -> Success:
        with activity("offer", args, context):
            time.sleep(0.05)
        return Success("10% off your next order")


class SendStatementStep(Step):
    inputs = ("account_id", "offer")

    def run(self, args: dict[str, Any], context: StepContext) -> Success:
        with activity("statement", args, context) as record:
            record["detail"]["offer"] = args["offer"]
            time.sleep(0.05)
        return Success({"sent": True, "offer": args["offer"]})


class StatementReactor(Reactor):
    inputs = ("account_id",)

    offer = step(OfferStep, account_id=from_input("account_id"))
    send = step(SendStatementStep, account_id=from_input("account_id"), offer=from_result("offer"))

    returns = "send"


# --------------------------------------------------------------------------------------------
# an alert: texts are rate-limited per account


@with_rate_limit(lambda args: f"sms:{args['account_id']}", limit=SMS_LIMIT, period=SMS_WINDOW)
class TextStep(Step):
    """Send a text: at most ``SMS_LIMIT`` per ``SMS_WINDOW`` seconds per account. Over the
    limit a worker execution parks until the window frees (the refusal's ``retry_after``)."""

    inputs = ("account_id", "message")

    def run(self, args: dict[str, Any], context: StepContext) -> Success:
        with activity("text", args, context) as record:
            record["detail"]["message"] = args["message"]
            time.sleep(0.05)
        return Success({"texted": True})


class LowBalanceAlertReactor(Reactor):
    inputs = ("account_id",)

    text = step(
        TextStep, account_id=from_input("account_id"), message=value("Your balance is low.")
    )
