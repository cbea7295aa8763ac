"""Shared helpers for the benchmarks: a `memstore up` started in a throwaway data dir, and ways to look at it.

`running_stack()` starts the whole service as an operator would (embedded Postgres + Redis, migrations,
API, workers), waits for `/ready`, and stops it with SIGINT on exit, killing anything left behind; with
`citus_workers` the database is a local Citus cluster instead (`memstore up --citus-workers N`, which
needs `make citus`).
`FakeModelServer` runs the fake model / embeddings server of the tests as a process of its own, which
can be stopped and started again on the same port, as a real one restarted. A benchmark's command line
(`bench_parser`, `add_stack_options`) and the end of its report (`write_figures`, `conclude`) are said
here once, so every script reads and answers alike.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from app.db.tenancy import SERVICE_ROLE
from app.lib.embedded import EmbeddedCitusNode, EmbeddedPostgres, EmbeddedRedis

ROOT = Path(__file__).resolve().parents[1]
ADMIN_KEY = "ms_bench_admin_key_0123456789abcdef"
READY_TIMEOUT_S = 60.0
# A cluster's start makes three servers and distributes the schema after migrating it.
CLUSTER_READY_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 90.0


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's command line; `--help` shows its module's docstring with the line breaks kept."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_stack_options(parser: argparse.ArgumentParser, *, workers: int, log_level: str) -> None:
    """The options of a benchmark that starts `memstore up` and reports figures: `--workers`,
    `--log-level`, `--json` and `--env`."""
    parser.add_argument("--workers", type=int, default=workers, help="worker processes of `memstore up`")
    parser.add_argument("--log-level", default=log_level, help="MEMSTORE_LOG_LEVEL of the service")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    add_settings_option(parser)


def write_figures(result: dict[str, Any], path: Path | None) -> None:
    """`--json`: the figures written to `path`, if given."""
    if path is None:
        return
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\n  figures written to {path}")


def conclude(problems: list[str], ok: str) -> None:
    """The last word of a benchmark that is also a check: exit 1 naming what went wrong, else `ok`."""
    if problems:
        print("\n  FAILED: " + "; ".join(problems), file=sys.stderr)
        sys.exit(1)
    print(f"\n  ok: {ok}")


def add_settings_option(parser: argparse.ArgumentParser) -> None:
    """`--env MEMSTORE_X=V`, repeatable: settings for the service the benchmark starts."""
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        type=_setting,
        metavar="MEMSTORE_X=V",
        help="a setting for the service (repeatable), e.g. MEMSTORE_EMBEDDER=hashing",
    )


def _setting(text: str) -> str:
    name, equals, _ = text.partition("=")
    if not equals or not name.startswith("MEMSTORE_"):
        msg = f"expected MEMSTORE_X=V, not {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return text


def settings_of(pairs: list[str]) -> dict[str, str]:
    """The `--env` settings as environment variables."""
    return dict(pair.split("=", 1) for pair in pairs)


def caller_env() -> dict[str, str]:
    """This process's environment without its `MEMSTORE_*` settings: the service measured is
    configured by the benchmark alone."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}


def up_command(
    data_dir: Path, port: int, *, workers: int, api_processes: int = 1, citus_workers: int = 0
) -> list[str]:
    """`memstore up` on `port` with its data in `data_dir`, as an operator starts it."""
    cluster = ["--citus-workers", str(citus_workers)] if citus_workers else []
    return [
        sys.executable,
        "-m",
        "app",
        "up",
        "--data-dir",
        str(data_dir),
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--api-processes",
        str(api_processes),
        *cluster,
    ]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


GONE = "gone"


def role_of(proc: psutil.Process) -> str:
    """What a process of the stack is, from its command line; `GONE` for one that exited meanwhile
    (a Postgres backend or a killed worker may go between listing the family and looking at it)."""
    try:
        cmd = " ".join(proc.cmdline())
        name = proc.name()
    except psutil.Error:
        return GONE
    if "redis-server" in cmd:
        return "redis"
    if "postgres" in name or "postgres:" in cmd:
        return "postgres"
    if " serve" in cmd or "multiprocessing" in cmd:
        return "api"
    if " worker" in cmd:
        return "worker"
    return "supervisor"


