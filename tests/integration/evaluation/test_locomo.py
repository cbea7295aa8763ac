"""`memstore eval locomo` as an operator runs it, on the first sessions of LoCoMo's first conversation,
with fake read model and judge servers: a writer that stores nothing scores evidence recall 0, one
that stores every turn verbatim scores near 1, and a judge's garbage counts as incorrect, reported."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import Chunk, Tenant
from tests.integration.evaluation.writers import PLUGINS
from tests.support.fake_llm import FakeLLM, Reply
from tests.support.fake_reader import judge_responder, reader_responder
from tests.support.workers import settings_env

LOCOMO = Path(__file__).resolve().parents[4] / "shared" / "data" / "locomo10.json"

pytestmark = pytest.mark.skipif(not LOCOMO.exists(), reason=f"no LoCoMo file at {LOCOMO}")


async def memstore(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "app", *args],
            env=settings_env(settings),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    return await asyncio.to_thread(run)


async def test_locomo_report_tells_a_writer_that_stores_nothing_from_one_that_stores_every_turn(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    async with (
        FakeLLM(responder=reader_responder, model="reader-7b") as reader,
        FakeLLM(responder=judge_responder, model="judge-1") as judge,
    ):
        judge.enqueue(Reply(content="Looks right to me!"))  # no verdict in it
        done = await memstore(
            settings.model_copy(update={"writer_plugins": PLUGINS}),
            "eval",
            "locomo",
            str(LOCOMO),
            "--writers",
            "nothing,verbatim",
            "--conversations",
            "1",
            "--sessions",
            "1-3",
            "--sample",
            "15",
            "--seed",
            "3",
            "--answer-model",
            f"{reader.base_url}|reader-7b",
            "--judge-model",
            f"{judge.base_url}|judge-1",
            "--json",
            str(tmp_path / "report.json"),
            "--markdown",
            str(tmp_path / "report.md"),
            "--plot",
            str(tmp_path / "report.png"),
        )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    nothing, verbatim = report["writers"]["nothing"], report["writers"]["verbatim"]

    # Conversation 1's sessions 1-3: 58 turns in three chunks; of the 20 questions of categories 1-4
    # whose evidence lies in them, the same 15 asked of both banks.
    assert report["dataset"]["conversations"] == ["conv-26"]
    assert report["dataset"]["chunks"] == 3
    assert report["dataset"]["questions"] == 20
    assert report["sample"] == {"size": 15, "of": 20, "seed": 3}
    assert report["questions_asked"] == 15
    assert set(report["categories"]) == {"1", "2", "3", "4"}
    assert nothing["overall"]["n"] == verbatim["overall"]["n"] == 15
    assert nothing["overall"]["evidence_n"] == 15
    asked = [r["id"] for r in report["questions"] if r["writer"] == "nothing"]
    assert asked == [r["id"] for r in report["questions"] if r["writer"] == "verbatim"]

    # The metric can fail: no memory, no evidence; every turn kept, nearly all of it.
    assert nothing["overall"]["evidence_recall"] == 0.0
    assert verbatim["overall"]["evidence_recall"] >= 0.9, verbatim["overall"]
    assert nothing["overall"]["judge_accuracy"] == 0.0
    assert nothing["writer"]["memories"] == 0
    assert nothing["writer"]["applied"] == 3
    assert verbatim["writer"]["applied"] == 3
    assert verbatim["writer"]["memories_per_chunk"] > 15
    assert verbatim["writer"]["tokens_per_chunk"] > 0
    assert verbatim["writer"]["latency_ms_per_chunk"] == 2.5
    assert nothing["writer"]["latency_ms_per_chunk"] is None
    for category in nothing["by_category"].values():
        assert category["evidence_recall"] == 0.0
    assert sum(c["n"] for c in verbatim["by_category"].values()) == 15

    # Same retrieval for both: every question got the same top_k, answered by the same models.
    assert report["protocol"]["top_k"] == 10
    assert report["protocol"]["answer_model"]["model"] == "reader-7b"
    records = report["questions"]
    assert len(records) == 30
    assert all(len(r["memories"]) <= 10 for r in records)
    assert all(r["memories"] == [] for r in records if r["writer"] == "nothing")
    assert len(judge.requests) == 30

    # The judge's garbage: incorrect, kept, counted.
    [garbled] = [r for r in records if not r["judge_parsed"]]
    assert garbled["correct"] is False
    assert garbled["judge_output"] == "Looks right to me!"
    assert nothing["judge"]["unparseable"] + verbatim["judge"]["unparseable"] == 1

    markdown = (tmp_path / "report.md").read_text()
    assert "| writer | n | judge accuracy | token F1 | evidence recall |" in markdown
    assert "| nothing | 15 | 0.0 % |" in markdown
    assert "Questions: 15 of 20 (seed 3)" in markdown
    assert markdown in done.stdout
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "report.png").read_bytes().startswith(b"\x89PNG")
    else:
        assert "matplotlib is not installed" in done.stderr
        assert not (tmp_path / "report.png").exists()

    # Each bank is a tenant of its own; its chunks keep the turn ids and who said what.
    async with sessionmaker() as session:
        banks = (await session.scalars(select(Tenant.name).where(Tenant.name.like("eval-%")))).all()
        assert sorted(b.rsplit("-", 1)[1] for b in banks) == ["nothing", "verbatim"]
        assert {verbatim["tenant"], nothing["tenant"]} == set(banks)
        first = (
            await session.scalars(
                select(Chunk)
                .join(Tenant, Tenant.id == Chunk.tenant_id)
                .where(Tenant.name == verbatim["tenant"])
                .order_by(Chunk.seq)
            )
        ).first()
    assert first is not None
    assert first.user_id == "conv-26"
    assert first.writer == "verbatim"
    assert first.metadata_["turn_ids"][:2] == ["D1:1", "D1:2"]
    assert first.messages[0]["name"] == "Caroline"
    assert first.messages[0]["content"].startswith("Caroline: Hey Mel!")
    assert first.messages[0]["created_at"].startswith("2023-05-08T13:56:00")
