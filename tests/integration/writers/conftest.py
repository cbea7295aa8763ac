"""LLM writers against the fake model server, through the real API and real workers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.config import Settings
from app.server.asgi import create_app
from tests.conftest import TenantKeys, bearer
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
    path.write_text(
        "\n".join(
            f'[writers.{name}]\nprofile = "{profile}"\nbase_url = "{fake_llm.base_url}"\n'
            'model = "hy-memory"\ntimeout_s = 1.0\nmax_retries = 1\n'
            for name, profile in PROFILES.items()
        )
    )
    return path


@pytest.fixture
def llm_settings(settings: Settings, writers_file: Path) -> Settings:
    return settings.model_copy(
        update={
            "writers_file": writers_file,
            "sweep_interval_s": 1,
            "sweep_min_age_s": 1.0,
            "retry_backoff_s": 0.05,
            "retry_backoff_max_s": 0.2,
            "max_attempts": 3,
            "writer_timeout_s": 5.0,
            "worker_max_jobs": 16,
        }
    )


@pytest.fixture
async def api(llm_settings: Settings) -> AsyncIterator[AsyncTestClient[Litestar]]:
    async with AsyncTestClient(create_app(llm_settings, configure_logs=False)) as client:
        yield client


@pytest.fixture
async def ingest_headers(api: AsyncTestClient[Litestar], tenant: TenantKeys) -> dict[str, str]:
    response = await api.post(
        "/v1/admin/keys", json={"name": "app", "roles": ["ingest", "read"]}, headers=tenant.admin
    )
    return bearer(response.json()["key"])