def cpu_seconds(procs: list[psutil.Process]) -> float:
    """User + system CPU time of `procs` (and their children that have exited and been waited for)."""
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


@dataclass
class CpuByRole:
    """CPU seconds per kind of process, summed over the processes seen at each snapshot."""

    seconds: dict[str, float] = field(default_factory=dict)

    @classmethod
    def snapshot(cls, procs: list[psutil.Process]) -> CpuByRole:
        by_role: dict[str, list[psutil.Process]] = {}
        for proc in procs:
            role = role_of(proc)
            if role != GONE:
                by_role.setdefault(role, []).append(proc)
        return cls({role: cpu_seconds(members) for role, members in by_role.items()})

    def __sub__(self, earlier: CpuByRole) -> CpuByRole:
        return CpuByRole({k: v - earlier.seconds.get(k, 0.0) for k, v in self.seconds.items()})


def _stop(proc: subprocess.Popen[bytes], family: list[psutil.Process], timeout_s: float) -> int:
    """SIGINT `proc`, wait for it, then kill whatever of `family` is still alive."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        print(f"  ! pid {proc.pid} still running {timeout_s:.0f} s after SIGINT; killing it", file=sys.stderr)
        proc.kill()
        code = proc.wait(10)
    _, alive = psutil.wait_procs(family, timeout=5)
    for straggler in alive:
        with contextlib.suppress(psutil.Error):
            print(f"  ! killing leftover pid {straggler.pid} ({role_of(straggler)})", file=sys.stderr)
            straggler.kill()
    return code


@dataclass
class Stack:
    """A running `memstore up`: where to reach it and how to look inside."""

    base_url: str
    admin_headers: dict[str, str]
    data_dir: Path
    pg_socket_dir: Path
    database_url: str
    """SQLAlchemy URL as the tables' owner (what `MEMSTORE_ADMIN_DATABASE_URL` takes), to look inside."""
    service_url: str
    """SQLAlchemy URL as the service role (what `MEMSTORE_DATABASE_URL` takes), for more workers."""
    dsn: str
    """libpq URL, for asyncpg.connect() and psql."""
    redis_url: str
    log_file: Path
    env: dict[str, str]
    """Environment of the `memstore up` process (MEMSTORE_* of the caller stripped)."""
    process: subprocess.Popen[bytes]
    extra: list[subprocess.Popen[bytes]] = field(default_factory=list)
    citus_workers: int = 0
    """Workers of the local Citus cluster behind the coordinator `database_url` names; 0: one Postgres."""

    def family(self) -> list[psutil.Process]:
        """The supervisor and every process under it (Postgres and its backends included)."""
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        return []

    def processes(self, role: str) -> list[psutil.Process]:
        """The stack's live processes of `role` ("worker", "api", ...), skipping any that exit meanwhile."""
        return [proc for proc in self.family() if role_of(proc) == role]

    def create_key(self, name: str = "bench", roles: tuple[str, ...] = ("ingest", "read")) -> str:
        response = httpx.post(
            f"{self.base_url}/v1/admin/keys",
            headers=self.admin_headers,
            json={"name": name, "roles": list(roles)},
            timeout=30,
        )
        response.raise_for_status()
        return str(response.json()["key"])

    def start_worker(self) -> subprocess.Popen[bytes]:
        """One more `python -m app worker` against this stack's Postgres and Redis (stopped on exit)."""
        env = {
            **self.env,
            "MEMSTORE_DATABASE_URL": self.service_url,
            "MEMSTORE_ADMIN_DATABASE_URL": self.database_url,
            "MEMSTORE_REDIS_URL": self.redis_url,
        }
        with self.log_file.open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "app", "worker"],
                env=env,
                cwd=self.data_dir.parent,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.extra.append(proc)
        return proc

    def stop_workers(self) -> None:
        """Stop the workers `start_worker` started (SIGINT, as an operator stops one)."""
        for worker in self.extra:
            _stop(worker, [], STOP_TIMEOUT_S)
        self.extra.clear()

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        return ""


