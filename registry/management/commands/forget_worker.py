from django.core.management.base import BaseCommand, CommandError

from registry.actions.retention import forget_worker
from registry.management.commands._database import require_migrated_database


class Command(BaseCommand):
    help = ("Forget a worker and its acks now, so its id is free for the next worker that reports under it "
            "(a worker with a fixed SERVING_WORKER_ID whose key was lost with its cache directory).")

    def add_arguments(self, parser):
        parser.add_argument("worker_id")

    def handle(self, *args, worker_id, **options):
        require_migrated_database()
        if not forget_worker(worker_id):
            raise CommandError(f"no worker {worker_id!r}: nothing to forget (the Workers page lists their ids)")
        self.stdout.write(f"forgot worker {worker_id!r}: the next worker to report under this id claims it")
