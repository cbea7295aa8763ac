"""An idle worker takes up a new chunk when the API's wake-up reaches it, not at its next poll; without
wake-ups the poll still finds the work."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest
import redis.asyncio as aioredis
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import Chunk
from app.domain.pipeline.scheduler import PREFIX
from app.lib.queue import create_redis
from app.server.asgi import create_app
from tests.conftest import TenantKeys, bearer
from tests.support.waiting import wait_for
from tests.support.workers import running_worker
from workers.settings import shutdown, worker_options
from workers.wakeable import WakeableWorker

IDLE = 0.3  # long enough for the worker's look at the queue and its subscription, once it polls


async def idle(worker: WakeableWorker) -> None:
    """Until the worker has started polling (its start-up, which loads the language model, can take
    longer than IDLE on a loaded machine or in a fresh process) and is waiting between polls."""
    # The listener is made at its first look at the queue.
    await wait_for(lambda: worker._listener is not None, timeout_s=30, what="the worker's first look")
    await asyncio.sleep(IDLE)  # time itself must pass: the worker goes idle between polls


async def status(sessionmaker: async_sessionmaker[AsyncSession], chunk_id: str) -> str:
    async with sessionmaker() as session:
        return str(await session.scalar(select(Chunk.status).where(Chunk.id == uuid.UUID(chunk_id))))


async def post_one(settings: Settings, tenant: TenantKeys, user_id: str) -> str:
    async with AsyncTestClient(create_app(settings, configure_logs=False)) as api:
        response = await api.post(
            "/v1/chunks",
            json={"user_id": user_id, "messages": [{"role": "user", "content": "I live in Oslo."}]},
            headers=bearer(tenant.admin_key),
        )
    assert response.status_code == 202, response.text
    return str(response.json()["chunk_id"])


async def seconds_to_applied(
    sessionmaker: async_sessionmaker[AsyncSession], chunk_id: str, started: float, limit_s: float
) -> float:
    """Seconds from `started` until the chunk is applied; fails past `limit_s`."""
    await wait_for(
        lambda: status(sessionmaker, chunk_id),
        lambda seen: seen == "applied",
        timeout_s=max(0.0, limit_s - (time.monotonic() - started)),
        what=f"chunk {chunk_id} applied",
        interval_s=0.01,
    )
    return time.monotonic() - started


def quiet(settings: Settings, **update: object) -> Settings:
    """No sweeper within the test's time: only a job can start the work."""
    return settings.model_copy(update={"sweep_interval_s": 600, "sweep_min_age_s": 600.0, **update})


