"""Delivery: a receiver down for a while gets everything once it is back, in order, the failed attempts
in the delivery log; a delivery given up stays visible and can be sent again; the SSRF guard refuses
metadata and private addresses when an endpoint is created and again when a delivery connects."""

from __future__ import annotations

from typing import Any

from app.config import Settings
from tests.conftest import TenantKeys
from tests.integration.webhooks.conftest import Client, create_webhook
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import WebhookReceiver
from tests.support.workers import running_worker


async def _fail_a_chunk(api: Client, tenant: TenantKeys, user: str, n: int) -> str:
    """A chunk for the writer that answers garbage: after its attempts, `chunk.failed`."""
    response = await api.post(
        "/v1/chunks",
        json={
            "user_id": user,
            "messages": [{"role": "user", "content": f"message {n}"}],
            "writer": "garbage",
        },
        headers=tenant.admin,
    )
    assert response.status_code == 202, response.text
    chunk_id: str = response.json()["chunk_id"]
    return chunk_id


async def _deliveries(api: Client, tenant: TenantKeys, hook_id: str, **params: Any) -> list[dict[str, Any]]:
    response = await api.get(f"/v1/admin/webhooks/{hook_id}/deliveries", params=params, headers=tenant.admin)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


async def test_a_receiver_down_for_a_while_gets_everything_in_order_once_back(
    api: Client, api_settings: Settings, tenant: TenantKeys, receiver: WebhookReceiver
) -> None:
    hook = await create_webhook(api, tenant, receiver, event_types=["chunk.failed"])
    await receiver.stop()
    async with running_worker(api_settings):
        chunks = [await _fail_a_chunk(api, tenant, "ana", n) for n in range(3)]

        await wait_for(
            lambda: _deliveries(api, tenant, hook["id"]),
            # Two attempts recorded as failed in the log: `attempts` counts one as it starts, and an
            # attempt still in flight when the receiver comes back would succeed as the second.
            lambda items: len(items) == 3 and max(sum(1 for a in d["log"] if a["error"]) for d in items) >= 2,
            timeout_s=30,
            what="the head's second failed attempt recorded (the rest wait behind it)",
        )
        assert receiver.received == []
        await receiver.start()  # back, on the same port
        await receiver.wait_for(3)

        await wait_for(  # the worker records each answer after the receiver has it
            lambda: _deliveries(api, tenant, hook["id"]),
            lambda items: {d["status"] for d in items} == {"delivered"},
            timeout_s=30,
            what="every delivery recorded as delivered",
        )

    assert [d.data["chunk_id"] for d in receiver.received] == chunks  # in order, nothing lost
    items = await _deliveries(api, tenant, hook["id"])
    assert {d["status"] for d in items} == {"delivered"}
    head = next(d for d in items if d["data"]["chunk_id"] == chunks[0])
    assert head["attempts"] >= 3
    assert [a["error"] is None for a in head["log"]][-1] is True
    assert all(a["error"] for a in head["log"][:-1])  # the attempts while it was down
    assert [a["attempt"] for a in head["log"]] == list(range(1, head["attempts"] + 1))
    assert head["webhook_id"] == receiver.received[0].webhook_id  # the same id on every attempt


async def test_given_up_after_the_schedule_then_redelivered(
    api: Client, api_settings: Settings, tenant: TenantKeys, receiver: WebhookReceiver
) -> None:
    settings = api_settings.model_copy(update={"webhook_retry_schedule_s": [0.2]})
    hook = await create_webhook(api, tenant, receiver, event_types=["chunk.failed"])
    receiver.status = 503
    async with running_worker(settings):
        await _fail_a_chunk(api, tenant, "ana", 0)

        await wait_for(
            lambda: _deliveries(api, tenant, hook["id"]),
            lambda items: [d["status"] for d in items] == ["failed"],
            timeout_s=30,
            what="the delivery given up",
        )
        [delivery] = await _deliveries(api, tenant, hook["id"])
        assert delivery["attempts"] == 2
        assert [a["status"] for a in delivery["log"]] == [503, 503]
        assert delivery["last_error"] == "HTTP 503"

        receiver.status = 204
        response = await api.post(
            f"/v1/admin/webhooks/{hook['id']}/deliveries/{delivery['id']}/redeliver", headers=tenant.admin
        )
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "pending"
        [arrived] = await receiver.wait_for(1)

        await wait_for(  # the worker records the answer after the receiver has it
            lambda: _deliveries(api, tenant, hook["id"]),
            lambda items: [d["status"] for d in items] == ["delivered"],
            timeout_s=30,
            what="the redelivery recorded as delivered",
        )
    assert arrived.webhook_id == delivery["webhook_id"]
    [delivery] = await _deliveries(api, tenant, hook["id"])
    assert delivery["status"] == "delivered"
    assert len(delivery["log"]) == 3


