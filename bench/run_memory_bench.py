"""Run memory: what one request costs a worker when the model allocates as its input says.

    .venv/bin/python -m bench.run_memory_bench [--worker-dir DIR] [--worker-env SERVING_RUN_MEMORY_MB=256]
                                               [--rows 500000]

One worker (`python -m serving.worker`) serves a model whose run takes rows × 4 KiB, rows
read from the input (`ConstantOfShape` to `[rows, 1024]`, then a sum): the shape of an
audit's model that took a worker from 181 MB to 2.58 GB with a 40-byte request. One
request with `--rows`, then a small one, then another small one after more than a second
(when a batch may give the arena back, serving/run_memory.py). Each line: the answer, its
time, the worker's peak and current RSS from /proc/PID/status. `--worker-dir` runs the
serving package of another checkout (before/after). Loopback only; the worker is stopped
by its PID.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx
import onnx
import orjson
from onnx import TensorProto, helper

from bench.serve_bench import WorkerProcess, write_model
from serving.contract import DesiredState, ModelState, Route


def allocates_as_named() -> onnx.ModelProto:
    """y = sum(ones([n, 1024])): a run takes n × 4 KiB, n read from the input."""
    graph = helper.make_graph(
        [helper.make_node("Concat", ["n", "row"], ["shape"], axis=0),
         helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])),
         helper.make_node("ReduceSum", ["ones"], ["y"], keepdims=0)],
        "allocates-as-named",
        [helper.make_tensor_value_info("n", TensorProto.INT64, [1])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        initializer=[helper.make_tensor("row", TensorProto.INT64, [1], [1024])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def memory_mb(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024
    raise RuntimeError(f"no {field} for process {pid}")


def ask(worker: WorkerProcess, rows: int) -> str:
    body = {"inputs": [{"name": "n", "datatype": "INT64", "shape": [1], "data": [rows]}]}
    started = time.perf_counter()
    answer = httpx.post(f"http://127.0.0.1:{worker.port}/v2/models/allocates/infer", json=body, timeout=120)
    took_ms = (time.perf_counter() - started) * 1000
    pid = worker.process.pid
    said = answer.json().get("error", "")
    return (f"| {rows:,} | {answer.status_code} | {took_ms:,.0f} ms | {memory_mb(pid, 'VmHWM'):,} MB | "
            f"{memory_mb(pid, 'VmRSS'):,} MB | {said} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker-dir", type=Path, default=WorkerProcess.source_dir)
    parser.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--rows", type=int, default=500_000)
    args = parser.parse_args()
    WorkerProcess.source_dir = args.worker_dir.resolve()
    WorkerProcess.extra_env = {"SERVING_ALLOW_LOCAL_ARTIFACTS": "true", **dict(item.split("=", 1) for item in args.worker_env)}
    with tempfile.TemporaryDirectory() as directory:
        path, sha256 = write_model(Path(directory), "allocates", allocates_as_named())
        state = DesiredState(generation=1, models={"allocates": ModelState(routes=(
            Route(version=1, weight=100, sha256=sha256, artifact_url=str(path), signature={"batchable": False}),))})
        state_file = Path(directory) / "state.json"
        state_file.write_bytes(orjson.dumps(state.to_dict()))
        with WorkerProcess(state_file, Path(directory) / "cache") as worker:
            print(f"worker {args.worker_dir} {' '.join(args.worker_env)}: RSS at start {memory_mb(worker.process.pid, 'VmRSS'):,} MB")
            print("| rows | status | time | peak RSS | RSS after | error |\n|---:|---:|---:|---:|---:|---|")
            print(ask(worker, args.rows))
            print(ask(worker, 10))
            time.sleep(1.2)
            print(ask(worker, 10))


if __name__ == "__main__":
    main()
