"""Shadow writers against fake model servers, through the real API and real workers."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from app.config import Settings
from tests.conftest import FAST_WORKERS, writers_toml
from tests.support.fake_llm import FakeLLM, Reply


def said(body: dict[str, Any]) -> list[str]:
    """The new user messages of a `simple` profile prompt."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    new = user.split("NEW MESSAGES", 1)[-1]
    return [m.group(1).strip() for m in re.finditer(r"user(?: \([^)]*\))?: (.*)", new)]


def scripted(answer: Callable[[str], list[str]]) -> Callable[[dict[str, Any]], Reply]:
    """A `simple`-profile model whose memories for each user message are `answer(message)`."""

    def respond(body: dict[str, Any]) -> Reply:
        return Reply.json({"memories": [m for text in said(body) for m in answer(text)]})

    return respond


# The primary stores each fact as it is said. The trial writer agrees on F1 and F2, words F3 otherwise
# (a memory the primary lacks, and the other way round), and stores nothing for F4.
FACTS = {
    "F1": "The user lives in Lyon.",
    "F2": "The user is vegetarian.",
    "F3": "The user plays chess on weekends.",
    "F4": "The user works as a nurse.",
}


def primary_answer(text: str) -> list[str]:
    return [FACTS[key] for key in FACTS if key in text]


def trial_answer(text: str) -> list[str]:
    if "F3" in text:
        return ["Knitting sweaters is a favourite hobby."]
    if "F4" in text:
        return []
    return primary_answer(text)


@pytest.fixture
async def primary_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM(responder=scripted(primary_answer)) as fake:
        yield fake


@pytest.fixture
async def trial_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM(responder=scripted(trial_answer)) as fake:
        yield fake


@pytest.fixture
async def broken_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM(responder=lambda body: Reply(status=500)) as fake:
        yield fake


@pytest.fixture
async def slow_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM(responder=scripted(primary_answer), latency_s=20.0) as fake:
        yield fake


@pytest.fixture
def writers_file(
    tmp_path: Path, primary_llm: FakeLLM, trial_llm: FakeLLM, broken_llm: FakeLLM, slow_llm: FakeLLM
) -> Path:
    path = tmp_path / "writers.toml"
    servers = {"primary": primary_llm, "trial": trial_llm, "broken": broken_llm, "slow": slow_llm}
    writers = {
        name: {
            "profile": "simple",
            "base_url": fake.base_url,
            "model": f"{name}-model",
            "timeout_s": 40.0 if name == "slow" else 2.0,
            "max_retries": 0,
        }
        for name, fake in servers.items()
    }
    path.write_text(writers_toml(writers))
    return path


@pytest.fixture
def shadow_settings(settings: Settings, writers_file: Path) -> Settings:
    return settings.model_copy(
        update={
            **FAST_WORKERS,
            "writers_file": writers_file,
            "writer": "primary",
            "max_attempts": 2,
            "writer_timeout_s": 30.0,
            "worker_shutdown_wait_s": 31.0,
            "worker_max_jobs": 8,
            "shadow_max_jobs": 4,
        }
    )


@pytest.fixture
def api_settings(shadow_settings: Settings) -> Settings:
    return shadow_settings
