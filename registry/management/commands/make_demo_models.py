"""Build the demo classifiers offline and register them (idempotent)."""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import io
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management.base import BaseCommand, CommandError

from registry.actions import datasets, events, uploads
from registry.building import demo
from registry.management.commands._database import require_migrated_database
from registry.models import RegisteredModel

TEST_DATASET_NAME = "digits-test"


class Command(BaseCommand):
    help = "Train the digits demo classifiers, export them to ONNX and register them. Safe to run twice."

    def add_arguments(self, parser):
        parser.add_argument("--versions", type=int, default=None, help="register only the first N demo versions")
        parser.add_argument("--export-dir", type=_directory, default=None, help="also write every demo version's .onnx file here")

    def handle(self, *args, versions=None, export_dir=None, **options):
        if versions is not None and versions < 1:  # 0 registered none, -1 all but the last
            raise CommandError(f"--versions must be at least 1 (leave it out to register every demo version), got {versions}")
        require_migrated_database()
        self._refuse_a_case_twin()
        if export_dir is not None:
            _make_directory(export_dir)  # before the minutes of training and registering, not after
        with self._one_at_a_time():
            built = demo.build_demo_versions()
            if export_dir is not None:
                self._export(built, export_dir)
            model = self._model()
            for number, candidate in enumerate(built[:versions], start=1):
                self._register(model, number, candidate)
            self._add_test_split(model)

    @contextmanager
    def _one_at_a_time(self):
        """Two runs at once on one DATA_DIR (two shells, two stacks) each found no version
        with the demo's bytes and both registered it. The second now waits, then finds them."""
        try:
            lock = open(settings.DATA_DIR / "make_demo_models.lock", "a")
        except OSError:  # a read-only DATA_DIR (artifacts elsewhere): run as before, unguarded
            lock = None
        if lock is None:
            yield
            return
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.stdout.write("another make_demo_models is running on this DATA_DIR: waiting for it to finish")
                fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _refuse_a_case_twin(self) -> None:
        """Names are unique ignoring case: get_or_create found no "digits" beside a
        "Digits", and its create raised an IntegrityError (after the demo's training)."""
        twin = RegisteredModel.objects.filter(name__iexact=demo.demo_model_name).exclude(name=demo.demo_model_name).first()
        if twin is not None:
            raise CommandError(f"the demo model {demo.demo_model_name!r} cannot be registered: a model named {twin.name!r} exists "
                               "and model names must differ by more than case; rename that model, or start the stack with "
                               "`manage.py runstack --no-demo`")

    def _model(self) -> RegisteredModel:
        model, created = RegisteredModel.objects.get_or_create(name=demo.demo_model_name, defaults={"description": demo.demo_model_description})
        if created:
            events.model_created(model, None)
        return model

    def _register(self, model: RegisteredModel, number: int, candidate) -> None:
        sha256 = hashlib.sha256(candidate.artifact).hexdigest()
        existing = model.versions.filter(sha256=sha256).first()
        if existing is not None:
            self.stdout.write(f"{model.name} demo {number}: already registered as version {existing.number}")
            return
        version = uploads.register_stream(model, io.BytesIO(candidate.artifact), uploaded_by=None, description=candidate.description, metrics=candidate.metrics)
        self.stdout.write(f"{model.name} demo {number}: registered as version {version.number} (accuracy {candidate.metrics['accuracy']:.3f})")

    def _add_test_split(self, model: RegisteredModel) -> None:
        """The held-out split the versions' accuracy was measured on, as a data set, so
        Celery's evaluations show the same numbers (and a new version gets one too)."""
        if model.datasets.filter(name=TEST_DATASET_NAME).exists():
            self.stdout.write(f"{model.name} data set {TEST_DATASET_NAME}: already added")
            return
        pixels, labels = demo.demo_test_split()
        buffer = io.BytesIO()
        np.savez(buffer, input=pixels.astype(np.float32), labels=labels.astype(np.int64))
        upload = SimpleUploadedFile(f"{TEST_DATASET_NAME}.npz", buffer.getvalue(), content_type="application/zip")
        dataset = datasets.add(model, upload, name=TEST_DATASET_NAME, task="classification", created_by=None,
                               description=f"The held-out test split of {demo.DATASET_NAME} ({len(labels)} digits, raw pixels 0..16).")
        self.stdout.write(f"{model.name} data set {dataset.name}: added ({dataset.rows} rows)")

    def _export(self, built, export_dir: Path) -> None:
        for number, candidate in enumerate(built, start=1):
            path = export_dir / f"{demo.demo_model_name}-demo-{number}.onnx"
            try:
                path.write_bytes(candidate.artifact)
            except OSError as error:
                raise CommandError(f"--export-dir {export_dir}: cannot write {path.name} ({error.strerror}); "
                                   "nothing was registered") from None
            self.stdout.write(f"wrote {path}")


def _directory(text: str) -> Path:
    if not text.strip():  # an unset shell variable: the files went into the working directory
        raise argparse.ArgumentTypeError("expected a directory, got an empty path")
    return Path(text)


def _make_directory(export_dir: Path) -> None:
    if export_dir.exists() and not export_dir.is_dir():
        raise CommandError(f"--export-dir {export_dir} is not a directory")
    try:
        export_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CommandError(f"--export-dir {export_dir}: cannot create it ({error.strerror})") from None
