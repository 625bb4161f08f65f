"""Create the first admin login, printing its password once."""

from __future__ import annotations

import secrets
import sys

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError, transaction

from registry.management.commands._database import require_migrated_database


class Command(BaseCommand):
    help = "Create user 'admin' with a random password (printed once) unless it exists."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    def handle(self, *args, username, **options):
        require_migrated_database()
        try:  # what the console's own forms would refuse: blank, too long, characters outside @/./+/-/_
            User._meta.get_field(User.USERNAME_FIELD).clean(username, None)
        except ValidationError as error:
            raise CommandError(f"--username {username[:60]!r}: {' '.join(error.messages)}") from None
        if User.objects.filter(username=username).exists():
            self._exists(username)
            return
        password = secrets.token_urlsafe(12)
        try:
            with transaction.atomic():
                User.objects.create_superuser(username, "", password)
        except IntegrityError:  # another ensure_login created it between our check and our insert
            self._exists(username)
            return
        self.stdout.write(self.style.SUCCESS(f"Created login  user: {username}  password: {password}  (shown once)"))

    def _exists(self, username: str) -> None:
        # sys.executable: the image's /opt/venv as well as a checkout's .venv.
        self.stdout.write(f"Sign in as '{username}' (its password was printed when it was created; reset it with: "
                          f"DATA_DIR={settings.DATA_DIR} {sys.executable} manage.py changepassword {username}).")
