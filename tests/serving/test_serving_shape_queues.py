"""Per-shape batch queues: SERVING_MAX_SHAPE_QUEUES bounds the shapes active at once,
not every shape a version has ever seen (idle queues are reclaimed)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from serving.engine import Engine
from serving.errors import QueueFull
from serving.protocol import Decoded
from serving.loaded_version import LoadedVersion
from serving.serving_plan import parse_state
from serving_testkit import HeldRun, make_config, route, state, v2_body


def test_shapes_served_one_after_another_never_run_out_of_queues(start_worker, relu_model, client):
    worker = start_worker(state(1, {"relu": {"routes": [route(1, 100, *relu_model)]}}), max_shape_queues=16)

    statuses = [client.post(f"{worker.url}/v2/models/relu/infer", json=v2_body(np.full((1, width), -1.0, np.float32)))
                .status_code for width in range(1, 41)]

    assert statuses == [200] * 40


@pytest.fixture
def relu_version(tmp_path, relu_model):
    config = make_config(tmp_path, max_shape_queues=2)
    spec = parse_state(state(1, {"relu": {"routes": [route(1, 100, *relu_model)]}}), config)[1].versions[0]
    engine = Engine(relu_model[0].read_bytes(), config, "cpu")
    held = engine.run = HeldRun(engine.run)
    version = LoadedVersion(spec, engine, config)
    yield version, held
    version.close()


def width(columns: int) -> Decoded:
    return Decoded((np.ones((1, columns), np.float32),), 1)


async def test_active_shapes_beyond_the_limit_get_503_and_idle_ones_make_room(relu_version):
    version, held = relu_version
    running = version.submit(width(1), time.monotonic() + 5, "a")
    assert await asyncio.to_thread(held.entered.wait, 5)
    queued = version.submit(width(2), time.monotonic() + 5, "b")

    with pytest.raises(QueueFull, match=r"too many distinct input shapes in flight \(limit 2\)"):
        version.submit(width(3), time.monotonic() + 5, "c")
    assert version.queue_depth == 1
    held.release.set()
    assert [result[0].shape for result in await asyncio.gather(running, queued)] == [(1, 1), (1, 2)]
    third = await version.submit(width(3), time.monotonic() + 5, "c")
    again = await version.submit(width(2), time.monotonic() + 5, "b2")

    assert third[0].tolist() == [[1.0, 1.0, 1.0]]
    assert again[0].tolist() == [[1.0, 1.0]]
    assert held.rows == [1, 1, 1, 1]
    assert await version.drain(timeout_s=1.0) is True


async def test_a_queue_with_a_request_waiting_is_never_reclaimed(relu_version):
    version, held = relu_version
    running = version.submit(width(1), time.monotonic() + 5, "a")
    assert await asyncio.to_thread(held.entered.wait, 5)
    waiting = version.submit(width(2), time.monotonic() + 5, "b")

    for columns in (3, 4, 5):
        with pytest.raises(QueueFull):
            version.submit(width(columns), time.monotonic() + 5, "x")
    held.release.set()

    assert (await waiting)[0].tolist() == [[1.0, 1.0]]
    assert (await running)[0].tolist() == [[1.0]]
