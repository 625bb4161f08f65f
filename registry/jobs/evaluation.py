"""The evaluation job: one version on one labelled data set (accuracy, per-class
precision and recall and the confusion matrix for classification; MAE and MSE for
regression), kept in ``version.metrics["evaluation"][<data set name>]`` with the data
set's sha256, so a result always says which bytes it was measured on."""

from __future__ import annotations

from django.conf import settings

from registry.jobs import files
from registry.jobs.child import CHILD_MAX_FILE_BYTES, run_child
from registry.jobs.runner import JobFailed
from registry.jobs.versions import (
    measured,
    memory_limit_bytes,
    model_arguments,
    opened_artifact,
    store_metric,
)


def run(job) -> dict:
    version, dataset = job.version, job.dataset
    with opened_artifact(version) as model:
        if dataset is None:
            raise JobFailed("the job names no data set")
        dataset_file = files.dataset_path(dataset)
        if not dataset_file.is_file():
            raise JobFailed(f"the file of data set {dataset.name} is missing from the artifact store")
        argv = ["evaluate", *model_arguments(version), "--dataset", str(dataset_file), "--task", dataset.task]
        result = run_child(job, argv, memory_limit_bytes=memory_limit_bytes(version), nice=settings.JOB_NICE,
                           timeout_s=settings.JOB_TIMEOUT_S, max_file_bytes=CHILD_MAX_FILE_BYTES, stdin=model)
    store_metric(version, "evaluation", measured(result, job, dataset_sha256=dataset.sha256), entry=dataset.name)
    return result