@contextlib.contextmanager
def running_stack(
    *,
    workers: int = 0,
    api_processes: int = 1,
    log_level: str = "INFO",
    data_dir: Path | None = None,
    env_overrides: dict[str, str] | None = None,
    default_limits: bool = False,
    citus_workers: int = 0,
) -> Iterator[Stack]:
    """`memstore up` in `data_dir` (default: a fresh temporary one), ready to serve; stopped on exit.

    Its output goes to `memstore.log` next to the data dir, at `log_level`, as in production (JSON).
    With `citus_workers`, on a local Citus cluster of a coordinator and that many workers (the stack's
    URLs name the coordinator).
    """
    with contextlib.ExitStack() as cleanup:
        if data_dir is None:
            tmp = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="memstore-bench-"))
            data_dir = Path(tmp) / "data"
        data_dir = data_dir.resolve()
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        log_file = data_dir.parent / "memstore.log"
        port = free_port()
        env = caller_env()
        # Benchmarks measure throughput: no request rate per key or per user (a deployment sets its
        # own), unless `default_limits` asks for the service as deployed.
        env |= {"MEMSTORE_LOG_LEVEL": log_level, "MEMSTORE_ADMIN_KEY": ADMIN_KEY}
        if not default_limits:
            env |= {"MEMSTORE_RATE_LIMIT_PER_S": "0", "MEMSTORE_USER_RATE_LIMIT_PER_S": "0"}
        env |= env_overrides or {}
        postgres = (
            EmbeddedCitusNode(data_dir / "citus" / "coordinator")
            if citus_workers
            else EmbeddedPostgres(data_dir / "pg")
        )
        with log_file.open("ab") as log:
            # cwd outside the repository, so a developer's .env cannot change what is measured.
            proc = subprocess.Popen(
                up_command(
                    data_dir, port, workers=workers, api_processes=api_processes, citus_workers=citus_workers
                ),
                env=env,
                cwd=data_dir.parent,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        stack = Stack(
            base_url=f"http://127.0.0.1:{port}",
            admin_headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            data_dir=data_dir,
            pg_socket_dir=postgres.socket_dir,
            database_url=postgres.url(),
            service_url=postgres.url(user=SERVICE_ROLE),
            dsn=postgres.dsn(),
            redis_url=EmbeddedRedis(data_dir / "redis").url,
            log_file=log_file,
            env=env,
            process=proc,
            citus_workers=citus_workers,
        )
        try:
            _wait_ready(stack, CLUSTER_READY_TIMEOUT_S if citus_workers else READY_TIMEOUT_S)
            yield stack
        finally:
            stack.stop_workers()
            _stop(proc, stack.family()[1:], STOP_TIMEOUT_S)


def _wait_ready(stack: Stack, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stack.process.poll() is not None:
            code = stack.process.returncode
            msg = f"memstore up exited with code {code}; its log ends:\n{stack.log_tail()}"
            raise RuntimeError(msg)
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{stack.base_url}/ready", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    msg = f"memstore up was not ready after {timeout_s:.0f} s; its log ends:\n{stack.log_tail()}"
    raise TimeoutError(msg)


class FakeModelServer:
    """`python -m tests.support.fake_llm` in a process of its own: OpenAI's chat completions and
    `/v1/embeddings` over real HTTP, answering after `latency_s`. `stop()` takes it away (connections
    are refused, as from a crashed server); `start()` brings it back on the port it had."""

    def __init__(self, latency_s: float = 0.0) -> None:
        self.latency_s = latency_s
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible endpoint (what `MEMSTORE_*_BASE_URL` takes)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout_s: float = 30.0) -> None:
        command = [sys.executable, "-m", "tests.support.fake_llm", "--latency", str(self.latency_s)]
        if self.port is not None:
            command += ["--port", str(self.port)]
        proc = subprocess.Popen(
            command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if not line.startswith("PORT "):
            proc.kill()
            msg = f"the fake model server did not start (said {line!r})"
            raise RuntimeError(msg)
        self.process, self.port = proc, int(line.split()[1])
        # Given a port, it names it before binding: it serves once it answers.
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/models", timeout=1).status_code == 200:
                    return
            time.sleep(0.05)
        self.stop()
        msg = f"the fake model server did not serve on port {self.port} within {timeout_s:.0f} s"
        raise RuntimeError(msg)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def __enter__(self) -> FakeModelServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
