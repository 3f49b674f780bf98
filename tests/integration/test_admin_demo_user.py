"""``manage.py reactor_demo_user``: the demo's superuser, created idempotently."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import authenticate
from django.core.management import call_command


@pytest.mark.django_db
def test_demo_user_is_created_then_updated(django_user_model: Any) -> None:
    out = StringIO()
    call_command("reactor_demo_user", "--username", "admin", "--password", "admin", stdout=out)
    assert "created" in out.getvalue()
    user = django_user_model.objects.get(username="admin")
    assert user.is_staff and user.is_superuser and user.has_perm("reactor_app.force_release")

    user.is_staff = False
    user.save()
    call_command("reactor_demo_user", "--username", "admin", "--password", "other", stdout=out)
    assert "updated" in out.getvalue()
    assert django_user_model.objects.filter(username="admin").count() == 1
    assert authenticate(username="admin", password="other").is_staff
