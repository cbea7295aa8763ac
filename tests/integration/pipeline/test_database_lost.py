"""A worker that cannot reach Postgres takes no turns from the fair scheduler until it can again: it
would only fail them, and hold its users back from the workers that can serve them. Here the worker
reaches Postgres through a proxy the test cuts; Redis stays reachable throughout."""

from __future__ import annotations

import asyncio
import time

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from prometheus_client import REGISTRY
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from tests.conftest import TenantKeys
from tests.support.scenario import post_users
from tests.support.tcp_proxy import postgres_proxy
from tests.support.waiting import wait_for
from tests.support.workers import chunk_counts, running_worker, wait_for_chunks
from tests.support.writers import SlowWriter

USERS = ["u0", "u1", "u2"]
PER_USER = 8  # chunks `post_users` posts for each user
QUIET_S = 3.0  # longer than a faulted turn's wait (2 s) before its scope is due again
WRITER_S = 30.0  # how long the held turn's writer thinks


def faulted_turns() -> float:
    return REGISTRY.get_sample_value("memstore_scheduler_turns_total", {"outcome": "faulted"}) or 0.0


async def test_a_worker_cut_from_postgres_takes_no_turns_until_it_answers_again(
    api: AsyncTestClient[Litestar],
    ingest_headers: dict[str, str],
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
) -> None:
    async with postgres_proxy(pipeline_settings.database_url or "") as proxy:
        over_proxy = pipeline_settings.model_copy(update={"database_url": proxy.url()})
        async with running_worker(over_proxy):
            await post_users(api, ingest_headers, USERS[:1])
            await wait_for_chunks(sessionmaker, tenant.tenant_id, PER_USER)

            proxy.cut()
            before = faulted_turns()
            await post_users(api, ingest_headers, USERS[1:])
            await wait_for(faulted_turns, lambda n: n > before, timeout_s=30, what="a turn to fault")
            await asyncio.sleep(0.5)  # time itself must pass: the turns taken with it end too
            faulted = faulted_turns()
            # Time itself must pass: without the pause, each scope would be taken and fail again.
            await asyncio.sleep(QUIET_S)
            assert faulted_turns() == faulted, "the worker took turns while Postgres was unreachable"
            assert (await chunk_counts(sessionmaker, tenant.tenant_id)).get("applied") == PER_USER

            proxy.restore()
            counts = await wait_for_chunks(sessionmaker, tenant.tenant_id, PER_USER * len(USERS))
    assert counts == {"applied": PER_USER * len(USERS)}


async def test_a_worker_cut_from_postgres_mid_turn_gives_the_turn_back_to_the_others(
    api: AsyncTestClient[Litestar],
    ingest_headers: dict[str, str],
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its writer still thinking when the worker finds Postgres gone, the turn is given back then, not
    when the writer answers (or its lease lapses): another worker serves the user meanwhile."""
    monkeypatch.setenv("MEMSTORE_TEST_WRITER_DELAY_S", str(WRITER_S))
    async with postgres_proxy(pipeline_settings.database_url or "") as proxy:
        over_proxy = pipeline_settings.model_copy(update={"database_url": proxy.url()})
        async with running_worker(over_proxy):
            await post_users(api, ingest_headers, ["held"], writer="slow", facts=["I like tea."])
            await wait_for(
                lambda: SlowWriter.in_flight, lambda n: n > 0, timeout_s=30, what="the writer called"
            )
            proxy.cut()
            cut_at = time.monotonic()
            # A turn that meets the cut: the worker finds Postgres gone.
            await post_users(api, ingest_headers, ["other"], facts=["I like jazz."])
            monkeypatch.setenv("MEMSTORE_TEST_WRITER_DELAY_S", "0.05")
            async with running_worker(pipeline_settings):
                counts = await wait_for_chunks(sessionmaker, tenant.tenant_id, 2, timeout_s=WRITER_S / 2)
            served_s = time.monotonic() - cut_at
    assert counts == {"applied": 2}
    assert served_s < WRITER_S / 2