async def test_an_idle_worker_takes_up_a_new_chunk_at_once_not_at_its_next_poll(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    """With a 30 s poll delay, chunks of new users posted to an idle worker are applied within seconds
    when the API wakes it; with wake-ups off, the same chunk still waits two seconds later."""
    async with running_worker(quiet(settings), poll_delay=30) as worker:
        await idle(worker)
        unwoken = await post_one(quiet(settings, worker_wake=False), tenant, "unwoken")
        await asyncio.sleep(2)  # time itself must pass: nothing happens to an unwoken chunk
        assert await status(sessionmaker, unwoken) == "queued"

        waits = []
        for n in range(5):
            await asyncio.sleep(IDLE)  # idle again: the worker waits on its poll delay
            started = time.monotonic()
            chunk_id = await post_one(quiet(settings), tenant, f"woken-{n}")
            waits.append(await seconds_to_applied(sessionmaker, chunk_id, started, 10))
        print("seconds from post to applied, woken:", [round(w, 2) for w in waits])


async def test_without_wake_ups_the_poll_finds_the_work(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    """A wake-up lost (here: never sent) costs the poll delay, nothing more."""
    unwoken = quiet(settings, worker_wake=False)
    async with running_worker(unwoken, poll_delay=1.0) as worker:
        await idle(worker)
        started = time.monotonic()
        chunk_id = await post_one(unwoken, tenant, "polled")
        took = await seconds_to_applied(sessionmaker, chunk_id, started, 10)
    print(f"seconds from post to applied, polled: {took:.2f}")


async def test_an_api_stopping_right_after_its_answer_still_queues_the_job(
    settings: Settings, tenant: TenantKeys
) -> None:
    """The 202 goes out before the batch's scopes are made ready; an API shut down at once lets that
    finish, so the chunk does not wait for the sweeper."""
    client = aioredis.from_url(settings.redis_url)
    try:
        for n in range(5):
            chunk_id = await post_one(quiet(settings), tenant, f"stopping-{n}")
            ready = f"{PREFIX}ready:{tenant.tenant_id}"
            assert await client.zscore(ready, f"stopping-{n}") is not None, (n, chunk_id)
    finally:
        await client.aclose()


async def _sleepy(ctx: dict[str, object], seconds: float) -> None:
    await asyncio.sleep(seconds)


async def _watches(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_watch", {}).get("calls", 0))


def _sleepy_worker(settings: Settings) -> contextlib.AbstractAsyncContextManager[WakeableWorker]:
    """A running worker of `_sleepy` jobs alone (no pipeline, no crons), looking every 20 ms."""
    from arq import func

    return running_worker(
        settings,
        functions=[func(_sleepy, name="sleepy")],
        cron_jobs=[],
        on_startup=None,
        on_shutdown=None,
        on_job_start=None,
        on_job_end=None,
        max_jobs=20,
        keep_result=0,
    )


@pytest.mark.parametrize("where", ["here", "elsewhere"])
async def test_a_look_at_the_queue_does_not_recheck_the_jobs_already_running(
    settings: Settings, where: str
) -> None:
    """arq keeps a running job in its queue and checks every id it reads (WATCH, EXISTS, ZSCORE) before
    starting it; a worker looking every 20 ms at ten long jobs, run by itself or by another worker,
    checks none of them that way again (one batched EXISTS says which run elsewhere)."""
    redis = aioredis.from_url(settings.redis_url)
    queue = create_redis(settings.redis_url)
    async with contextlib.AsyncExitStack() as workers:
        runner = await workers.enter_async_context(_sleepy_worker(settings))
        try:
            for n in range(10):
                await queue.enqueue_job("sleepy", seconds=30.0, _job_id=f"sleepy:{n}")
            await wait_for(
                lambda: len(runner.tasks), lambda n: n >= 10, timeout_s=10, what="ten jobs running"
            )
            looker = runner
            if where == "elsewhere":
                looker = await workers.enter_async_context(_sleepy_worker(settings))
                await wait_for(lambda: looker._listener is not None, timeout_s=10, what="its first look")
            before = await _watches(redis)
            await asyncio.sleep(1.0)  # about fifty looks at a queue of ten running jobs
            assert await _watches(redis) - before == 0
            assert not looker.tasks or looker is runner
            await queue.enqueue_job("sleepy", seconds=0.0, _job_id="sleepy:new")
            # a new job is still found and started at once
            await wait_for(
                lambda: sum(w.jobs_complete for w in dict.fromkeys([runner, looker])),
                lambda done: done >= 1,
                timeout_s=5,
                what="the new job done",
            )
        finally:
            await queue.aclose()
            await redis.aclose()


async def test_a_worker_asked_to_stop_as_a_wake_up_arrives_stops(settings: Settings) -> None:
    """The cancellation and the wake-up land in the same turn of the loop: the worker must still stop
    (Python 3.11's asyncio.wait_for dropped such a cancellation, and the worker polled on)."""
    worker = WakeableWorker(**(worker_options(settings) | {"handle_signals": False, "poll_delay": 5.0}))
    task = asyncio.create_task(worker.main())
    try:
        await idle(worker)  # past its first look, in its wait for a wake-up
        assert not task.done()
        worker._woken.set()  # the wake-up, at the very moment of the stop
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=3)
        assert task in done, "the worker went on after it was cancelled"
        assert task.cancelled()
    finally:
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=1)
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await worker.close()
        await shutdown(worker.ctx)
