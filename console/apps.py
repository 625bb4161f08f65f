from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Console"

    def ready(self):
        from console import password_change, signals  # noqa: F401  (connect the role upkeep and the one-time password check)
