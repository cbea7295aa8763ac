"""The SDK's webhook calls against a live API and worker, and the SSRF guard's address policy."""

from __future__ import annotations

import pytest
from memstore_client import AsyncClient, MemstoreError, models

from app.config import Settings
from app.domain.webhooks.ssrf import AddressPolicy, BlockedAddressError
from tests.conftest import TenantKeys
from tests.support.live import live_api
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import WebhookReceiver
from tests.support.workers import running_worker


async def test_the_sdk_manages_webhooks_and_reads_the_delivery_log(
    api_settings: Settings, tenant: TenantKeys, receiver: WebhookReceiver
) -> None:
    async with (
        live_api(api_settings) as url,
        running_worker(api_settings),
        AsyncClient(url, tenant.admin_key) as memstore,
    ):
        created = await memstore.create_webhook(receiver.url, event_types=["chunk.failed"])
        assert isinstance(created, models.NewWebhook)
        receiver.secret = created.secret
        assert [w.id for w in await memstore.list_webhooks()] == [created.id]
        with pytest.raises(MemstoreError) as refused:
            await memstore.create_webhook("http://169.254.169.254/latest")
        assert (refused.value.status, refused.value.code) == (422, "validation_error")

        accepted = await memstore.add_chunk("ana", [{"role": "user", "content": "hi"}], writer="garbage")
        await receiver.wait_for(1)

        async def deliveries() -> list[models.WebhookDelivery]:
            return [d async for d in memstore.iter_webhook_deliveries(created.id)]

        # The receiver has the request before the worker records its answer: until the log says so.
        [delivery] = await wait_for(
            deliveries,
            lambda seen: [d.status for d in seen] == ["delivered"],
            timeout_s=15,
            what="the delivery recorded as delivered",
        )
        assert delivery.data["chunk_id"] == str(accepted.chunk_id)
        again = await memstore.redeliver_webhook(created.id, delivery.id)
        assert again.status == "pending"
        await receiver.wait_for(2)
        assert receiver.received[0].webhook_id == receiver.received[1].webhook_id  # the same event

        rotated = await memstore.rotate_webhook_secret(created.id)
        assert rotated.secret != created.secret
        updated = await memstore.update_webhook(created.id, enabled=False, description="paused")
        assert (updated.enabled, updated.description) == (False, "paused")
        await memstore.delete_webhook(created.id)
        assert await memstore.list_webhooks() == []


def test_the_address_policy() -> None:
    policy = AddressPolicy.of(["10.1.0.0/16", "hooks.internal", "127.0.0.1"])
    assert policy.allows_address("93.184.215.14")
    assert policy.allows_address("10.1.2.3")
    assert policy.allows_address("127.0.0.1")
    for address in (
        "10.0.0.1",
        "169.254.169.254",
        "127.0.0.2",
        "192.168.1.1",
        "100.64.0.1",
        "0.0.0.0",
        "::1",
        "fe80::1",
        "fd00:ec2::254",
        "::ffff:10.0.0.1",
        "224.0.0.1",
    ):
        assert not policy.allows_address(address), address
    policy.check_addresses("hooks.internal", ["10.9.9.9"])  # the host itself is allowed
    with pytest.raises(BlockedAddressError):
        policy.check_addresses("example.com", ["93.184.215.14", "10.0.0.1"])  # one bad address is enough
    with pytest.raises(BlockedAddressError):
        policy.check_addresses("example.com", [])
