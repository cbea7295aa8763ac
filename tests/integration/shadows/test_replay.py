"""`memstore replay` and `memstore writers compare` on LoCoMo conversation 1, through the real CLI."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.domain.shadows.services import replay_bank_name
from tests.conftest import TenantKeys
from tests.integration.shadows.conftest import said
from tests.support.fake_llm import FakeLLM, Reply
from tests.support.workers import chunk_counts, settings_env

LOCOMO = Path(__file__).resolve().parents[4] / "shared" / "data" / "locomo10.json"
Client = AsyncTestClient[Litestar]


def every_line(body: dict[str, Any]) -> Reply:
    return Reply.json({"memories": [f"The user said: {s}" for s in said(body)]})


def long_lines(body: dict[str, Any]) -> Reply:
    return Reply.json({"memories": [f"The user said: {s}" for s in said(body) if len(s) > 80]})


@pytest.fixture
async def full_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM(responder=every_line) as fake:
        yield fake


@pytest.fixture
async def terse_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM(responder=long_lines) as fake:
        yield fake


@pytest.fixture
def replay_settings(settings: Settings, tmp_path: Path, full_llm: FakeLLM, terse_llm: FakeLLM) -> Settings:
    path = tmp_path / "writers.toml"
    path.write_text(
        "\n".join(
            f'[writers.{name}]\nprofile = "simple"\nbase_url = "{fake.base_url}"\nmodel = "{name}-model"\n'
            for name, fake in (("full", full_llm), ("terse", terse_llm))
        )
    )
    return settings.model_copy(update={"writers_file": path})


async def memstore(settings: Settings, *args: str) -> str:
    """Run the `memstore` command; the fake model servers keep serving from this event loop meanwhile."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        *args,
        env=settings_env(settings) | {"MEMSTORE_LOG_LEVEL": "WARNING"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 240)
    assert process.returncode == 0, out.decode()
    return out.decode()


async def post_conversation(client: Client, headers: dict[str, str]) -> int:
    conversation = json.loads(LOCOMO.read_text())[0]["conversation"]
    speaker = conversation["speaker_a"]
    sessions = sorted(
        (k for k in conversation if k.startswith("session_") and not k.endswith("date_time")),
        key=lambda k: int(k.split("_")[1]),
    )
    chunks = [
        {
            "user_id": speaker.lower(),
            "messages": [
                {
                    "role": "user" if turn["speaker"] == speaker else "assistant",
                    "name": turn["speaker"],
                    "content": turn["text"],
                }
                for turn in conversation[key]
            ],
        }
        for key in sessions
    ]
    response = await client.post("/v1/chunks/batch", json={"chunks": chunks}, headers=headers)
    assert response.status_code == 202, response.text
    return len(chunks)


@pytest.mark.skipif(not LOCOMO.exists(), reason="LoCoMo is not beside the repository")
async def test_a_replay_through_two_writers_is_compared_and_resumes_adding_nothing(
    client: Client,
    tenant: TenantKeys,
    replay_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    full_llm: FakeLLM,
    terse_llm: FakeLLM,
    tmp_path: Path,
) -> None:
    sessions = await post_conversation(client, tenant.admin)
    banks = {}
    for writer in ("full", "terse"):
        out = await memstore(replay_settings, "replay", "--writer", writer, "--tenant", "acme")
        banks[writer] = replay_bank_name(writer, None, None, None)
        assert f"bank {banks[writer]}: {sessions} chunks" in out
        assert f"{sessions} applied, 0 failed, 0 pending" in out
    assert len(full_llm.requests) == len(terse_llm.requests) == sessions

    report_path = tmp_path / "report.json"
    markdown = await memstore(
        replay_settings,
        "writers",
        "compare",
        "--a",
        banks["full"],
        "--b",
        banks["terse"],
        "--tenant",
        "acme",
        "--json",
        str(report_path),
    )
    report = json.loads(report_path.read_text())["tenant"]
    assert (report["chunks"], report["both_applied"]) == (sessions, sessions)
    stored = {side: report[side]["active_memories"] for side in ("a", "b")}
    # The terse writer keeps only the long lines: everything it stored, the full writer stored too.
    assert 0 < stored["b"] < stored["a"]
    assert report["memories"]["matched"] == stored["b"]
    assert report["memories"]["only_a"] == stored["a"] - stored["b"]
    assert report["memories"]["only_b"] == 0
    assert report["a"]["memories_per_chunk"] == round(report["a"]["ops"]["ADD"] / sessions, 4)
    assert f"# {banks['full']} vs {banks['terse']}" in markdown

    # The same replay again: nothing is fed twice, no model is called, the bank is as it was.
    out = await memstore(replay_settings, "replay", "--writer", "full", "--tenant", "acme")
    assert f"bank {banks['full']}: {sessions} chunks (0 users given new chunks this run)" in out
    assert len(full_llm.requests) == sessions
    # The tenant's own chunks were only read.
    assert await chunk_counts(sessionmaker, tenant.tenant_id) == {"queued": sessions}
