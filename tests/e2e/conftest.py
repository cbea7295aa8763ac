"""`memstore up` as a user starts it, for the end-to-end tests: a process of its own on a free port and a
data directory of its own, its readiness, and the admin key it prints on its first start."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import server_dir
from tests.support.waiting import wait_for_sync

READY_WITHIN_S = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def memstore_env() -> dict[str, str]:
    """This environment without any MEMSTORE_* setting: `memstore` runs on its defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env["MEMSTORE_LOG_FORMAT"] = "json"
    return env


def start_up(
    data_dir: Path,
    port: int,
    log_path: Path,
    workers: int = 2,
    env: dict[str, str] | None = None,
    own_session: bool = False,
) -> subprocess.Popen[bytes]:
    """`memstore up` on `data_dir` and `port`, everything it prints going to `log_path`; with `env`'s
    settings besides the defaults, and in a process group of its own if `own_session`."""
    log = log_path.open("wb")
    return subprocess.Popen(
        [
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
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=memstore_env() | (env or {}),
        start_new_session=own_session,
    )


def ready_within(port: int, proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float) -> float:
    """Until `/ready` answers 200; the seconds it took. Past `timeout_s`, or as soon as the process
    exits, an AssertionError with the end of its log."""
    started = time.monotonic()

    def ready() -> int:
        assert proc.poll() is None, f"exited ({proc.returncode}):\n{log_tail(log_path)}"
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code

    try:
        wait_for_sync(
            ready,
            lambda status: status == 200,
            timeout_s=timeout_s,
            what="/ready to answer 200",
            interval_s=0.1,
            ignore=(httpx.HTTPError,),
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{log_tail(log_path)}") from None
    return time.monotonic() - started


def wait_ready(port: int, proc: subprocess.Popen[bytes], log_path: Path) -> float:
    """`ready_within` READY_WITHIN_S, failing the test with the log otherwise."""
    try:
        return ready_within(port, proc, log_path, READY_WITHIN_S)
    except AssertionError as exc:
        pytest.fail(str(exc))


def log_tail(path: Path) -> str:
    return path.read_text(errors="replace")[-4000:]


def admin_key(log_path: Path) -> str:
    """The admin key of the `default` tenant, which the first start on a data directory prints once."""
    match = re.search(r"(ms_[A-Za-z0-9_-]{20,})", log_path.read_text())
    assert match, "the generated admin key was not printed"
    return match.group(1)


@dataclass(frozen=True)
class RunningUp:
    """A started `memstore up`: its process, where it listens and where its output goes."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> str:
        """Until the service is ready; the admin key it printed."""
        wait_ready(self.port, self.proc, self.log_path)
        return admin_key(self.log_path)


@contextmanager
def memstore_up(log_path: Path, workers: int = 1) -> Iterator[RunningUp]:
    """`memstore up` on a fresh data directory, started on entry (not yet ready: `wait_ready()`), and
    stopped with Ctrl-C on exit, its data directory removed."""
    data_dir = server_dir("memstore-e2e-") / "data"
    port = free_port()
    up = RunningUp(start_up(data_dir, port, log_path, workers=workers), port, log_path)
    try:
        yield up
    finally:
        if up.proc.poll() is None:
            up.proc.send_signal(signal.SIGINT)
            try:
                up.proc.wait(60)
            except subprocess.TimeoutExpired:
                up.proc.kill()
                up.proc.wait()
        shutil.rmtree(data_dir.parent, ignore_errors=True)
