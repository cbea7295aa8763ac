"""`memstore up` as a newcomer runs it: ready within 30 s, Ctrl-C stops every process, data persists;
one-off commands beside it share its servers, and a server that dies under it comes back."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import server_dir
from tests.e2e.conftest import admin_key, free_port, memstore_env, start_up, wait_ready
from tests.support.waiting import wait_for_sync

pytestmark = pytest.mark.e2e


def _stop_and_check_nothing_left(proc: subprocess.Popen[bytes]) -> None:
    family = psutil.Process(proc.pid).children(recursive=True)
    names = {p.name() for p in family}
    assert {"postgres", "redis-server"} <= names, names
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0
    _, alive = psutil.wait_procs(family, timeout=10)
    assert alive == [], [(p.pid, p.name()) for p in alive]


def _wait_applied(chunk_url: str, headers: dict[str, str]) -> None:
    wait_for_sync(
        lambda: httpx.get(chunk_url, headers=headers, timeout=5).json()["status"],
        lambda status: status == "applied",
        timeout_s=30,
        what=f"{chunk_url} applied",
        interval_s=0.1,
    )


def _chunk_is_applied_and_counted(port: int, headers: dict[str, str]) -> None:
    """A chunk goes through the worker process, and the API's /metrics shows the worker's counters."""
    base = f"http://127.0.0.1:{port}"
    body = {"user_id": "e2e", "messages": [{"role": "user", "content": "I live in Porto."}]}
    accepted = httpx.post(f"{base}/v1/chunks", json=body, headers=headers, timeout=5)
    assert accepted.status_code == 202
    _wait_applied(f"{base}/v1/chunks/{accepted.json()['chunk_id']}", headers)
    text = httpx.get(f"{base}/metrics", timeout=5).text
    line = 'memstore_chunks_finished_total{outcome="applied",writer="offline"} 1.0'
    assert line in text, text


def _search_finds_by_meaning(port: int, headers: dict[str, str]) -> None:
    """The README's quick start: with the default configuration, a question that shares no word with
    the memory that answers it finds that memory first."""
    base = f"http://127.0.0.1:{port}"
    text = "I moved to Seattle last month and I mainly use Python."
    body = {"user_id": "u-123", "messages": [{"role": "user", "content": text}]}
    accepted = httpx.post(f"{base}/v1/chunks", json=body, headers=headers, timeout=5)
    assert accepted.status_code == 202
    chunk_url = f"{base}/v1/chunks/{accepted.json()['chunk_id']}"
    _wait_applied(chunk_url, headers)
    query = {"user_id": "u-123", "query": "what language does the user write code in?"}
    found = httpx.post(f"{base}/v1/memories/search", json=query, headers=headers, timeout=10)
    assert found.status_code == 200, found.text
    contents = [r["memory"]["content"] for r in found.json()["results"]]
    assert contents[0] == "The user mainly uses Python.", contents
    assert "The user lives in Seattle." in contents


def test_up_is_ready_stops_cleanly_and_keeps_data(tmp_path: Path) -> None:
    data_dir, port = server_dir("memstore-e2e-") / "data", free_port()

    first = start_up(data_dir, port, tmp_path / "first.log")
    try:
        wait_ready(port, first, tmp_path / "first.log")
        admin = {"Authorization": f"Bearer {admin_key(tmp_path / 'first.log')}"}
        created = httpx.post(
            f"http://127.0.0.1:{port}/v1/admin/keys",
            json={"name": "app", "roles": ["ingest"]},
            headers=admin,
            timeout=5,
        )
        assert created.status_code == 201
        _chunk_is_applied_and_counted(port, {"Authorization": f"Bearer {created.json()['key']}"})
        _search_finds_by_meaning(port, admin)
        _stop_and_check_nothing_left(first)
    finally:
        if first.poll() is None:
            first.kill()

    second = start_up(data_dir, port, tmp_path / "second.log")
    try:
        wait_ready(port, second, tmp_path / "second.log")
        assert "shown once" not in (tmp_path / "second.log").read_text(), "a second key was generated"
        keys = httpx.get(f"http://127.0.0.1:{port}/v1/admin/keys", headers=admin, timeout=5)
        assert keys.status_code == 200
        assert {k["name"] for k in keys.json()["items"]} == {"admin", "app"}
        _stop_and_check_nothing_left(second)
    finally:
        if second.poll() is None:
            second.kill()
        shutil.rmtree(data_dir.parent, ignore_errors=True)


def _server_pid(pid_file: Path) -> int | None:
    """The pid a server wrote in its pid file (Postgres' postmaster.pid, Redis' redis.pid)."""
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _wait_until(
    condition: Callable[[], bool], what: str, log_path: Path, proc: subprocess.Popen[bytes]
) -> None:
    def holds() -> bool:
        assert proc.poll() is None, log_path.read_text()
        return condition()

    try:  # generous: a bound on a hang, not a timing requirement
        wait_for_sync(holds, timeout_s=90, what=what, interval_s=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{log_path.read_text()}") from None


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _create_tenant(command: list[str]) -> dict[str, str]:
    """Run a `memstore` command that creates a tenant; the headers of the admin key it printed."""
    created = subprocess.run(
        [sys.executable, "-m", "app", *command],
        env=memstore_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert created.returncode == 0, created.stderr
    key = re.search(r"(ms_[A-Za-z0-9_-]{20,})", created.stdout)
    assert key, created.stdout
    return {"Authorization": f"Bearer {key.group(1)}"}


def test_one_off_commands_share_up_and_dead_servers_come_back(tmp_path: Path) -> None:
    data_dir, port = server_dir("memstore-e2e-") / "data", free_port()
    log_path = tmp_path / "up.log"
    postmaster_pid, redis_pid = data_dir / "pg" / "postmaster.pid", data_dir / "redis" / "redis.pid"
    up = start_up(data_dir, port, log_path, workers=1)
    try:
        wait_ready(port, up, log_path)
        postgres, redis = _server_pid(postmaster_pid), _server_pid(redis_pid)

        # One-off commands on the same data directory use the running servers and leave them be:
        # directly, and inside `memstore exec`, which hands both servers' URLs to its command.
        exec_ = ["exec", "--data-dir", str(data_dir), "--", sys.executable, "-m", "app"]
        _create_tenant([*exec_, "tenants", "create", "inside-exec"])
        tenant = _create_tenant(["tenants", "create", "beside-up", "--data-dir", str(data_dir)])
        assert (_server_pid(postmaster_pid), _server_pid(redis_pid)) == (postgres, redis)
        assert _ready(port)
        keys = httpx.get(f"http://127.0.0.1:{port}/v1/admin/keys", headers=tenant, timeout=5)
        assert keys.status_code == 200, keys.text

        # Postgres killed under `up`: it is started again and the service is ready again.
        assert postgres is not None
        os.kill(postgres, signal.SIGKILL)
        _wait_until(
            lambda: _server_pid(postmaster_pid) not in (None, postgres) and _ready(port),
            "Postgres did not come back",
            log_path,
            up,
        )
        keys = httpx.get(f"http://127.0.0.1:{port}/v1/admin/keys", headers=tenant, timeout=5)
        assert keys.status_code == 200, keys.text

        # The same for Redis.
        assert redis is not None
        os.kill(redis, signal.SIGKILL)
        _wait_until(
            lambda: _server_pid(redis_pid) not in (None, redis) and _ready(port),
            "Redis did not come back",
            log_path,
            up,
        )
        _stop_and_check_nothing_left(up)
    finally:
        if up.poll() is None:
            up.kill()
        shutil.rmtree(data_dir.parent, ignore_errors=True)
