"""LLM writers against the fake model server, through the real API and real workers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.config import Settings
from tests.conftest import FAST_WORKERS, writers_toml
from tests.support.fake_llm import FakeLLM

PROFILES = {"hy": "hy-memory", "mem0": "mem0", "mem0v3": "mem0-v3", "simple": "simple", "memos": "memos"}


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        yield fake


@pytest.fixture
def writers_file(tmp_path: Path, fake_llm: FakeLLM) -> Path:
    """One named writer per profile, all pointed at the fake server."""
    path = tmp_path / "writers.toml"
    fields = {"base_url": fake_llm.base_url, "model": "hy-memory", "timeout_s": 1.0, "max_retries": 1}
    path.write_text(
        writers_toml({name: {"profile": profile, **fields} for name, profile in PROFILES.items()})
    )
    return path


@pytest.fixture
def llm_settings(settings: Settings, writers_file: Path) -> Settings:
    return settings.model_copy(
        update={
            **FAST_WORKERS,
            "writers_file": writers_file,
            "max_attempts": 3,
            "writer_timeout_s": 5.0,
            "worker_max_jobs": 16,
        }
    )


@pytest.fixture
def api_settings(llm_settings: Settings) -> Settings:
    return llm_settings
