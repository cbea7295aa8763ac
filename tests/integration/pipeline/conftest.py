from __future__ import annotations

import pytest

from app.config import Settings
from tests.conftest import FAST_WORKERS
from tests.support.writers import PLUGINS


@pytest.fixture
def pipeline_settings(settings: Settings) -> Settings:
    """Fast sweeps and retries, and the test writers available by name."""
    return settings.model_copy(
        update={**FAST_WORKERS, "max_attempts": 3, "writer_plugins": PLUGINS, "worker_max_jobs": 16}
    )


@pytest.fixture
def api_settings(pipeline_settings: Settings) -> Settings:
    return pipeline_settings
