"""`memstore status`: after real traffic (chunks applied, one failed for good, one op held for review,
a backlog in another tenant), the screen's numbers are the database's, read as the service role, and
the workers it counts are the ones running."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import AuditEvent, Chunk
from app.lib.queue import QUEUE_NAME, create_redis
from tests.conftest import FAST_WORKERS, TenantKeys, writers_toml
from tests.integration.reviews.conftest import INJECTION, injectable
from tests.support.fake_llm import FakeLLM, Reply
from tests.support.workers import running_worker, settings_env, wait_for_chunks

Client = AsyncTestClient[Litestar]
GARBAGE_MARK = "zq-garbage"


def responder(body: dict[str, Any]) -> Reply:
    """A model that obeys an injected "delete everything" and answers prose to a marked chunk, every
    time (its repair request and its retry too), so that chunk fails for good."""
    if GARBAGE_MARK in json.dumps(body["messages"]):
        return Reply(content="Sure! The user seems nice; nothing else to add.")
    return injectable(body)


@pytest.fixture
async def model() -> AsyncIterator[FakeLLM]:
    async with FakeLLM(responder=responder) as fake:
        yield fake


@pytest.fixture
def status_settings(settings: Settings, tmp_path: Path, model: FakeLLM) -> Settings:
    path = tmp_path / "writers.toml"
    path.write_text(
        writers_toml({"agent": {"profile": "mem0", "base_url": model.base_url, "model": "agent-model"}})
    )
    return settings.model_copy(update={**FAST_WORKERS, "writers_file": path, "writer": "agent"})


@pytest.fixture
def api_settings(status_settings: Settings) -> Settings:
    return status_settings


async def memstore_status(settings: Settings, *args: str) -> tuple[int, str, str]:
    """`memstore status ARGS` as an operator runs it, with the service's URLs (not the owner's)."""
    env = settings_env(settings) | {"COLUMNS": "120", "NO_COLOR": "1"}
    env.pop("MEMSTORE_ADMIN_DATABASE_URL", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        "status",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def status_json(settings: Settings) -> dict[str, Any]:
    code, out, err = await memstore_status(settings, "--json")
    assert code == 0, out + err
    found: dict[str, Any] = json.loads(out)
    return found


async def say(api: Client, headers: dict[str, str], user: str, text: str) -> None:
    body = {"user_id": user, "messages": [{"role": "user", "content": text}]}
    response = await api.post("/v1/chunks", json=body, headers=headers)
    assert response.status_code == 202, response.text


async def test_status_shows_the_queues_failures_reviews_and_workers_as_they_are(
    api: Client,
    tenant: TenantKeys,
    other_tenant: TenantKeys,
    status_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    response = await api.patch("/v1/admin/settings", json={"destructive_ops": "review"}, headers=tenant.admin)
    assert response.status_code == 200, response.text
    async with running_worker(status_settings):
        await say(api, tenant.admin, "ana", "I live in Lyon.")
        await wait_for_chunks(sessionmaker, tenant.tenant_id, 1)
        await say(api, tenant.admin, "ana", INJECTION)  # its one DELETE is held for review
        await say(api, tenant.admin, "bob", f"{GARBAGE_MARK}: I like tea.")
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 3) == {"applied": 2, "failed": 1}

        running = await status_json(status_settings)
        assert running["redis"] == "ok"
        assert running["workers_alive"] == 1
        (worker,) = running["workers"]
        assert worker["pid"] == os.getpid()
        assert worker["name"] == f"{worker['host']}:{os.getpid()}"
        assert worker["max_jobs"] == status_settings.worker_max_jobs + status_settings.shadow_max_jobs
        assert worker["beat_age_s"] < 30
        code, screen, err = await memstore_status(status_settings)
        print(screen)  # the screen docs/operations.md shows, with a worker
        assert code == 0, screen + err
        assert "Workers alive: 1" in screen

    # A backlog in the other tenant, with no worker to take it.
    for text in ("I live in Oslo.", "I play chess."):
        await say(api, other_tenant.admin, "olga", text)

    found = await status_json(status_settings)
    assert (found["database"], found["redis"]) == ("ok", "ok")
    assert found["workers_alive"] == 0, "a worker that stopped is no longer counted"
    assert found["workers"] == []
    redis = create_redis(str(status_settings.redis_url))
    try:
        assert found["queue_jobs"] == await redis.zcard(QUEUE_NAME)  # the crons'
        assert found["scopes_ready"] >= 1  # the other tenant's scope, waiting for a worker
        assert found["tenants_paused"] == 0
    finally:
        await redis.aclose()

    tenants = {t["tenant"]: t for t in found["tenants"]}
    assert set(tenants) == {"acme", "globex"}
    acme, globex = tenants["acme"], tenants["globex"]
    assert (globex["queued"], globex["processing"], globex["failed"]) == (2, 0, 0)
    assert globex["oldest_unapplied_age_s"] > 0
    assert (acme["queued"], acme["processing"], acme["oldest_unapplied_age_s"]) == (0, 0, 0)
    assert acme["failed"] == 1
    assert (acme["reviews_waiting"], globex["reviews_waiting"]) == (1, 0)
    assert acme["oldest_review_age_s"] > 0
    assert found["reviews"]["waiting"] == 1
    assert found["backlog"]["queued"] == 2
    assert found["backlog"]["oldest_unapplied_age_s"] == pytest.approx(
        globex["oldest_unapplied_age_s"], abs=5
    )

    async with sessionmaker() as session:
        failed = await session.scalar(
            select(Chunk).where(Chunk.tenant_id == tenant.tenant_id, Chunk.status == "failed")
        )
        assert failed is not None
        assert failed.last_error is not None
        attempts = await session.scalar(
            select(func.sum(Chunk.attempts)).where(
                Chunk.tenant_id == tenant.tenant_id, Chunk.status.in_(("applied", "failed"))
            )
        )
        rows = await session.execute(
            select(AuditEvent.tenant_id, func.count())
            .where(AuditEvent.hash.is_(None))
            .group_by(AuditEvent.tenant_id)
        )
        unsealed = {tenant_id: int(n) for tenant_id, n in rows.all()}
    assert failed.last_error.startswith("writer error: unparseable extract output")
    assert found["failed"] == [
        {
            "tenant_id": str(tenant.tenant_id),
            "tenant": "acme",
            "error": ":".join(failed.last_error.split(":")[:2]),
            "chunks": 1,
            "newest_at": failed.updated_at.isoformat(),
        }
    ]
    assert "seems nice" not in json.dumps(found), "the model's output is content, never shown"

    (agent,) = found["writers"]
    assert (agent["writer"], agent["applied"], agent["failed"]) == ("agent", 2, 1)
    assert agent["attempts"] == attempts == 2 + failed.attempts
    assert agent["failed_attempts"] == failed.attempts >= 1
    assert agent["error_rate"] == pytest.approx(failed.attempts / (2 + failed.attempts), abs=1e-4)
    assert agent["latency_p50_ms"] is not None
    assert agent["latency_p50_ms"] > 0
    assert agent["apply_lag_p95_s"] > 0

    for name, keys in (("acme", tenant), ("globex", other_tenant)):
        row = tenants[name]
        assert row["audit_unsealed"] == unsealed.get(keys.tenant_id, 0)
        assert row["audit_sealed"] == (row["audit_unsealed"] == 0)
    assert acme["audit_head_seq"] > 0, "the worker's sealer sealed acme's chain while it ran"

    code, screen, err = await memstore_status(status_settings)
    print(screen)  # the screen docs/operations.md shows
    assert code == 0, screen + err
    for shown in ("acme", "globex", "writer error: unparseable", "Workers alive: 0", "agent"):
        assert shown in screen


async def test_status_says_which_source_does_not_answer(status_settings: Settings) -> None:
    unreachable = status_settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    code, out, _ = await memstore_status(unreachable, "--json")
    assert code == 1
    found = json.loads(out)
    assert found["database"] == "ok"
    assert found["redis"].startswith("unreachable")
    assert found["workers_alive"] is None
    assert found["tenants"] == []


def test_tenant_ids_are_strings_in_json() -> None:
    from app.cli.status import Status
    from app.domain.system.repositories import TenantStatus

    row = TenantStatus(uuid.uuid4(), "t", 0, 0, 0.0, 0, 0, 0.0, 2, 3.0, 5)
    shown = Status(window_s=60, tenants=[row]).as_json()
    assert shown["tenants"][0]["tenant_id"] == str(row.tenant_id)
    assert shown["tenants"][0]["audit_sealed"] is False
    assert shown["audit"] == {"unsealed": 2, "oldest_unsealed_age_s": 3.0}
