"""The input layouts an upload is checked against (``serving.jobs.formats.signature_layouts``,
from the signature inspection records) are the ones a job's child builds from the loaded
model (``serving.jobs.model.input_layouts``): a file accepted at upload is read the same
way when the job runs."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from registry.artifacts.inspection import inspect_artifact
from registry.building.onnx_build import random_mlp
from serving.config import ServingConfig
from serving.jobs.formats import signature_layouts
from serving.jobs.model import input_layouts, load_engine
from tests.fixtures.onnx_files import build_all_datatypes, build_fixed_batch, build_multi_input, make_model, write_model


def build_fixed_rows() -> onnx.ModelProto:
    """A first dimension of 3 that is no batch axis: one row is the whole input."""
    shape = [3, 4]
    return make_model([helper.make_node("Identity", ["x"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])


@pytest.mark.parametrize("build", [lambda: random_mlp([8, 4], seed=1), build_fixed_batch, build_multi_input, build_all_datatypes,
                                   build_fixed_rows], ids=["batchable", "fixed-batch-of-1", "two-inputs", "every-datatype", "fixed-rows"])
def test_an_upload_is_checked_with_the_layouts_the_jobs_child_reads_the_file_with(tmp_path, build):
    path = write_model(tmp_path, "model.onnx", build())

    recorded = signature_layouts(inspect_artifact(path).signature)

    assert recorded == input_layouts(load_engine(path, ServingConfig.from_env()))
