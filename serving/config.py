"""Every setting of a serving worker, read once from the environment.

Each setting is one line through serving/env.py, the one reader of settings shared with
the console: a bad value fails the process at start instead of serving with a default.
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.contract import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_QUEUE_DELAY_S,
    DEFAULT_MAX_QUEUE_SIZE,
    MAX_BATCH_SIZE,
    MAX_QUEUE_DELAY_S,
    MAX_WORKER_ID_CHARS,
)
from serving.env import MAX_INTEGER, SettingError, env_bool, env_choice, env_float, env_int, env_path, env_secret, env_str, env_url
from serving.model_safety import default_data_dir

MAX_THREADS = 4096
MAX_CUDA_DEVICE_ID = 1023
# ONNX Runtime's gpu_mem_limit is a size_t, whose largest value is its own "no limit".
MAX_SIZE_T = 2**64 - 1
# SERVING_RUN_MEMORY_MB is MiB: its bytes must fit the 64 bits ONNX Runtime's arena takes
# (2**44 MiB was a TypeError at every load, naming no setting).
MAX_RUN_MEMORY_MB = MAX_INTEGER // (1024 * 1024)

# Linux's default ceiling on open files a process may have (fs.nr_open); 3,000,000,000
# overflowed uvloop's backlog in a traceback.
MAX_CONNECTIONS_LIMIT = 1_048_576

# Older name, still raised by the engine and the app for settings that conflict.
ConfigError = SettingError


@dataclass(frozen=True, slots=True)
class ServingConfig:
    """Settings of one worker process. Documented in the README settings table."""

    device: str = "auto"
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    graph_optimization: str = "all"
    execution_mode: str = "sequential"
    memory_pattern: bool = True
    allow_spinning: bool = False
    cuda_device_id: int = 0
    gpu_mem_limit_bytes: int = 0
    run_memory_mb: int = 0  # 0: half the memory the process may use (serving/run_memory.py)
    cudnn_conv_algo_search: str = "heuristic"
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_queue_delay_s: float = DEFAULT_MAX_QUEUE_DELAY_S
    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    max_batches_in_flight: int = 1
    max_shape_queues: int = 16
    request_timeout_s: float = 10.0
    warm_timeout_s: float = 120.0  # a version's warm-up, every batch size; past it the load fails
    max_body_bytes: int = 64 * 1024 * 1024
    max_body_buffer_bytes: int = 512 * 1024 * 1024  # every body being received at once, together
    max_elements: int = 16 * 1024 * 1024
    compute_nice: int = 5
    max_in_flight: int = 0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    send_timeout_s: float = 30.0  # how long an answer may wait for its client to read (serving/http_protocol.py)
    max_unsent_bytes: int = 256 * 1024 * 1024  # answers held for clients not reading, together (0: no bound)
    max_header_bytes: int = 16 * 1024
    max_connections: int = 4096
    # Longest a new connection waits in the listen queue: half the request timeout by default,
    # the other half for the batch queue and the run; 0: no keeper (serving/listen_queue.py).
    accept_wait_s: float = 5.0
    keeper_nice: int = 5  # the keeper's niceness: serving beats refusing on a busy machine
    api_keys: str = "off"
    api_keys_refresh_s: float = 3.0
    metrics_token_required: bool = False
    switch_interval_s: float = 0.005
    drain_timeout_s: float = 20.0  # a retired version's drain, and the worker's own on SIGTERM
    drain_delay_s: float = 0.0  # on SIGTERM: not ready, still serving, for this long (serving/drain.py)
    cache_dir: str = "var/serving-cache"
    worker_token: str = ""
    console_url: str = "http://127.0.0.1:8000"
    console_timeout_s: float = 10.0
    allow_local_artifacts: bool = False  # development only: file:// and local paths in states
    log_level: str = "info"
    coalesce_writes: bool = True
    allow_pinning_unrouted: bool = False
    trust_routing_key: bool = False

    @classmethod
    def from_env(cls) -> ServingConfig:
        request_timeout_s = env_float("SERVING_REQUEST_TIMEOUT_S", 10.0, minimum=0.001)
        env_bool("ORT_DISABLE_TELEMETRY", True)  # ONNX Runtime reads it (see serving/__init__.py); a bad value stops the worker here
        worker_id = env_str("SERVING_WORKER_ID")  # read by serving/control.py; checked here, at start
        if len(worker_id) > MAX_WORKER_ID_CHARS:
            raise SettingError(f"SERVING_WORKER_ID={worker_id!r}: at most {MAX_WORKER_ID_CHARS} characters (the console refuses "
                               "reports and acks under a longer id)")
        return cls(
            device=env_choice("SERVING_DEVICE", "auto", ("auto", "cpu", "cuda")),
            # ONNX Runtime takes a C int: past it every load failed with a TypeError naming no setting.
            intra_op_threads=env_int("SERVING_INTRA_OP_THREADS", 0, maximum=MAX_THREADS),
            inter_op_threads=env_int("SERVING_INTER_OP_THREADS", 0, maximum=MAX_THREADS),
            graph_optimization=env_choice("SERVING_GRAPH_OPTIMIZATION", "all", ("disable", "basic", "extended", "all")),
            execution_mode=env_choice("SERVING_EXECUTION_MODE", "sequential", ("sequential", "parallel")),
            memory_pattern=env_bool("SERVING_MEMORY_PATTERN", True),
            allow_spinning=env_bool("SERVING_ALLOW_SPINNING", False),
            cuda_device_id=env_int("SERVING_CUDA_DEVICE_ID", 0, maximum=MAX_CUDA_DEVICE_ID),
            gpu_mem_limit_bytes=env_int("SERVING_GPU_MEM_LIMIT_BYTES", 0, maximum=MAX_SIZE_T),
            run_memory_mb=env_int("SERVING_RUN_MEMORY_MB", 0, minimum=0, maximum=MAX_RUN_MEMORY_MB),
            cudnn_conv_algo_search=env_choice(
                "SERVING_CUDNN_CONV_ALGO_SEARCH", "heuristic", ("exhaustive", "heuristic", "default")
            ),
            max_batch_size=env_int("SERVING_MAX_BATCH_SIZE", DEFAULT_MAX_BATCH_SIZE, minimum=1, maximum=MAX_BATCH_SIZE),
            max_queue_delay_s=env_float("SERVING_MAX_QUEUE_DELAY_S", DEFAULT_MAX_QUEUE_DELAY_S, maximum=MAX_QUEUE_DELAY_S),
            max_queue_size=env_int("SERVING_MAX_QUEUE_SIZE", DEFAULT_MAX_QUEUE_SIZE, minimum=1),
            max_batches_in_flight=env_int("SERVING_MAX_BATCHES_IN_FLIGHT", 1, minimum=1),
            max_shape_queues=env_int("SERVING_MAX_SHAPE_QUEUES", 16, minimum=1),
            request_timeout_s=request_timeout_s,
            warm_timeout_s=env_float("SERVING_WARM_TIMEOUT_S", 120.0, minimum=0.1),
            max_body_bytes=env_int("SERVING_MAX_BODY_BYTES", 64 * 1024 * 1024, minimum=1024),
            max_body_buffer_bytes=env_int("SERVING_MAX_BODY_BUFFER_BYTES", 512 * 1024 * 1024, minimum=1024),
            max_elements=env_int("SERVING_MAX_ELEMENTS", 16 * 1024 * 1024, minimum=1),
            compute_nice=env_int("SERVING_COMPUTE_NICE", 5, maximum=19),
            max_in_flight=env_int("SERVING_MAX_IN_FLIGHT", 0),
            header_timeout_s=env_float("SERVING_HEADER_TIMEOUT_S", 10.0, minimum=0.01),
            body_timeout_s=env_float("SERVING_BODY_TIMEOUT_S", 30.0, minimum=0.01),
            send_timeout_s=env_float("SERVING_SEND_TIMEOUT_S", 30.0, minimum=0.01),
            max_unsent_bytes=env_int("SERVING_MAX_UNSENT_BYTES", 256 * 1024 * 1024, minimum=0),
            max_header_bytes=env_int("SERVING_MAX_HEADER_BYTES", 16 * 1024, minimum=1024),
            max_connections=env_int("SERVING_MAX_CONNECTIONS", 4096, maximum=MAX_CONNECTIONS_LIMIT),
            accept_wait_s=env_float("SERVING_ACCEPT_WAIT_S", request_timeout_s / 2),
            keeper_nice=env_int("SERVING_KEEPER_NICE", 5, maximum=19),
            api_keys=env_choice("SERVING_API_KEYS", "off", ("off", "optional", "required")),
            api_keys_refresh_s=env_float("SERVING_API_KEYS_REFRESH_S", 3.0, minimum=0.1),
            metrics_token_required=env_bool("SERVING_METRICS_TOKEN_REQUIRED", False),
            switch_interval_s=env_float("SERVING_SWITCH_INTERVAL_S", 0.005, minimum=0.0001),
            drain_timeout_s=env_float("SERVING_DRAIN_TIMEOUT_S", 20.0),
            drain_delay_s=env_float("SERVING_DRAIN_DELAY_S", 0.0),
            cache_dir=str(env_path("SERVING_CACHE_DIR", default_data_dir() / "serving-cache")),
            worker_token=env_secret("SERVING_WORKER_TOKEN"),
            console_url=env_url("CONSOLE_URL", "http://127.0.0.1:8000"),
            console_timeout_s=env_float("SERVING_CONSOLE_TIMEOUT_S", 10.0, minimum=0.1),
            allow_local_artifacts=env_bool("SERVING_ALLOW_LOCAL_ARTIFACTS", False),
            log_level=env_choice("SERVING_LOG_LEVEL", "info", ("debug", "info", "warning", "error")),
            coalesce_writes=env_bool("SERVING_COALESCE_WRITES", True),
            allow_pinning_unrouted=env_bool("SERVING_ALLOW_PINNING_UNROUTED", False),
            trust_routing_key=env_bool("SERVING_TRUST_ROUTING_KEY", False),
        )
