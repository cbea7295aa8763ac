"""`memstore up` as a newcomer runs it: ready within 30 s, Ctrl-C stops every process, data persists."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import server_dir

pytestmark = pytest.mark.e2e

READY_WITHIN_S = 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(data_dir: Path, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env["MEMSTORE_LOG_FORMAT"] = "json"
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
            "2",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )


def _wait_ready(port: int, proc: subprocess.Popen[bytes], log_path: Path) -> float:
    started = time.monotonic()
    while time.monotonic() - started < READY_WITHIN_S:
        assert proc.poll() is None, log_path.read_text()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    pytest.fail(f"not ready within {READY_WITHIN_S} s:\n{log_path.read_text()}")


def _stop_and_check_nothing_left(proc: subprocess.Popen[bytes]) -> None:
    family = psutil.Process(proc.pid).children(recursive=True)
    names = {p.name() for p in family}
    assert {"postgres", "redis-server"} <= names, names
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0
    _, alive = psutil.wait_procs(family, timeout=10)
    assert alive == [], [(p.pid, p.name()) for p in alive]


def _chunk_is_applied_and_counted(port: int, headers: dict[str, str]) -> None:
    """A chunk goes through the worker process, and the API's /metrics shows the worker's counters."""
    base = f"http://127.0.0.1:{port}"
    body = {"user_id": "e2e", "messages": [{"role": "user", "content": "I live in Porto."}]}
    accepted = httpx.post(f"{base}/v1/chunks", json=body, headers=headers, timeout=5)
    assert accepted.status_code == 202
    deadline = time.monotonic() + 30
    while (
        httpx.get(f"{base}/v1/chunks/{accepted.json()['chunk_id']}", headers=headers).json()["status"]
        != "applied"
    ):
        assert time.monotonic() < deadline, "the chunk was not applied"
        time.sleep(0.1)
    text = httpx.get(f"{base}/metrics", timeout=5).text
    line = 'memstore_chunks_finished_total{outcome="applied",writer="offline"} 1.0'
    assert line in text, text


def test_up_is_ready_stops_cleanly_and_keeps_data(tmp_path: Path) -> None:
    data_dir, port = server_dir("memstore-e2e-") / "data", _free_port()

    first = _start(data_dir, port, tmp_path / "first.log")
    try:
        _wait_ready(port, first, tmp_path / "first.log")
        match = re.search(r"(ms_[A-Za-z0-9_-]{20,})", (tmp_path / "first.log").read_text())
        assert match, "the generated admin key was not printed"
        admin = {"Authorization": f"Bearer {match.group(1)}"}
        created = httpx.post(
            f"http://127.0.0.1:{port}/v1/admin/keys",
            json={"name": "app", "roles": ["ingest"]},
            headers=admin,
            timeout=5,
        )
        assert created.status_code == 201
        _chunk_is_applied_and_counted(port, {"Authorization": f"Bearer {created.json()['key']}"})
        _stop_and_check_nothing_left(first)
    finally:
        if first.poll() is None:
            first.kill()

    second = _start(data_dir, port, tmp_path / "second.log")
    try:
        _wait_ready(port, second, tmp_path / "second.log")
        assert "shown once" not in (tmp_path / "second.log").read_text(), "a second key was generated"
        keys = httpx.get(f"http://127.0.0.1:{port}/v1/admin/keys", headers=admin, timeout=5)
        assert keys.status_code == 200
        assert {k["name"] for k in keys.json()["items"]} == {"admin", "app"}
        _stop_and_check_nothing_left(second)
    finally:
        if second.poll() is None:
            second.kill()
        shutil.rmtree(data_dir.parent, ignore_errors=True)
