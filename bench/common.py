"""What every benchmark of the suite shares: the server (a local SeaweedFS or moto started
here, or any S3 given by ``--endpoint-url``), the latency proxies in front of it, fresh
prefixes, the task layouts, and small statistics helpers.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import objmanifest as om  # noqa: E402
from objmanifest.local import servers  # noqa: E402
from objmanifest.store import make_client  # noqa: E402
from tests.support.faults import FaultProxy  # noqa: E402
from tests.support.internals import engine  # noqa: E402

BUCKET = "objmanifest-bench"

# -- layouts -----------------------------------------------------------------------------------

LAYOUTS = ("task", "stage", "partitioned")
"""``task``: one shard for the whole task (the baseline); ``stage``: one shard per stage (the
default); ``partitioned``: each stage split into hash partitions."""


def layout_support() -> dict[str, bool]:
    """Which layouts and batch verbs this objmanifest has (the suite runs on older ones too,
    and says what it could not measure)."""
    params = inspect.signature(om.Task.create).parameters
    return {
        "task": "layout" in params,
        "stage": True,
        "partitioned": "partitions" in params,
        "put_many": hasattr(om.Agent, "put_many"),
    }


def create_task(
    store: Any,
    task_id: str,
    stages: list[str],
    layout: str = "stage",
    partitions: int = 1,
    **settings: Any,
) -> om.Task:
    """A task of ``stages`` in ``layout`` (``partitioned``: every stage in ``partitions``)."""
    if layout == "task":
        settings["layout"] = "task"
    elif layout == "partitioned" and partitions > 1:
        settings["partitions"] = dict.fromkeys(stages, partitions)
    elif layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}")
    return om.Task.create(store, task_id, stages=stages, **settings)


def shard_count(task: om.Task) -> int:
    """How many shard objects the task's stages live in."""
    return len({shard for stage in task.stages for shard in engine(task).layout.shards_of(stage)})


# -- the server and its proxies ----------------------------------------------------------------


@dataclass
class Bench:
    """The suite's context: one server, proxies adding latency in front of it, settings."""

    endpoint_url: str
    backend: str
    env: dict[str, str]
    bucket: str = BUCKET
    quick: bool = False
    server_pid: int | None = None
    """The local server's process (its CPU time is reported beside the agents')."""
    _proxies: dict[int, FaultProxy] = field(default_factory=dict)
    _clients: dict[str, Any] = field(default_factory=dict)

    def endpoint(self, delay_ms: int = 0) -> str:
        """The server's endpoint, or one ``delay_ms`` away behind a latency proxy."""
        if delay_ms == 0:
            return self.endpoint_url
        if delay_ms not in self._proxies:
            proxy = FaultProxy(self.endpoint_url, delay=delay_ms / 1000, keep_upstream=True)
            proxy.start()
            self._proxies[delay_ms] = proxy
        return self._proxies[delay_ms].endpoint_url

    def proxy(self, delay_ms: int) -> FaultProxy:
        self.endpoint(delay_ms)
        return self._proxies[delay_ms]

    def can_delay(self) -> bool:
        """Latency proxies forward plain HTTP only."""
        return self.endpoint_url.startswith("http://")

    def client(self, endpoint: str) -> Any:
        if endpoint not in self._clients:
            self._clients[endpoint] = make_client(endpoint, max_pool_connections=64)
        return self._clients[endpoint]

    def store(self, prefix: str, delay_ms: int = 0, endpoint: str | None = None) -> Any:
        endpoint = endpoint or self.endpoint(delay_ms)
        return om.connect(f"s3://{self.bucket}/{prefix}", client=self.client(endpoint))

    def close(self) -> None:
        for proxy in self._proxies.values():
            proxy.stop()
        self._proxies.clear()


