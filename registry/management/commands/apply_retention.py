from django.conf import settings
from django.core.management.base import BaseCommand

from registry.actions.retention import apply_retention


class Command(BaseCommand):
    help = "Delete old artifacts (never a routed version or a rollback target); their versions become archived."

    def add_arguments(self, parser):
        parser.add_argument("--keep", type=int, default=settings.RETENTION_KEEP_VERSIONS, help="newest versions to keep per model")

    def handle(self, *args, keep, **options):
        if keep < 1:
            self.stderr.write("--keep must be at least 1")
            raise SystemExit(2)
        archived = apply_retention(keep)
        for version in archived:
            self.stdout.write(f"archived {version}")
        self.stdout.write(f"{len(archived)} version(s) archived")
