"""``fenced_update`` refuses writes from a holder older than the last writer."""

from __future__ import annotations

import pytest

from demo_project.shop.models import Account
from reactor_app.exceptions import LeaseLost
from reactor_app.fencing import fenced_update

pytestmark = pytest.mark.django_db


def test_newer_or_equal_token_writes_and_stale_token_is_refused() -> None:
    Account.objects.create(number=1, balance=0)
    accounts = Account.objects.filter(number=1)
    assert fenced_update(accounts, 5, balance=10) == 1
    assert fenced_update(accounts, 5, balance=11) == 1  # same holder writes again
    assert fenced_update(accounts, 4, balance=99) == 0  # a stale holder is refused
    assert fenced_update(accounts, 7, balance=12) == 1
    account = Account.objects.get(number=1)
    assert (account.balance, account.fencing_token) == (12, 7)


def test_no_token_is_refused() -> None:
    Account.objects.create(number=2)
    with pytest.raises(LeaseLost):
        fenced_update(Account.objects.filter(number=2), None, balance=1)