async def test_metadata_and_private_addresses_are_refused_at_creation(
    api: Client, tenant: TenantKeys, dns: dict[str, list[str]]
) -> None:
    dns["metadata.example"] = ["169.254.169.254"]
    dns["internal.example"] = ["10.0.0.1"]
    dns["mixed.example"] = ["93.184.215.14", "10.0.0.1"]
    for url in (
        "http://169.254.169.254/latest/meta-data",
        "http://10.0.0.1/hook",
        "http://metadata.example/hook",
        "http://internal.example:8080/hook",
        "http://mixed.example/hook",
        "http://[::ffff:10.0.0.1]/hook",
        "http://nowhere.example/hook",  # does not resolve
    ):
        response = await api.post("/v1/admin/webhooks", json={"url": url}, headers=tenant.admin)
        assert response.status_code == 422, (url, response.text)
        assert response.json()["error"]["details"]["field"] == "url", url
    for body in ({"url": "ftp://example.com/x"}, {"url": "http://user@example.com/"}, {"url": 3}, {}):
        response = await api.post("/v1/admin/webhooks", json=body, headers=tenant.admin)
        assert response.status_code in (400, 422), (body, response.text)
    assert (await api.get("/v1/admin/webhooks", headers=tenant.admin)).json()["items"] == []


async def test_a_name_that_resolves_elsewhere_at_delivery_is_refused_then(
    api: Client,
    api_settings: Settings,
    tenant: TenantKeys,
    receiver: WebhookReceiver,
    dns: dict[str, list[str]],
) -> None:
    dns["hooks.example"] = ["127.0.0.1"]  # allowed (127.0.0.0/8) when created
    hook = await create_webhook(api, tenant, receiver, event_types=["chunk.failed"])
    response = await api.patch(
        f"/v1/admin/webhooks/{hook['id']}",
        json={"url": f"http://hooks.example:{receiver.port}/hooks"},
        headers=tenant.admin,
    )
    assert response.status_code == 200, response.text
    response = await api.patch(
        f"/v1/admin/webhooks/{hook['id']}", json={"url": "http://169.254.169.254/"}, headers=tenant.admin
    )
    assert response.status_code == 422, response.text
    dns["hooks.example"] = ["10.0.0.1"]  # rebinding: now a private address
    async with running_worker(api_settings):
        await _fail_a_chunk(api, tenant, "ana", 0)

        await wait_for(
            lambda: _deliveries(api, tenant, hook["id"]),
            lambda items: bool(items) and items[0]["attempts"] >= 1 and items[0]["last_error"] is not None,
            timeout_s=30,
            what="a refused attempt in the delivery log",
        )
    [delivery] = await _deliveries(api, tenant, hook["id"])
    assert delivery["last_error"].startswith("blocked:"), delivery
    assert "10.0.0.1" in delivery["last_error"]
    assert receiver.received == []


async def test_endpoints_are_managed_and_secrets_rotate_with_overlap(
    api: Client,
    api_settings: Settings,
    tenant: TenantKeys,
    other_tenant: TenantKeys,
    receiver: WebhookReceiver,
) -> None:
    hook = await create_webhook(api, tenant, receiver, event_types=["chunk.failed"], description="ops")
    assert (await api.get(f"/v1/admin/webhooks/{hook['id']}", headers=other_tenant.admin)).status_code == 404
    response = await api.patch(
        f"/v1/admin/webhooks/{hook['id']}", json={"enabled": False, "event_types": []}, headers=tenant.admin
    )
    assert response.status_code == 200, response.text
    assert response.json()["enabled"] is False
    assert response.json()["event_types"] == []

    response = await api.post(f"/v1/admin/webhooks/{hook['id']}/rotate-secret", headers=tenant.admin)
    assert response.status_code == 201, response.text
    rotated = response.json()
    assert rotated["secret"] != hook["secret"]
    assert rotated["previous_secret_expires_at"] is not None
    await api.patch(f"/v1/admin/webhooks/{hook['id']}", json={"enabled": True}, headers=tenant.admin)

    # During the overlap a receiver still holding the old secret verifies, and one with the new does too.
    async with running_worker(api_settings):
        await _fail_a_chunk(api, tenant, "ana", 0)
        await receiver.wait_for(1)  # the old secret (set by create_webhook)
        receiver.secret = rotated["secret"]
        await _fail_a_chunk(api, tenant, "ana", 1)
        await receiver.wait_for(2)
    assert receiver.refused == []

    response = await api.delete(f"/v1/admin/webhooks/{hook['id']}", headers=tenant.admin)
    assert response.status_code == 204, response.text
    assert (await api.get(f"/v1/admin/webhooks/{hook['id']}", headers=tenant.admin)).status_code == 404
    assert (
        await api.get(f"/v1/admin/webhooks/{hook['id']}/deliveries", headers=tenant.admin)
    ).status_code == 404


async def test_a_purge_erases_the_users_events_and_pending_deliveries(
    api: Client, api_settings: Settings, tenant: TenantKeys, receiver: WebhookReceiver
) -> None:
    hook = await create_webhook(api, tenant, receiver, event_types=["chunk.failed"], include_content=True)
    await receiver.stop()
    async with running_worker(api_settings):
        await _fail_a_chunk(api, tenant, "ana", 0)
        await _fail_a_chunk(api, tenant, "bo", 0)

        await wait_for(
            lambda: _deliveries(api, tenant, hook["id"], status="pending"),
            lambda items: len(items) == 2,
            timeout_s=30,
            what="both users' deliveries pending",
        )
    # Purged with the worker stopped: the in-process test client's request holds this event loop until
    # it answers, and a purge waits for the row locks of a delivery the worker (in the same loop) may
    # be claiming at that moment.
    response = await api.delete("/v1/admin/users/ana", params={"purge": "true"}, headers=tenant.admin)
    assert response.status_code == 200, response.text
    items = await _deliveries(api, tenant, hook["id"])
    assert [d["user_id"] for d in items] == ["bo"]
