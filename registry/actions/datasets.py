"""Adding a labelled data set to a model, on which every ready version is evaluated.

The file (``.npz`` with the model's input arrays and ``labels``, or ``.jsonl`` with one
object per row and its ``label``) is streamed to disk, checked
(``serving.jobs.formats.check_dataset``, which counts its rows) against the inputs of
the model's stable version with the rules of the evaluation's child, and stored by content
(``files.dataset_path``: ``datasets/<sha256>.<format>``). A refused file leaves no file
and no row. Names are slugs, unique per model.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import IntegrityError, transaction

from registry.actions import events, received_files
from registry.artifacts import storage
from registry.domain.choices import DatasetTask
from registry.jobs import files, scheduling
from registry.models import EvaluationDataset, ModelVersion, RegisteredModel
from serving.jobs import formats
from serving.jobs.labels import LabelRule, regression_width

DATASET_FORMATS = ("npz", "jsonl")
NAME_MAX_CHARS = 100


class DatasetRefused(received_files.Refused):
    """A data set that is not added: 400 bad name, task or file, 409 name taken or model archived, 413 too large."""


def add(model: RegisteredModel, upload, *, name: str, task: str, description: str = "", created_by) -> EvaluationDataset:
    """Store the data set, record it, and queue its evaluations; returns it."""
    if model.is_archived:  # "no uploads", as for versions: its evaluations would run on versions nothing serves
        raise DatasetRefused(f"{model.name} is archived: restore it from the archive before adding data sets", 409)
    _check_name(model, name)
    if task not in DatasetTask.values:
        raise DatasetRefused(f"task must be one of {', '.join(DatasetTask.values)}", 400)
    file_format = received_files.extension(upload, DATASET_FORMATS, "the data set", DatasetRefused)
    staged = received_files.stage(upload, settings.DATASET_MAX_BYTES, "DATASET_MAX_BYTES", "the data set", DatasetRefused)
    try:
        rows = _rows(staged, file_format, model, task)
        dataset = EvaluationDataset(model=model, name=name, task=task, file_format=file_format, sha256=staged.sha256,
                                    size_bytes=staged.size_bytes, rows=rows, description=description,
                                    created_by=created_by if created_by is not None and created_by.is_authenticated else None)
        return _store(dataset, staged, created_by)
    finally:
        storage.discard(staged)  # moved into place by now, or refused


def _check_name(model: RegisteredModel, name) -> None:
    try:
        if not isinstance(name, str) or not name or len(name) > NAME_MAX_CHARS:
            raise ValidationError("")
        validate_slug(name)
    except ValidationError:
        raise DatasetRefused(f"name must be a slug of at most {NAME_MAX_CHARS} letters, digits, '-' or '_'", 400) from None
    if model.datasets.filter(name=name).exists():
        raise _taken(model, name)


def _taken(model: RegisteredModel, name: str) -> DatasetRefused:
    return DatasetRefused(f"model {model.name} has a data set named {name} already", 409)


def _checked_against(model: RegisteredModel) -> tuple[ModelVersion | None, str]:
    """The version a data set is checked against, and what it is: the stable version of
    the current release when it is ready, else the newest ready version; none when no
    version is ready (then only the file's format is checked).

    Every ready version is evaluated on the data set, but versions may take different
    inputs: the one serving the traffic is the one it is meant for."""
    ready = model.versions.ready()
    release = model.current_release()
    stable = ready.filter(number=release.stable_version).first() if release is not None else None
    if stable is not None:
        return stable, "the stable version"
    return ready.order_by("-number").first(), "the newest ready version"


def _rows(staged: storage.StagedArtifact, file_format: str, model: RegisteredModel, task: str) -> int:
    version, role = _checked_against(model)
    layouts = formats.signature_layouts(version.signature) if version is not None else None
    rule = LabelRule(task, regression_width(version.signature) if version is not None and task == DatasetTask.REGRESSION else None)
    try:
        return formats.check_dataset(staged.path, file_format, layouts, rule)
    except formats.InputMismatch as error:
        labels = formats.LABELS_MEMBER if file_format == "npz" else formats.LABEL_KEY
        raise DatasetRefused(f"the data set does not fit version {version.number} ({role}, which it was checked against): "
                             f"{error.reason} (version {version.number} takes {formats.describe_inputs(layouts)}, "
                             f"and '{labels}')", 400) from None
    except formats.FormatError as error:
        raise DatasetRefused(f"the data set cannot be used: {error.reason}", 400) from None


def _refreshed(path: Path) -> bool:
    """Mark a stored file as just stored again, so retention's sweep of files no row names
    (a day after their last change) leaves it to the row about to name it; False if none."""
    try:
        os.utime(path)
    except FileNotFoundError:  # none, or moved aside by that sweep: this upload stores its own
        return False
    return True


def _store(dataset: EvaluationDataset, staged: storage.StagedArtifact, created_by) -> EvaluationDataset:
    target = files.dataset_path(dataset)
    created_file = not _refreshed(target)
    if created_file:
        target.parent.mkdir(parents=True, exist_ok=True)
        storage.move_into(staged.path, target)
    try:
        with transaction.atomic():
            dataset.save()
            events.dataset_added(dataset, created_by)
            scheduling.dataset_added(dataset)
    except IntegrityError:
        _forget(dataset, created_file)
        # Only the name's uniqueness is the client's to hear of; any other constraint a
        # checked file still broke is this code's bug, and a 409 "taken" would hide it.
        if EvaluationDataset.objects.filter(model=dataset.model, name=dataset.name).exists():
            raise _taken(dataset.model, dataset.name) from None
        raise
    except BaseException:
        _forget(dataset, created_file)
        raise
    return dataset


def _forget(dataset: EvaluationDataset, created_file: bool) -> None:
    """Remove a file this call stored, unless a data set recorded meanwhile uses it."""
    if created_file and not EvaluationDataset.objects.filter(sha256=dataset.sha256, file_format=dataset.file_format).exists():
        files.dataset_path(dataset).unlink(missing_ok=True)
