"""Managing a tenant's webhook endpoints and their delivery log; every change is audited.

A URL is held to the SSRF guard (`ssrf.check_url`) when an endpoint is created and whenever its URL
changes: a 422 naming `url` if it names or resolves to an address webhooks may not reach. The secret
is made here and answered once (creation, rotation); a rotation keeps the previous secret signing for
`MEMSTORE_WEBHOOK_SECRET_OVERLAP_S`, so a receiver can switch without refusing a delivery.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import WebhookDelivery, WebhookEndpoint, WebhookEvent
from app.domain.audit.services import Actor, record_event
from app.domain.webhooks import signing
from app.domain.webhooks.events import redact
from app.domain.webhooks.repositories import DeliveryRepository, EndpointRepository
from app.domain.webhooks.ssrf import AddressPolicy, BlockedAddressError, check_url
from app.lib.errors import InvalidField, NotFoundError


async def checked_url(url: str, policy: AddressPolicy) -> str:
    """`url` if webhooks may reach it; otherwise a 422 naming `url`."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # a port out of range raises here
    except ValueError as exc:
        raise InvalidField(f"url: {exc}", details={"field": "url"}) from exc
    try:
        await check_url(url, policy)
    except BlockedAddressError as exc:
        raise InvalidField(f"url: {exc}", details={"field": "url"}) from exc
    return url


def _summary(endpoint: WebhookEndpoint) -> dict[str, Any]:
    return {
        "url": endpoint.url,
        "event_types": list(endpoint.event_types),
        "include_content": endpoint.include_content,
        "enabled": endpoint.enabled,
    }


async def _audit(session: AsyncSession, endpoint: WebhookEndpoint, who: Actor, action: str) -> None:
    await record_event(
        session,
        tenant_id=endpoint.tenant_id,
        actor=who.actor,
        action=action,
        target_type="webhook",
        target_id=str(endpoint.id),
        request_id=who.request_id,
        summary=_summary(endpoint),
    )


async def create_endpoint(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    *,
    url: str,
    event_types: Sequence[str],
    description: str | None,
    include_content: bool,
    enabled: bool,
    policy: AddressPolicy,
    who: Actor,
) -> tuple[WebhookEndpoint, str]:
    """A new endpoint and its secret (the only time it is answered)."""
    url = await checked_url(url, policy)
    secret = signing.new_secret()
    endpoint = await EndpointRepository(session).add(
        WebhookEndpoint(
            tenant_id=tenant_id,
            url=url,
            event_types=sorted(set(event_types)),
            description=description,
            include_content=include_content,
            enabled=enabled,
            secret=secret,
        )
    )
    await _audit(session, endpoint, who, "webhook.created")
    await session.refresh(endpoint)
    return endpoint, secret


async def get_endpoint(
    session: AsyncSession, tenant_id: uuid.UUID, endpoint_id: uuid.UUID
) -> WebhookEndpoint:
    endpoint = await EndpointRepository(session).get(tenant_id, endpoint_id)
    if endpoint is None:
        raise NotFoundError("No such webhook.")
    return endpoint


async def list_endpoints(session: AsyncSession, tenant_id: uuid.UUID) -> Sequence[WebhookEndpoint]:
    return await EndpointRepository(session).list(tenant_id)


async def update_endpoint(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    endpoint_id: uuid.UUID,
    *,
    changes: dict[str, Any],
    policy: AddressPolicy,
    who: Actor,
) -> WebhookEndpoint:
    endpoint = await get_endpoint(session, tenant_id, endpoint_id)
    if "url" in changes and changes["url"] != endpoint.url:
        changes["url"] = await checked_url(changes["url"], policy)
    if "event_types" in changes:
        changes["event_types"] = sorted(set(changes["event_types"]))
    for name, value in changes.items():
        setattr(endpoint, name, value)
    endpoint.updated_at = datetime.now(UTC)
    await session.flush()
    await _audit(session, endpoint, who, "webhook.updated")
    await session.refresh(endpoint)
    return endpoint


async def rotate_secret(
    session: AsyncSession, tenant_id: uuid.UUID, endpoint_id: uuid.UUID, *, overlap_s: float, who: Actor
) -> tuple[WebhookEndpoint, str]:
    """A new secret; the one it replaces still signs (beside it) for `overlap_s` seconds."""
    endpoint = await get_endpoint(session, tenant_id, endpoint_id)
    now = datetime.now(UTC)
    secret = signing.new_secret()
    endpoint.previous_secret = endpoint.secret if overlap_s > 0 else None
    endpoint.previous_secret_expires_at = now + timedelta(seconds=overlap_s) if overlap_s > 0 else None
    endpoint.secret = secret
    endpoint.updated_at = now
    await session.flush()
    await _audit(session, endpoint, who, "webhook.secret_rotated")
    await session.refresh(endpoint)
    return endpoint, secret


async def delete_endpoint(
    session: AsyncSession, tenant_id: uuid.UUID, endpoint_id: uuid.UUID, *, who: Actor
) -> None:
    """The endpoint and its deliveries (pending ones are never sent)."""
    endpoint = await get_endpoint(session, tenant_id, endpoint_id)
    await _audit(session, endpoint, who, "webhook.deleted")
    await EndpointRepository(session).remove(endpoint)


def _as_sent(endpoint: WebhookEndpoint, event: WebhookEvent) -> dict[str, Any]:
    data: dict[str, Any] = event.data if endpoint.include_content else redact(event.data)
    return data


async def list_deliveries(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    endpoint_id: uuid.UUID,
    *,
    status: str | None,
    limit: int,
    before_seq: int | None,
) -> tuple[WebhookEndpoint, list[tuple[WebhookDelivery, WebhookEvent, dict[str, Any]]], int | None]:
    """A page of the endpoint's deliveries, newest event first, and the cursor after it."""
    endpoint = await get_endpoint(session, tenant_id, endpoint_id)
    rows = await DeliveryRepository(session).list(
        tenant_id, endpoint_id, status=status, limit=limit + 1, before_seq=before_seq
    )
    more = len(rows) > limit
    page = rows[:limit]
    cursor = page[-1][0].event_seq if more and page else None
    return endpoint, [(d, e, _as_sent(endpoint, e)) for d, e in page], cursor


async def redeliver(
    session: AsyncSession, tenant_id: uuid.UUID, endpoint_id: uuid.UUID, delivery_id: uuid.UUID, *, who: Actor
) -> tuple[WebhookDelivery, WebhookEvent, dict[str, Any]]:
    """Send a delivery again (delivered, given up or pending): due now, with a fresh retry schedule."""
    endpoint = await get_endpoint(session, tenant_id, endpoint_id)
    found = await DeliveryRepository(session).get(tenant_id, endpoint_id, delivery_id)
    if found is None:
        raise NotFoundError("No such delivery.")
    delivery, event = found
    await DeliveryRepository(session).redeliver(tenant_id, delivery.id)
    await record_event(
        session,
        tenant_id=tenant_id,
        actor=who.actor,
        action="webhook.redelivered",
        target_type="webhook_delivery",
        target_id=str(delivery.id),
        request_id=who.request_id,
        summary={"webhook_id": str(endpoint_id), "event_id": str(event.id), "event_type": event.type},
    )
    await session.refresh(delivery)
    return delivery, event, _as_sent(endpoint, event)