def new_prefix(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def bench_context(
    backend: str = "seaweedfs",
    endpoint_url: str | None = None,
    bucket: str = BUCKET,
    quick: bool = False,
) -> Iterator[Bench]:
    """Start ``backend`` (or use ``endpoint_url`` with the credentials of the environment),
    create the bucket, and yield the suite's context; everything started is stopped."""
    local = None
    if endpoint_url is None:
        local = servers.start(backend)
        endpoint_url = local.endpoint_url
        env = local.env()
        os.environ.update({k: v for k, v in env.items() if k != "AWS_ENDPOINT_URL"})
    else:
        backend = "endpoint"
        env = {
            k: v
            for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
            if (v := os.environ.get(k))
        }
    b = Bench(
        endpoint_url,
        backend,
        env,
        bucket=bucket,
        quick=quick,
        server_pid=local.pid if local is not None else None,
    )
    try:
        client = b.client(endpoint_url)
        with contextlib.suppress(
            client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists
        ):
            client.create_bucket(Bucket=bucket)
        yield b
    finally:
        b.close()
        if local is not None:
            local.stop()


# -- CPU -------------------------------------------------------------------------------------


def _ticks() -> float:
    return float(os.sysconf("SC_CLK_TCK"))


def process_cpu(pid: int | None) -> float | None:
    """CPU seconds (user + system) ``pid`` has used, or None."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _ticks()


def machine_cpu() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    try:
        line = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    values = [int(x) for x in line[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values) - idle) / _ticks(), sum(values) / _ticks()


@dataclass
class CpuWindow:
    """CPU used between ``start()`` and ``stop()``: by this process (the harness and its
    latency proxies), by the local server, and by the whole machine (everyone's)."""

    server_pid: int | None
    _t0: float = 0.0
    _own: float = 0.0
    _server: float | None = None
    _machine: tuple[float, float] | None = None

    def start(self) -> CpuWindow:
        self._t0 = time.monotonic()
        t = os.times()
        self._own = t.user + t.system
        self._server = process_cpu(self.server_pid)
        self._machine = machine_cpu()
        return self

    def stop(self) -> dict[str, float | None]:
        wall = time.monotonic() - self._t0
        t = os.times()
        server = process_cpu(self.server_pid)
        machine = machine_cpu()
        busy = None
        if machine and self._machine:
            busy = round((machine[0] - self._machine[0]) / max(wall, 1e-9), 2)
        return {
            "wall_s": round(wall, 2),
            "harness_cpu_s": round(t.user + t.system - self._own, 2),
            "server_cpu_s": None
            if server is None or self._server is None
            else round(server - self._server, 2),
            "machine_busy_cores": busy,
        }


# -- statistics --------------------------------------------------------------------------------


def run_together(prepare: Callable[[int], Callable[[], None]], workers: int) -> float:
    """``workers`` threads, each ``prepare(n)`` first (untimed), then all of them running
    what it returned from one instant: the seconds until the last one ended."""
    start = threading.Barrier(workers + 1)

    def run(n: int) -> None:
        work = prepare(n)
        start.wait()
        work()

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(workers)]
    for thread in threads:
        thread.start()
    start.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - t0


def pct(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), nearest rank; None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    rank = max(1, min(len(xs), round(q / 100 * len(xs) + 0.5)))
    return xs[rank - 1]


def median(values: Iterable[float]) -> float | None:
    xs = list(values)
    return statistics.median(xs) if xs else None


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem = int(Path("/proc/meminfo").read_text().split()[1]) // 1024
    commit = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    weed = ""
    with contextlib.suppress(Exception):
        weed = subprocess.run(
            [servers.weed_binary(), "version"], capture_output=True, text=True, check=False
        ).stdout.strip()
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_mib": mem,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "objmanifest": om.__version__ if hasattr(om, "__version__") else "",
        "git_commit": commit,
        "seaweedfs": weed.splitlines()[0] if weed else "",
        "load_average": list(os.getloadavg()),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def say(*parts: Any) -> None:
    """Progress on stderr (stdout carries the results)."""
    print(*parts, file=sys.stderr, flush=True)
