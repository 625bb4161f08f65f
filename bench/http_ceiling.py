"""Where the time goes: the HTTP ceiling of this machine next to our worker, side by side.

    .venv/bin/python -m bench.http_ceiling [--duration-s 5] [--rounds 2] [--conc 64 1]

Starts, one after another on 127.0.0.1, each as its own process under uvicorn (uvloop,
httptools, access log off, log level warning):

  raw       a bare ASGI handler: read the POST body, answer a fixed small JSON
  raw1write the same, with uvicorn's protocol wrapped so head and body leave in one write
  raw2proc  the bare handler in two processes sharing one port (SO_REUSEPORT): what
            several event loops per worker would buy at many connections
  protocol  no ASGI, no uvicorn: an asyncio protocol on uvloop parsing with httptools and
            answering the same JSON from the parser's callback: what the kernel, uvloop and
            the parser cost, the floor under any Python HTTP server on this machine
  prototask the same, answered from one asyncio task per request, as an ASGI server runs
            its app: what deferring each answer to a task adds, and how it grows with
            connections
  batcher   the same plus a minimal asyncio batcher: orjson body -> np.array -> a queue
            drained by one loop task into ONE run_in_executor(session.run) per batch
            (the small MLP, same session options as the worker) -> orjson answer
  worker    `python -m serving.worker` serving the small MLP (max_batch_size 64, the bench's
            state): GET /v2/health/live (plain wrk: the route is GET-only), POST
            /v2/models/small/infer (V2 JSON, one row) and POST /predict (one row)
  baseline  with --baseline-dir DIR: the same worker run from another checkout's
            serving/ package (cwd=DIR), to compare before/after in one machine state

and drives each with `wrk -t1 -cN` (a Lua script for the POSTs); `--targets a p` runs only
the targets whose label starts with those letters. The rounds interleave
the targets so a noisy neighbour hits all of them alike; the table gives the best round
of each (the least disturbed) and the server's CPU time per request, read from
/proc/PID/stat around the run (the load generator's CPU is not in it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 64
TICKS_S = os.sysconf("SC_CLK_TCK")


# ---- the two reference servers (run with --serve) --------------------------------------


def raw_app():
    body = b'{"ok":true}'
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    start = {"type": "http.response.start", "status": 200, "headers": headers}
    end = {"type": "http.response.body", "body": body}

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        message = await receive()
        while message.get("more_body"):
            message = await receive()
        await send(start)
        await send(end)

    return app


def batcher_app(model_path: str):
    import onnxruntime as ort

    from serving.config import ServingConfig
    from serving.engine import session_options

    session = ort.InferenceSession(model_path, session_options(ServingConfig()), providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    state = {"queue": [], "wake": None, "loop": None}

    def run(batch):
        return session.run(None, {input_name: batch})[0]

    async def batch_loop():
        loop, wake = state["loop"], state["wake"]
        while True:
            await wake.wait()
            wake.clear()
            queue, state["queue"] = state["queue"], []
            if not queue:
                continue
            batch = np.concatenate([row for row, _ in queue]) if len(queue) > 1 else queue[0][0]
            output = await loop.run_in_executor(None, run, batch)
            for index, (_, future) in enumerate(queue):
                future.set_result(output[index:index + 1])
            if state["queue"]:
                wake.set()

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    state["loop"], state["wake"] = asyncio.get_running_loop(), asyncio.Event()
                    state["task"] = state["loop"].create_task(batch_loop())
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        message = await receive()
        body = message.get("body", b"")
        if not body:  # the readiness probe (GET /)
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        document = orjson.loads(body)
        row = np.array(document["inputs"][0]["data"], dtype=np.float32).reshape(1, WIDTH)
        future = state["loop"].create_future()
        state["queue"].append((row, future))
        state["wake"].set()
        output = await future
        payload = orjson.dumps({"outputs": [{"name": "probabilities", "shape": [1, 10], "data": output.ravel()}]},
                               option=orjson.OPT_SERIALIZE_NUMPY)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    return app


class BareProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive with httptools and nothing else: the answer leaves from the
    parser's callback (`answer_from_task` False) or from a task made for it."""

    answer_from_task = False
    body = b'{"ok":true}'
    response = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)

    def connection_made(self, transport) -> None:
        import httptools

        self.transport, self.loop = transport, asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except Exception:  # httptools' parse errors: a reference server just hangs up
            self.transport.close()

    def on_message_complete(self) -> None:
        if self.answer_from_task:
            self.loop.create_task(self.answer())
        else:
            self.transport.write(self.response)

    async def answer(self) -> None:
        if not self.transport.is_closing():
            self.transport.write(self.response)


