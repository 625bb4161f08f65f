"""`manage.py serve`: run a serving worker. Thin on purpose: no ORM, no Django views;
everything it serves lives in serving.worker, which never imports Django."""

from django.core.management.base import BaseCommand

from serving.config import ServingConfig
from serving.worker import run


class Command(BaseCommand):
    help = "Run a model serving worker (KServe V2 + /predict) with dynamic batching on ONNX Runtime."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8001)
        parser.add_argument("--state-file", help="serve this desired-state JSON instead of asking the console")

    def handle(self, *args, host, port, state_file, **options):
        run(ServingConfig.from_env(), host, port, state_file)
