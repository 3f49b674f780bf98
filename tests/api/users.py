"""User fixtures shared by the API, admin and browser tests: anonymous, plain, staff, operator,
superuser. Import the fixtures you need into a test module (or a conftest) by name."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db.models import Q
from django.test import Client


@pytest.fixture
def plain_user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("plain", password="pw")


def _staff(django_user_model: Any, username: str, *codenames: str) -> Any:
    user = django_user_model.objects.create_user(username, password="pw", is_staff=True)
    # what an operator role would grant: read the admin pages of the app (+ codenames)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="reactor_app").filter(
            Q(codename__startswith="view_") | Q(codename__in=codenames)
        )
    )
    return user


@pytest.fixture
def staff_user(django_user_model: Any) -> Any:
    """Staff who may read the app's admin pages, but not change live coordination state."""
    return _staff(django_user_model, "staff")


@pytest.fixture
def operator_user(django_user_model: Any) -> Any:
    """Staff with the operator permission (force release, ordered-lock skip/reset)."""
    return _staff(django_user_model, "operator", "force_release")


@pytest.fixture
def superuser(django_user_model: Any) -> Any:
    return django_user_model.objects.create_superuser("root", "root@example.com", "pw")


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def anonymous_client() -> Client:
    return Client()


@pytest.fixture
def plain_client(plain_user: Any) -> Client:
    return logged_in(plain_user)


@pytest.fixture
def staff_client(staff_user: Any) -> Client:
    return logged_in(staff_user)


@pytest.fixture
def operator_client(operator_user: Any) -> Client:
    return logged_in(operator_user)


@pytest.fixture
def superuser_client(superuser: Any) -> Client:
    return logged_in(superuser)
