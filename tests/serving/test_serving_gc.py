"""The worker process tunes its garbage collector once everything is loaded."""

from __future__ import annotations

import subprocess
import sys

from serving.worker import GC_THRESHOLDS


def test_tuning_freezes_the_start_up_heap_and_raises_the_young_threshold():
    code = ("import gc\nfrom serving.worker import tune_garbage_collector\n"
            "tune_garbage_collector()\nprint(gc.get_threshold(), gc.get_freeze_count() > 1000)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)

    assert done.stdout.strip() == f"{GC_THRESHOLDS} True"


def test_an_in_process_worker_leaves_its_hosts_collector_alone(digits_worker):
    import gc

    assert gc.get_threshold() != GC_THRESHOLDS
