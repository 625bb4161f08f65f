#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    from django.core.management import execute_from_command_line

    from serving.env import SettingError

    try:
        execute_from_command_line(sys.argv)
    except SettingError as error:  # a bad value in the environment: the sentence names it, a traceback would bury it
        sys.exit(f"manage.py: {error}")


if __name__ == "__main__":
    main()
