"""``manage.py reactor_demo_user``: create (or update) the demo's superuser, idempotently.

For the demo and local development only: the password is given on the command line. Running it
again sets the password and the staff/superuser flags again, so the documented credentials
always work.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Create or update a superuser for the demo (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password", default="admin")
        parser.add_argument("--email", default="admin@example.com")

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        username_field = user_model.USERNAME_FIELD
        user, created = user_model._default_manager.get_or_create(
            **{username_field: options["username"]},
            defaults={"email": options["email"]},
        )
        user.is_staff = True
        user.is_superuser = True
        user.is_active = True
        user.set_password(options["password"])
        user.save()
        verb = "created" if created else "updated"
        self.stdout.write(f"superuser {options['username']!r} {verb}")