def serve_bare(port: int, answer_from_task: bool) -> None:
    import uvloop

    protocol = type("Bare", (BareProtocol,), {"answer_from_task": answer_from_task})

    async def run() -> None:
        server = await asyncio.get_running_loop().create_server(protocol, "127.0.0.1", port, backlog=4096)
        await server.serve_forever()

    uvloop.run(run())


def serve(kind: str, port: int, model_path: str) -> None:
    import uvicorn

    from serving.http_protocol import CoalescingHttpToolsProtocol

    if kind in ("protocol", "prototask"):
        serve_bare(port, answer_from_task=kind == "prototask")
        return
    app = batcher_app(model_path) if kind == "batcher" else raw_app()
    http = CoalescingHttpToolsProtocol if kind == "raw1write" else "httptools"
    config = uvicorn.Config(app, host="127.0.0.1", port=port, loop="uvloop", http=http, access_log=False,
                            log_level="warning", lifespan="on" if kind == "batcher" else "off", backlog=4096)
    if kind != "raw2proc":
        uvicorn.Server(config).run()
        return
    shared = socket.socket()
    shared.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # the kernel spreads connections over the processes
    shared.bind(("127.0.0.1", port))
    shared.listen(4096)
    uvicorn.Server(config).run(sockets=[shared])


# ---- the comparison --------------------------------------------------------------------


def cpu_s(pid: int | list[subprocess.Popen]) -> float:
    if isinstance(pid, list):
        return sum(cpu_s(process.pid) for process in pid)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_S  # utime + stime, every thread


def wrk(url: str, concurrency: int, duration_s: float, script: Path | None) -> dict:
    command = ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(duration_s))}s", "--latency"]
    if script is not None:
        command += ["-s", str(script)]
    output = subprocess.run([*command, url], capture_output=True, text=True, check=True).stdout
    total, seconds = re.search(r"(\d+) requests in ([\d.]+)(m?s)", output).groups()[:2]
    errors = int((re.search(r"Non-2xx or 3xx responses: (\d+)", output) or [0, 0])[1])
    return {"requests": int(total), "req_s": float(re.search(r"Requests/sec:\s+([\d.]+)", output)[1]),
            "p50_ms": _ms(output, "50"), "p99_ms": _ms(output, "99"), "errors": errors}


def _ms(output: str, q: str) -> float:
    value, unit = re.search(rf"^\s+{q}%\s+([\d.]+)(us|ms|s)\s*$", output, re.MULTILINE).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def lua_script(path: Path, body: bytes, headers: dict[str, str] | None = None) -> Path:
    """A wrk script POSTing `body` (JSON unless `headers` say otherwise)."""
    body_file = path.with_suffix(".body")
    body_file.write_bytes(body)
    headers = headers or {"Content-Type": "application/json"}
    lines = "".join(f'wrk.headers["{name}"] = "{value}"\n' for name, value in headers.items())
    path.write_text(f'wrk.method = "POST"\n{lines}'
                    f'local f = io.open("{body_file}", "rb")\nwrk.body = f:read("*a")\nf:close()\n')
    return path


def wait_up(url: str, process: subprocess.Popen) -> None:
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server for {url} exited with {process.returncode}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def start(kind: str, workdir: Path, model_path: Path, state_file: Path, worker_env: dict,
          baseline_dir: Path | None) -> tuple[list[subprocess.Popen], int]:
    from bench.serve_bench import free_port

    port = free_port()
    cwd = ROOT
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SERVING_LOG_LEVEL": "warning", "SERVING_DEVICE": "cpu",
           "SERVING_CACHE_DIR": str(workdir / "cache")}
    if kind in ("worker", "baseline"):
        command = [sys.executable, "-m", "serving.worker", "--port", str(port), "--state-file", str(state_file)]
        env.update(worker_env)
        if kind == "baseline":
            cwd, env["PYTHONPATH"] = baseline_dir, str(baseline_dir)
    else:
        command = [sys.executable, "-m", "bench.http_ceiling", "--serve", kind, "--port", str(port), "--model", str(model_path)]
    processes = [subprocess.Popen(command, cwd=cwd, env=env) for _ in range(2 if kind == "raw2proc" else 1)]
    for process in processes:
        wait_up(f"http://127.0.0.1:{port}/v2/health/ready" if kind in ("worker", "baseline") else f"http://127.0.0.1:{port}/", process)
    return processes, port


