"""A stopping worker waits out the writer calls in flight, so a rolling deploy cuts none off (one
that is cut off anyway gives its attempt back: see test_chunk_faults)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.config import Settings
from workers.settings import worker_options


def test_the_shutdown_wait_covers_a_writer_call() -> None:
    assert worker_options(Settings())["job_completion_wait"] > Settings().writer_timeout_s
    slow = Settings(writer_timeout_s=120)
    assert worker_options(slow)["job_completion_wait"] > 120
    with pytest.raises(ValidationError, match="MEMSTORE_WORKER_SHUTDOWN_WAIT_S"):
        Settings(worker_shutdown_wait_s=20, writer_timeout_s=60)
    assert Settings(worker_shutdown_wait_s=90).worker_shutdown_wait_s == 90
