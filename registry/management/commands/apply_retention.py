from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from registry.actions.retention import apply_retention
from registry.management.commands._database import require_migrated_database

MAX_KEEP = 1_000_000  # far past any model's versions; a larger number overflowed the database's LIMIT


class Command(BaseCommand):
    help = "Delete old artifacts (never a routed version or a rollback target); their versions become archived."

    def add_arguments(self, parser):
        parser.add_argument("--keep", type=int, default=None, help="newest versions to keep per model (default RETENTION_KEEP_VERSIONS)")

    def handle(self, *args, keep, **options):
        source = "--keep" if keep is not None else "RETENTION_KEEP_VERSIONS"
        keep = settings.RETENTION_KEEP_VERSIONS if keep is None else keep
        if not 1 <= keep <= MAX_KEEP:
            raise CommandError(f"{source} must be from 1 to {MAX_KEEP} (newest versions kept per model), got {keep}", returncode=2)
        require_migrated_database()
        archived = apply_retention(keep)
        for version in archived:
            self.stdout.write(f"archived {version}")
        self.stdout.write(f"{len(archived)} version(s) archived")
