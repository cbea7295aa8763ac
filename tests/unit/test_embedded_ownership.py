"""An embedded server is stopped and restarted only by the process that runs it; others share it.

Redis stands in for both servers (they share the ownership code and Redis starts in milliseconds);
the e2e test does the same with Postgres under `memstore up`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.lib.embedded import EmbeddedError, EmbeddedRedis
from tests.conftest import server_dir
from tests.support.waiting import wait_for_sync


@pytest.fixture
def data_dir() -> Iterator[Path]:
    path = server_dir("memstore-owner-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _ping(redis: EmbeddedRedis) -> bool:
    return redis._serves()


def _revive_until_replaced(server: EmbeddedRedis, dead: int, *, skip_backoff: bool = False) -> None:
    """Call `revive` as `memstore up` does on each tick until a new server runs (10 s at most).

    A killed process is not reaped at once (its threads exit first), so one call may see it alive.
    """

    def revived() -> int | None:
        if skip_backoff:
            server._next_restart = 0.0  # restarts wait 1, 2, 4, 8 s apart; not in a test
        server.revive()
        return server.pid

    wait_for_sync(
        revived, lambda pid: pid not in (None, dead), timeout_s=10, what="a new server", interval_s=0.02
    )


def test_a_second_process_shares_the_server_and_leaves_it_running(data_dir: Path) -> None:
    owner = EmbeddedRedis(data_dir / "redis")
    owner.start()
    try:
        pid = owner.pid
        # Another process (a one-off command) on the same data directory: it uses the server as is.
        code = (
            "from pathlib import Path; from app.lib.embedded import EmbeddedRedis; "
            f"r = EmbeddedRedis(Path({str(data_dir / 'redis')!r})); r.start(); "
            "assert r.pid is None; r.stop()"
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
        assert owner.pid == pid
        assert _ping(owner)
    finally:
        owner.stop()


def test_the_owner_brings_back_a_server_that_died(data_dir: Path) -> None:
    owner = EmbeddedRedis(data_dir / "redis")
    owner.start()
    try:
        first = owner.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        _revive_until_replaced(owner, first)
        assert _ping(owner)
    finally:
        owner.stop()


def test_a_sharer_takes_over_when_the_owner_is_gone(data_dir: Path) -> None:
    """The owner is another process, killed with its server: the sharer runs a new server."""
    code = (
        "import sys, time; from pathlib import Path; from app.lib.embedded import EmbeddedRedis; "
        f"r = EmbeddedRedis(Path({str(data_dir / 'redis')!r})); r.start(); "
        "print(r.pid, file=sys.stderr, flush=True); time.sleep(600)"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    sharer = EmbeddedRedis(data_dir / "redis")
    try:
        assert owner.stderr is not None
        server_pid = int(owner.stderr.readline())
        sharer.start()
        assert sharer.pid is None
        sharer.revive()  # the owner is alive: nothing to do
        assert sharer.pid is None
        owner.kill()
        owner.wait(10)
        os.kill(server_pid, signal.SIGKILL)
        _revive_until_replaced(sharer, server_pid)
        assert _ping(sharer)
    finally:
        owner.kill()
        sharer.stop()


def test_a_server_that_keeps_dying_is_given_up(data_dir: Path) -> None:
    owner = EmbeddedRedis(data_dir / "redis")
    owner.start()
    try:
        for _ in range(5):
            pid = owner.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            _revive_until_replaced(owner, pid, skip_backoff=True)
            assert _ping(owner)
        pid = owner.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(EmbeddedError, match="stopped 5 times within a minute"):
            _revive_until_replaced(owner, pid, skip_backoff=True)
    finally:
        owner.stop()
