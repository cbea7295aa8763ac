"""`/v1/admin/webhooks`: endpoints (create answers the secret once; rotate a new one), and each one's
delivery log with redelivery."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import msgspec
from litestar import Controller, Response, delete, get, patch, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED, HTTP_204_NO_CONTENT
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.db.models import WebhookEndpoint
from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Caller
from app.domain.audit.services import Actor
from app.domain.webhooks import services
from app.domain.webhooks.schemas import (
    CreatedWebhook,
    CreateWebhookRequest,
    DeliveryInfo,
    DeliveryList,
    UpdateWebhookRequest,
    WebhookInfo,
    WebhookList,
)
from app.domain.webhooks.ssrf import AddressPolicy
from app.lib.errors import InvalidField, NotFoundError, error_responses
from app.lib.params import Limit

SeqCursor = Annotated[
    str | None,
    QueryParameter(pattern="^[0-9]{1,18}$", description="The `next_cursor` of the page before."),
]


def _who(caller: Caller) -> Actor:
    return Actor(actor=caller.actor, request_id=caller.request_id)


def _created(endpoint: WebhookEndpoint, secret: str) -> CreatedWebhook:
    info = WebhookInfo.of(endpoint)
    return CreatedWebhook(**{f: getattr(info, f) for f in info.__struct_fields__}, secret=secret)


class WebhookController(Controller):
    path = "/v1/admin/webhooks"
    tags = ["admin"]
    guards = [requires_role("admin")]

    @post(
        "/",
        status_code=HTTP_201_CREATED,
        summary="Create a webhook endpoint (its signing secret is returned once)",
        responses=error_responses(InvalidField),
    )
    async def create_webhook(
        self,
        data: JSONBody[CreateWebhookRequest],
        db_session: NamedDependency[AsyncSession],
        caller: NamedDependency[Caller],
        settings: NamedDependency[Settings],
    ) -> CreatedWebhook:
        endpoint, secret = await services.create_endpoint(
            db_session,
            caller.tenant_id,
            url=data.url,
            event_types=data.event_types,
            description=data.description,
            include_content=data.include_content,
            enabled=data.enabled,
            policy=AddressPolicy.of(settings.webhook_allowed_hosts),
            who=_who(caller),
        )
        return _created(endpoint, secret)

    @get("/", summary="List the tenant's webhook endpoints (never their secrets)")
    async def list_webhooks(
        self, db_session: NamedDependency[AsyncSession], caller: NamedDependency[Caller]
    ) -> WebhookList:
        return WebhookList(
            items=[WebhookInfo.of(e) for e in await services.list_endpoints(db_session, caller.tenant_id)]
        )

    @get("/{webhook_id:uuid}", summary="One webhook endpoint", responses=error_responses(NotFoundError))
    async def get_webhook(
        self,
        webhook_id: FromPath[uuid.UUID],
        db_session: NamedDependency[AsyncSession],
        caller: NamedDependency[Caller],
    ) -> WebhookInfo:
        return WebhookInfo.of(await services.get_endpoint(db_session, caller.tenant_id, webhook_id))

    @patch(
        "/{webhook_id:uuid}",
        summary="Change a webhook endpoint's URL, event types, content opt-in or enabled flag",
        responses=error_responses(NotFoundError, InvalidField),
    )
    async def update_webhook(
        self,
        webhook_id: FromPath[uuid.UUID],
        data: JSONBody[UpdateWebhookRequest],
        db_session: NamedDependency[AsyncSession],
        caller: NamedDependency[Caller],
        settings: NamedDependency[Settings],
    ) -> WebhookInfo:
        changes: dict[str, Any] = {
            name: getattr(data, name)
            for name in data.__struct_fields__
            if getattr(data, name) is not msgspec.UNSET
        }
        endpoint = await services.update_endpoint(
            db_session,
            caller.tenant_id,
            webhook_id,
            changes=changes,
            policy=AddressPolicy.of(settings.webhook_allowed_hosts),
            who=_who(caller),
        )
        return WebhookInfo.of(endpoint)

    @post(
        "/{webhook_id:uuid}/rotate-secret",
        status_code=HTTP_201_CREATED,
        summary="A new signing secret (returned once); the previous one still signs during the overlap",
        responses=error_responses(NotFoundError),
    )
    async def rotate_webhook_secret(
        self,
        webhook_id: FromPath[uuid.UUID],
        db_session: NamedDependency[AsyncSession],
        caller: NamedDependency[Caller],
        settings: NamedDependency[Settings],
    ) -> CreatedWebhook:
        endpoint, secret = await services.rotate_secret(
            db_session,
            caller.tenant_id,
            webhook_id,
            overlap_s=settings.webhook_secret_overlap_s,
            who=_who(caller),
        )
        return _created(endpoint, secret)

    @delete(
        "/{webhook_id:uuid}",
        status_code=HTTP_204_NO_CONTENT,
        summary="Delete a webhook endpoint and its delivery log",
        responses=error_responses(NotFoundError),
    )
    async def delete_webhook(
        self,
        webhook_id: FromPath[uuid.UUID],
        db_session: NamedDependency[AsyncSession],
        caller: NamedDependency[Caller],
    ) -> Response[None]:
        await services.delete_endpoint(db_session, caller.tenant_id, webhook_id, who=_who(caller))
        return Response(None, status_code=HTTP_204_NO_CONTENT)

    @get(
        "/{webhook_id:uuid}/deliveries",
        summary="The endpoint's deliveries, newest event first, with every attempt",
        responses=error_responses(NotFoundError, InvalidField),
    )
    async def list_webhook_deliveries(
        self,
        webhook_id: FromPath[uuid.UUID],
        db_session: NamedDependency[AsyncSession],
        caller: NamedDependency[Caller],
        status: Annotated[Literal["pending", "delivered", "failed", "all"], QueryParameter()] = "all",
        limit: Limit = 100,
        cursor: SeqCursor = None,
    ) -> DeliveryList:
        _, rows, after = await services.list_deliveries(
            db_session,
            caller.tenant_id,
            webhook_id,
            status=None if status == "all" else status,
            limit=limit,
            before_seq=int(cursor) if cursor else None,
        )
        return DeliveryList(
            items=[DeliveryInfo.of(d, e, data) for d, e, data in rows],
            next_cursor=None if after is None else str(after),
        )

    @post(
        "/{webhook_id:uuid}/deliveries/{delivery_id:uuid}/redeliver",
        status_code=HTTP_200_OK,
        summary="Send a delivery again, now, with a fresh retry schedule",
        responses=error_responses(NotFoundError),
    )
    async def redeliver_webhook_delivery(
        self,
        webhook_id: FromPath[uuid.UUID],
        delivery_id: FromPath[uuid.UUID],
        db_session: NamedDependency[AsyncSession],
        caller: NamedDependency[Caller],
    ) -> DeliveryInfo:
        delivery, event, data = await services.redeliver(
            db_session, caller.tenant_id, webhook_id, delivery_id, who=_who(caller)
        )
        return DeliveryInfo.of(delivery, event, data)