def compare(args, workdir: Path) -> list[dict]:
    from bench.serve_bench import desired_state, infer_body, write_models

    models = write_models(workdir)
    small_path, small_sha = models["small"]
    state_file = workdir / "state.json"
    state_file.write_bytes(orjson.dumps(desired_state({"small": (small_path, small_sha)}, None)))
    v2 = infer_body(WIDTH)
    row = orjson.loads(v2)["inputs"][0]["data"]
    v2_script = lua_script(workdir / "v2.lua", v2)
    predict_script = lua_script(workdir / "predict.lua", orjson.dumps({"model_name": "small", "inputs": row}))
    worker_env = dict(item.split("=", 1) for item in args.worker_env)
    targets = [  # (label, server kind, path, script)
        ("a. raw ASGI, fixed JSON", "raw", "/", v2_script),
        ("a2. raw ASGI, head+body in one write", "raw1write", "/", v2_script),
        ("a3. raw ASGI, 2 processes on one port", "raw2proc", "/", v2_script),
        ("p. no ASGI: httptools protocol, answered in its callback", "protocol", "/", v2_script),
        ("p2. no ASGI: the same, answered from a task per request", "prototask", "/", v2_script),
        ("b. raw ASGI + minimal batcher + ORT", "batcher", "/", v2_script),
        ("c. worker GET /v2/health/live", "worker", "/v2/health/live", None),
        ("d. worker POST /v2/models/small/infer", "worker", "/v2/models/small/infer", v2_script),
        ("d. worker POST /predict", "worker", "/predict", predict_script),
    ]
    if args.baseline_dir:
        targets += [
            ("e. baseline GET /v2/health/live", "baseline", "/v2/health/live", None),
            ("e. baseline POST /v2/models/small/infer", "baseline", "/v2/models/small/infer", v2_script),
            ("e. baseline POST /predict", "baseline", "/predict", predict_script),
        ]
    if args.targets:
        targets = [target for target in targets if target[0].startswith(tuple(args.targets))]
    best: dict[tuple[str, int], dict] = {}
    for round_index in range(args.rounds):
        servers: dict[str, tuple[list[subprocess.Popen], int]] = {}
        try:
            for label, kind, path, script in targets:
                if kind not in servers:
                    servers[kind] = start(kind, workdir, small_path, state_file, worker_env, args.baseline_dir)
                processes, port = servers[kind]
                url = f"http://127.0.0.1:{port}{path}"
                wrk(url, 8, 1, script)  # warm connections, caches, the latency model
                for concurrency in args.conc:
                    before = cpu_s(processes)
                    result = wrk(url, concurrency, args.duration_s, script)
                    result["server_cpu_us"] = (cpu_s(processes) - before) / max(result["requests"], 1) * 1e6
                    result.update(target=label, concurrency=concurrency, round=round_index + 1,
                                  load=os.getloadavg()[0])
                    print(f"  round {round_index + 1} {label} c{concurrency}: {result['req_s']:,.0f} req/s, "
                          f"p99 {result['p99_ms']:.2f} ms, {result['server_cpu_us']:.0f} us CPU/req", flush=True)
                    key = (label, concurrency)
                    if key not in best or result["req_s"] > best[key]["req_s"]:
                        best[key] = result
        finally:
            for process in (process for processes, _ in servers.values() for process in processes):
                process.terminate()
                process.wait(timeout=15)
    return [best[(label, concurrency)] for concurrency in args.conc for label, *_ in targets]


def print_table(rows: list[dict]) -> None:
    reference = {row["concurrency"]: row["req_s"] for row in rows if row["target"].startswith("a.")}
    print("\n| target | conc | req/s (best round) | vs raw | p50 ms | p99 ms | non-2xx | server CPU us/req |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        raw = reference.get(row["concurrency"])
        vs_raw = f"{row['req_s'] / raw:.0%}" if raw else "-"
        print(f"| {row['target']} | {row['concurrency']} | {row['req_s']:,.0f} | {vs_raw} | "
              f"{row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['errors']} | {row['server_cpu_us']:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--conc", type=int, nargs="+", default=[64, 1])
    parser.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--targets", nargs="+", metavar="LETTER", help="only the targets whose label starts so (a, a3, p, d, ...)")
    parser.add_argument("--baseline-dir", type=Path, help="also run the worker from DIR/serving (before/after)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--serve", choices=("raw", "raw1write", "raw2proc", "batcher", "protocol", "prototask"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.model)
        return
    print(f"{os.cpu_count()} cores, load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="http-ceiling-") as tmp:
        rows = compare(args, Path(tmp))
    print_table(rows)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
