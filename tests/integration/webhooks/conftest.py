"""Webhooks against a real API, a real worker and a receiver on 127.0.0.1 that verifies signatures.

Name resolution is stubbed for every test here (`ssrf.resolve`): a name resolves to what `dns` says, or
not at all, so no test sends a packet outside the loopback range. The receiver is reached through
`MEMSTORE_WEBHOOK_ALLOWED_HOSTS` (127.0.0.0/8), and retries come fast.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.config import Settings
from app.domain.webhooks import ssrf
from tests.conftest import FAST_WORKERS, TenantKeys, writers_toml
from tests.support.fake_llm import FakeLLM, Reply
from tests.support.webhook_receiver import WebhookReceiver

Client = AsyncTestClient[Litestar]
FAST_RETRIES = [0.3, 0.3, 0.3, 0.3, 0.3]


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Host name -> the addresses it resolves to, for this test; any other name does not resolve."""
    table: dict[str, list[str]] = {"localhost": ["127.0.0.1"]}

    async def resolve(host: str, port: int) -> list[str]:
        del port
        if host not in table:
            raise OSError(f"stubbed resolver: {host} is not in the test's table")
        return list(table[host])

    monkeypatch.setattr(ssrf, "resolve", resolve)
    return table


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    hook = WebhookReceiver()
    await hook.start()
    try:
        yield hook
    finally:
        await hook.stop()


@pytest.fixture
async def garbage_model() -> AsyncIterator[FakeLLM]:
    """A model that answers no protocol at all: its chunks fail."""

    def garbage(body: dict[str, Any]) -> Reply:
        del body
        return Reply(content="<<< not a memory protocol, not JSON >>>")

    async with FakeLLM(responder=garbage) as fake:
        yield fake


@pytest.fixture
def api_settings(
    settings: Settings, tmp_path: Path, garbage_model: FakeLLM, dns: dict[str, list[str]]
) -> Settings:
    del dns  # resolution stubbed before anything resolves
    writers = tmp_path / "writers.toml"
    writers.write_text(
        writers_toml({"garbage": {"profile": "mem0", "base_url": garbage_model.base_url, "model": "junk"}})
    )
    return settings.model_copy(
        update={
            **FAST_WORKERS,
            "writers_file": writers,
            "max_attempts": 2,
            "webhook_allowed_hosts": ["127.0.0.0/8"],
            "webhook_retry_schedule_s": FAST_RETRIES,
            "webhook_timeout_s": 2.0,
            "graph_index_budget_s": 0.0,
        }
    )


async def create_webhook(
    api: Client, tenant: TenantKeys, receiver: WebhookReceiver, **fields: Any
) -> dict[str, Any]:
    response = await api.post(
        "/v1/admin/webhooks", json={"url": receiver.url, **fields}, headers=tenant.admin
    )
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    receiver.secret = created["secret"]
    return created
