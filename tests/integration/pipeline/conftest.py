from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.config import Settings
from app.server.asgi import create_app
from tests.conftest import TenantKeys, bearer
from tests.support.writers import PLUGINS


@pytest.fixture
def pipeline_settings(settings: Settings) -> Settings:
    """Fast sweeps and retries, and the test writers available by name."""
    return settings.model_copy(
        update={
            "sweep_interval_s": 1,
            "sweep_min_age_s": 1.0,
            "retry_backoff_s": 0.05,
            "retry_backoff_max_s": 0.2,
            "max_attempts": 3,
            "writer_plugins": PLUGINS,
            "worker_max_jobs": 16,
        }
    )


@pytest.fixture
async def api(pipeline_settings: Settings) -> AsyncIterator[AsyncTestClient[Litestar]]:
    async with AsyncTestClient(create_app(pipeline_settings, configure_logs=False)) as client:
        yield client


@pytest.fixture
async def ingest_headers(api: AsyncTestClient[Litestar], tenant: TenantKeys) -> dict[str, str]:
    response = await api.post(
        "/v1/admin/keys", json={"name": "app", "roles": ["ingest", "read"]}, headers=tenant.admin
    )
    return bearer(response.json()["key"])
