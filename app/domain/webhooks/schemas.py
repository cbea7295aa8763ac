"""Request and response bodies of `/v1/admin/webhooks`."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from app.db.models import WebhookDelivery, WebhookEndpoint, WebhookEvent
from app.domain.webhooks.signing import message_id

EventType = Literal[
    "memory.added",
    "memory.updated",
    "memory.superseded",
    "memory.deleted",
    "memory.restored",
    "chunk.applied",
    "chunk.failed",
    "review.held",
    "review.decided",
]
# http(s), a host (a name, an IPv4 address, or an IPv6 one in brackets) and an optional port, then a
# path of printable ASCII; no user info. The SSRF guard then checks where the host resolves.
URL_PATTERN = (
    r"^https?://([A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.?|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?(/[\x21-\x7e]*)?$"
)
Url = Annotated[str, msgspec.Meta(min_length=8, max_length=2000, pattern=URL_PATTERN)]
Description = Annotated[str, msgspec.Meta(max_length=200)]
EventTypes = Annotated[list[EventType], msgspec.Meta(max_length=9)]


class CreateWebhookRequest(msgspec.Struct, forbid_unknown_fields=True):
    url: Url
    # The event types to send ([]: all of them).
    event_types: EventTypes = msgspec.field(default_factory=list)
    description: Description | None = None
    # Memory contents in the bodies (otherwise ids, versions and provenance only).
    include_content: bool = False
    enabled: bool = True


class UpdateWebhookRequest(msgspec.Struct, forbid_unknown_fields=True):
    url: Url | msgspec.UnsetType = msgspec.UNSET
    event_types: EventTypes | msgspec.UnsetType = msgspec.UNSET
    description: Description | msgspec.UnsetType | None = msgspec.UNSET
    include_content: bool | msgspec.UnsetType = msgspec.UNSET
    enabled: bool | msgspec.UnsetType = msgspec.UNSET


class WebhookInfo(msgspec.Struct):
    id: uuid.UUID
    url: str
    event_types: list[str]
    description: str | None
    include_content: bool
    enabled: bool
    created_at: datetime
    updated_at: datetime
    # During a rotation's overlap: when the previous secret stops signing.
    previous_secret_expires_at: datetime | None

    @classmethod
    def of(cls, e: WebhookEndpoint) -> WebhookInfo:
        return cls(
            id=e.id,
            url=e.url,
            event_types=list(e.event_types),
            description=e.description,
            include_content=e.include_content,
            enabled=e.enabled,
            created_at=e.created_at,
            updated_at=e.updated_at,
            previous_secret_expires_at=e.previous_secret_expires_at if e.previous_secret else None,
        )


class CreatedWebhook(WebhookInfo, kw_only=True):
    """An endpoint with its signing secret, shown this once."""

    secret: str


class WebhookList(msgspec.Struct):
    items: list[WebhookInfo]


class DeliveryAttempt(msgspec.Struct):
    at: str
    attempt: int
    status: int | None
    error: str | None
    duration_ms: int


class DeliveryInfo(msgspec.Struct):
    id: uuid.UUID
    event_id: uuid.UUID
    webhook_id: str  # the `webhook-id` header of every attempt
    event_type: str
    user_id: str
    status: str  # pending, delivered, failed (given up)
    attempts: int
    next_attempt_at: datetime | None  # when pending
    last_attempt_at: datetime | None
    delivered_at: datetime | None
    response_status: int | None
    last_error: str | None
    log: list[DeliveryAttempt]
    created_at: datetime
    data: dict[str, Any]  # the event's data as the endpoint is sent it

    @classmethod
    def of(cls, d: WebhookDelivery, e: WebhookEvent, data: dict[str, Any]) -> DeliveryInfo:
        return cls(
            id=d.id,
            event_id=e.id,
            webhook_id=message_id(e.id),
            event_type=e.type,
            user_id=d.user_id,
            status=d.status,
            attempts=d.attempts,
            next_attempt_at=d.next_attempt_at if d.status == "pending" else None,
            last_attempt_at=d.last_attempt_at,
            delivered_at=d.delivered_at,
            response_status=d.response_status,
            last_error=d.last_error,
            log=[msgspec.convert(a, DeliveryAttempt) for a in d.log],
            created_at=d.created_at,
            data=data,
        )


class DeliveryList(msgspec.Struct):
    items: list[DeliveryInfo]
    next_cursor: str | None = None
