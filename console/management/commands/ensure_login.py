"""Create the first admin login, printing its password once."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create user 'admin' with a random password (printed once) unless it exists."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    def handle(self, *args, username, **options):
        if User.objects.filter(username=username).exists():
            self.stdout.write(f"Sign in as '{username}' (its password was printed when it was created; reset it with: "
                              f"DATA_DIR={settings.DATA_DIR} .venv/bin/python manage.py changepassword {username}).")
            return
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser(username, "", password)
        self.stdout.write(self.style.SUCCESS(f"Created login  user: {username}  password: {password}  (shown once)"))
