"""The demo project's template overrides (``templates/``) take effect over Django's admin."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client


@pytest.mark.django_db
def test_the_demo_admin_is_branded(client: Client) -> None:
    user = get_user_model().objects.create_superuser("brand", "brand@example.com", "pw")
    client.force_login(user)
    page = client.get("/admin/").content.decode()
    assert "reactor_app demo</a>" in page
    assert "<title>Site administration | reactor_app demo</title>" in page
