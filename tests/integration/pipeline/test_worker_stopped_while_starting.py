"""A worker stopped while it starts (Ctrl-C during its model load, a deploy that replaces it at once)
closes what it had opened: its database connections do not outlive it."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.lib import lexical
from app.lib.queue import create_redis
from tests.support.waiting import wait_for
from workers.settings import WorkerContext, shutdown, startup


async def _worker_connections(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        count = await conn.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'memstore-worker'"
            )
        )
    return int(count or 0)


async def test_a_worker_stopped_during_its_start_closes_its_connections(
    settings: Settings, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    loading, release = threading.Event(), threading.Event()

    def slow_load() -> None:  # the language model's load, held until the stop has come
        loading.set()
        release.wait(30)

    monkeypatch.setattr(lexical, "load", slow_load)
    ctx: WorkerContext = {"settings": settings, "redis": create_redis(str(settings.redis_url))}
    starting = asyncio.create_task(startup(ctx))
    try:
        await wait_for(loading.is_set, timeout_s=30, what="the worker loading its language model")
        # It has connected (its row-security check), and has no pipeline yet.
        assert "engine" in ctx
        assert "pipeline" not in ctx
        assert await _worker_connections(engine) >= 1
        starting.cancel()
    finally:
        release.set()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
    await shutdown(ctx)
    await ctx["redis"].aclose()
    assert "engine" not in ctx
    await wait_for(
        lambda: _worker_connections(engine),
        lambda count: count == 0,
        timeout_s=10,
        what="the worker's connections closed",
    )
