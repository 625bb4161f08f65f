"""`python -m serving.jobs batch|benchmark|evaluate ...`: one job, JSON lines on stdout.

``--model -`` reads the model from stdin: a registry job hands its child the version's
stored file opened (a link in the store is never followed) with ``--model-sha256``, and
the bytes read are checked and loaded as they are, never read again.

SIGTERM keeps its default action, which ends the process at once even inside a long
ONNX Runtime call: the parent cancels a job that way and expects it gone within a
second (a Python handler would only run once the call returned). It is reset
explicitly because an ignored signal is inherited across exec.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from serving.jobs.formats import BATCH_FORMATS, DATASET_FORMATS
from serving.jobs.protocol import run_job
from serving.model_safety import enter_private_working_directory, read_checked

TASKS = ("classification", "regression")
STDIN = Path("-")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def add_model_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("--model", type=Path, required=True, help="the ONNX file; - reads it from stdin")
    command.add_argument("--model-sha256", help="refuse the model unless its bytes have this sha256")
    command.add_argument("--model-name", help="how a refusal names the model (default: its path)")


def model_bytes(args: argparse.Namespace) -> bytes:
    """The model's bytes, read once, and checked against --model-sha256 when it is given."""
    with sys.stdin.buffer if args.model == STDIN else open(args.model, "rb") as source:
        if args.model_sha256 is None:
            return source.read()
        return read_checked(source, args.model_sha256, args.model_name or str(args.model))


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m serving.jobs", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)

    batch = commands.add_parser("batch", help="run the model over every row of a file")
    add_model_arguments(batch)
    batch.add_argument("--input", type=Path, required=True)
    batch.add_argument("--format", choices=BATCH_FORMATS, required=True)
    batch.add_argument("--output", type=Path, required=True)
    batch.add_argument("--batch-size", type=positive_int, default=256)

    benchmark = commands.add_parser("benchmark", help="throughput and latency at batch sizes 1, 8, 32 and the max")
    add_model_arguments(benchmark)
    benchmark.add_argument("--max-batch-size", type=positive_int, required=True)
    benchmark.add_argument("--seconds-per-size", type=positive_float, default=1.0)

    evaluate = commands.add_parser("evaluate", help="score the model on a labelled dataset")
    add_model_arguments(evaluate)
    evaluate.add_argument("--dataset", type=Path, required=True)
    evaluate.add_argument("--task", choices=TASKS, required=True)
    evaluate.add_argument("--format", choices=DATASET_FORMATS, help="default: the dataset's file extension")
    return root


def command(args: argparse.Namespace):
    """The job to run, as a function of no arguments (imports ONNX Runtime only now)."""
    if args.command == "batch":
        from serving.jobs import batch

        return lambda: batch.run(model_bytes(args), args.input, args.format, args.output, args.batch_size)
    if args.command == "benchmark":
        from serving.jobs import benchmark

        return lambda: benchmark.run(model_bytes(args), args.max_batch_size, args.seconds_per_size)
    from serving.jobs import evaluate

    return lambda: evaluate.run(model_bytes(args), args.dataset, args.format, args.task)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    arguments = parser()
    args = arguments.parse_args(argv)
    for name in ("model", "input", "output", "dataset"):
        if getattr(args, name, None) not in (None, STDIN):
            setattr(args, name, getattr(args, name).resolve())
    if args.command == "evaluate":
        args.format = args.format or args.dataset.suffix.removeprefix(".").lower()
        if args.format not in DATASET_FORMATS:
            arguments.error(f"--format: the dataset's extension is not one of {', '.join(DATASET_FORMATS)}")
    job = command(args)
    # The paths are absolute now; nothing a model refers to can resolve against our cwd.
    enter_private_working_directory(prefix="modelops-job-")
    return run_job(job)


if __name__ == "__main__":
    sys.exit(main())
