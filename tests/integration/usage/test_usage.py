"""What each tenant's writes cost: the tenant's own report over the API, every tenant's for an operator
(`memstore usage`), and the operator's `memstore tenants set` of a tenant's writer share."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from tests.conftest import TenantKeys, writers_toml
from tests.support.fake_llm import FakeLLM
from tests.support.workers import running_worker, settings_env, wait_for_chunks

Client = AsyncTestClient[Litestar]


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        yield fake


@pytest.fixture
def api_settings(settings: Settings, fake_llm: FakeLLM, tmp_path: Path) -> Settings:
    writers = tmp_path / "writers.toml"
    writers.write_text(
        writers_toml({"model": {"profile": "simple", "base_url": fake_llm.base_url, "model": "hy-memory"}})
    )
    return settings.model_copy(update={"writers_file": writers})


async def memstore(settings: Settings, *args: str) -> tuple[int, str, str]:
    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "app", *args],
            env=settings_env(settings),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = await asyncio.to_thread(run)
    return done.returncode, done.stdout, done.stderr


async def say(api: Client, tenant: TenantKeys, user: str, text: str, writer: str) -> None:
    body = {"user_id": user, "messages": [{"role": "user", "content": text}], "writer": writer}
    response = await api.post("/v1/chunks", json=body, headers=tenant.admin)
    assert response.status_code == 202, response.text


async def test_usage_sums_the_changesets_by_day_user_and_writer_per_tenant(
    api: Client,
    api_settings: Settings,
    fake_llm: FakeLLM,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
    other_tenant: TenantKeys,
) -> None:
    async with running_worker(api_settings):
        await say(api, tenant, "ann", "I live in Oslo.", "model")
        await say(api, tenant, "ann", "I like tea.", "model")
        await say(api, tenant, "bob", "I play chess.", "offline")
        await say(api, other_tenant, "cid", "I own a boat.", "model")
        await wait_for_chunks(sessionmaker, tenant.tenant_id, 3, timeout_s=30)
        await wait_for_chunks(sessionmaker, other_tenant.tenant_id, 1, timeout_s=30)
    served = fake_llm.usage["-"]  # every call the model answered, both tenants'

    response = await api.get("/v1/admin/usage", params={"group_by": ["user", "writer"]}, headers=tenant.admin)
    assert response.status_code == 200, response.text
    report = response.json()
    rows = {(r["user_id"], r["writer"]): r for r in report["items"]}
    assert set(rows) == {("ann", "model"), ("bob", "offline")}
    ann, bob = rows[("ann", "model")], rows[("bob", "offline")]
    assert (ann["chunks_applied"], ann["model_calls"]) == (2, 2)
    assert (bob["chunks_applied"], bob["model_calls"], bob["prompt_tokens"]) == (1, 0, 0)
    assert ann["embedder_texts"] >= 2  # each chunk's memory embedded for its apply
    assert report["total"]["chunks_applied"] == 3
    assert report["daily_token_budget"] is None
    assert report["tokens_today"] == ann["prompt_tokens"] + ann["completion_tokens"] > 0
    # Exact: the other tenant's call is in neither; both together are what the model server counted.
    assert report["total"]["prompt_tokens"] < served["prompt_tokens"]

    code, out, err = await memstore(api_settings, "usage", "--json", "--by", "writer")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    by_tenant: dict[str, dict[str, Any]] = {}
    for line in lines:
        by_tenant.setdefault(line["tenant"], {})[line["writer"]] = line
    assert set(by_tenant) == {"acme", "globex"}
    assert by_tenant["acme"]["model"]["chunks_applied"] == 2
    assert by_tenant["globex"]["model"]["chunks_applied"] == 1
    assert sum(r["prompt_tokens"] for r in lines) == served["prompt_tokens"]
    assert sum(r["completion_tokens"] for r in lines) == served["completion_tokens"]


async def test_an_unknown_group_is_refused_naming_it_and_an_empty_window_sums_nothing(
    api: Client, tenant: TenantKeys
) -> None:
    response = await api.get("/v1/admin/usage", params={"group_by": "tenant"}, headers=tenant.admin)
    assert response.status_code == 422, response.text
    assert "group_by" in response.text
    params = {"since": "2026-12-09", "until": "2026-12-01"}
    response = await api.get("/v1/admin/usage", params=params, headers=tenant.admin)
    assert response.status_code == 200, response.text
    assert response.json()["items"] == []
    assert response.json()["total"]["chunks_applied"] == 0


async def test_an_operator_sets_a_tenants_writer_share_past_what_its_admin_may(
    api: Client, api_settings: Settings, tenant: TenantKeys
) -> None:
    response = await api.patch("/v1/admin/settings", json={"write_weight": 3}, headers=tenant.admin)
    assert response.status_code == 422, response.text  # past MEMSTORE_TENANT_WRITE_WEIGHT_MAX (1)
    code, out, err = await memstore(
        api_settings,
        "tenants",
        "set",
        "acme",
        "--write-weight",
        "3",
        "--max-writer-concurrency",
        "8",
        "--daily-token-budget",
        "5000",
    )
    assert code == 0, err
    printed = json.loads(out)
    assert (printed["write_weight"], printed["max_writer_concurrency"], printed["daily_token_budget"]) == (
        3.0,
        8,
        5000,
    )
    shown = (await api.get("/v1/admin/settings", headers=tenant.admin)).json()
    assert (shown["write_weight"], shown["max_writer_concurrency"], shown["daily_token_budget"]) == (
        3.0,
        8,
        5000,
    )
    code, _, err = await memstore(api_settings, "tenants", "set", "nobody", "--write-weight", "2")
    assert code == 1
    assert "nobody" in err
