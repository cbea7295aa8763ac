"""Real arq workers for tests: in this process (fast, shares the event loop) or as `memstore worker`
subprocesses (when a test must kill one)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import Chunk
from tests.support.waiting import wait_for
from workers.settings import shutdown, worker_options
from workers.wakeable import WakeableWorker


@contextlib.asynccontextmanager
async def running_worker(settings: Settings, **overrides: Any) -> AsyncIterator[WakeableWorker]:
    """The worker `memstore worker` runs, with the production options, polling fast, inside the test's
    event loop."""
    options = worker_options(settings) | {"handle_signals": False, "poll_delay": 0.02} | overrides
    worker = WakeableWorker(**options)
    task = asyncio.create_task(worker.main())
    try:
        yield worker
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # close() waits for the jobs still running (a cron job, say), which the cancel above also
        # cancelled; their CancelledError is the expected end of this worker, not of the test.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await worker.close()
        # close() skips the shutdown hook when a cancelled job raised first; release what it holds.
        await shutdown(worker.ctx)


def settings_env(settings: Settings) -> dict[str, str]:
    """Environment that makes a `memstore` subprocess use exactly these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    for name, value in settings.model_dump().items():
        if value is not None:
            structured = isinstance(value, dict | list)
            env[f"MEMSTORE_{name.upper()}"] = json.dumps(value) if structured else str(value)
    env["MEMSTORE_LOG_FORMAT"] = "json"
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return env


def start_worker_process(
    settings: Settings, log_path: Path, extra_env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    env = settings_env(settings) | (extra_env or {})
    log = log_path.open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "app", "worker"], env=env, stdout=log, stderr=subprocess.STDOUT
    )


def stop_worker_process(proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


async def wait_until(
    check: Callable[[], Awaitable[bool]], timeout_s: float = 60, what: str = "condition"
) -> None:
    """Until `check()` is true (`wait_for` with a yes/no probe)."""
    await wait_for(check, timeout_s=timeout_s, what=what, interval_s=0.05)


async def chunk_counts(
    sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID
) -> dict[str, int]:
    async with sessionmaker() as session:
        rows = await session.execute(
            select(Chunk.status, func.count()).where(Chunk.tenant_id == tenant_id).group_by(Chunk.status)
        )
        return dict(rows.all())


async def wait_for_chunks(
    sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID, expected: int, timeout_s: float = 60
) -> dict[str, int]:
    """Until `expected` chunks of the tenant are finished (applied or failed); returns the counts (a
    timeout says the counts it last saw)."""

    def finished(counts: dict[str, int]) -> bool:
        return counts.get("applied", 0) + counts.get("failed", 0) >= expected

    return await wait_for(
        lambda: chunk_counts(sessionmaker, tenant_id),
        finished,
        timeout_s=timeout_s,
        what=f"{expected} finished chunks",
        interval_s=0.05,
    )
