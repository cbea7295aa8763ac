"""`/v1/admin/keys`: create (the secret shown once), list, rotate, revoke; `/v1/admin/settings`: the
tenant's options."""

from __future__ import annotations

import uuid

import msgspec
from litestar import Controller, Response, delete, get, patch, post
from litestar.background_tasks import BackgroundTask, BackgroundTasks
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.db.models import ApiKey
from app.domain.accounts import services
from app.domain.accounts.auth import requires_role
from app.domain.accounts.key_events import KeyEvents
from app.domain.accounts.schemas import (
    CreatedKey,
    CreateKeyRequest,
    KeyInfo,
    KeyList,
    TenantSettings,
    TenantSettingsUpdate,
)
from app.domain.accounts.services import Caller
from app.domain.pipeline.scheduler import SHARES, Shares, configure
from app.domain.search.tenant_embedder import allowed_embedders, ask_switch, enqueue_switch
from app.lib.errors import InvalidField, KeyExists, KeyRevoked, NotFoundError, error_responses
from app.lib.queue import JobQueue
from app.writers.registry import WriterRegistry


class ApiKeyController(Controller):
    path = "/v1/admin/keys"
    tags = ["admin"]
    guards = [requires_role("admin")]

    @post(
        "/",
        status_code=HTTP_201_CREATED,
        summary="Create an API key (the secret is returned once)",
        responses=error_responses(InvalidField, KeyExists),
    )
    async def create_key(
        self,
        data: JSONBody[CreateKeyRequest],
        db_session: NamedDependency[AsyncSession],
        caller: NamedDependency[Caller],
        key_events: NamedDependency[KeyEvents],
    ) -> Response[CreatedKey]:
        key, secret = await services.create_api_key(
            db_session,
            tenant_id=caller.tenant_id,
            name=data.name,
            roles=data.roles,
            actor=caller.actor,
            request_id=caller.request_id,
        )
        return _created(key_events, key, secret)

    @post(
        "/{key_id:uuid}/rotate",
        status_code=HTTP_201_CREATED,
        summary="A new key with this key's name and roles; the old one stays valid until revoked",
        responses=error_responses(NotFoundError, KeyRevoked, KeyExists),
    )
    async def rotate_key(
        self,
        key_id: FromPath[uuid.UUID],
        db_session: NamedDependency[AsyncSession],
        caller: NamedDependency[Caller],
        key_events: NamedDependency[KeyEvents],
    ) -> Response[CreatedKey]:
        key, secret = await services.rotate_api_key(
            db_session,
            tenant_id=caller.tenant_id,
            key_id=key_id,
            actor=caller.actor,
            request_id=caller.request_id,
        )
        return _created(key_events, key, secret)

    @get("/", summary="List the tenant's API keys (never their secrets)")
    async def list_keys(
        self, db_session: NamedDependency[AsyncSession], caller: NamedDependency[Caller]
    ) -> KeyList:
        keys = await services.list_api_keys(db_session, caller.tenant_id)
        return KeyList(
            items=[
                KeyInfo(
                    id=k.id,
                    name=k.name,
                    roles=k.roles,
                    prefix=k.prefix,
                    created_at=k.created_at,
                    revoked_at=k.revoked_at,
                    last_used_at=k.last_used_at,
                    rotated_from=k.rotated_from,
                )
                for k in keys
            ]
        )

    @delete(
        "/{key_id:uuid}",
        status_code=HTTP_204_NO_CONTENT,
        summary="Revoke an API key",
        responses=error_responses(NotFoundError),
    )
    async def revoke_key(
        self,
        key_id: FromPath[uuid.UUID],
        db_session: NamedDependency[AsyncSession],
        caller: NamedDependency[Caller],
        key_events: NamedDependency[KeyEvents],
    ) -> Response[None]:
        await services.revoke_api_key(
            db_session,
            tenant_id=caller.tenant_id,
            key_id=key_id,
            actor=caller.actor,
            request_id=caller.request_id,
        )
        # After the commit, or a lookup in between could cache the key again as still valid; published
        # so that every other API process drops it too.
        return Response(
            None, status_code=HTTP_204_NO_CONTENT, background=BackgroundTask(key_events.revoked, key_id)
        )


def _created(events: KeyEvents, key: ApiKey, secret: str) -> Response[CreatedKey]:
    """The new key, its secret shown this once; every API process is told it exists (after the commit)."""
    body = CreatedKey(
        id=key.id,
        key=secret,
        name=key.name,
        roles=key.roles,
        prefix=key.prefix,
        created_at=key.created_at,
        rotated_from=key.rotated_from,
    )
    welcome = BackgroundTask(events.created, key.key_hash)
    return Response(body, status_code=HTTP_201_CREATED, background=welcome)


# The options stored as given (the others are checked against the deployment's first).
_AS_GIVEN = ("writer", "shadow_writers", "destructive_ops", "destructive_kinds")


async def _ask_embedder(
    session: AsyncSession, caller: Caller, settings: Settings, name: str | None
) -> str | None:
    """Move the tenant to embedder `name` (None: the deployment's), one of those a tenant may have; the
    move under way now (`ask_switch`), if any."""
    to = name or settings.embedder
    allowed = allowed_embedders(settings.embedder, settings.tenant_embedders)
    if to not in allowed:
        raise InvalidField(
            f"Unknown embedder {to!r} (this deployment's: {', '.join(allowed)}).",
            details={"field": "embedder", "allowed": list(allowed)},
        )
    return await ask_switch(
        session,
        caller.tenant_id,
        to,
        default=settings.embedder,
        actor=caller.actor,
        request_id=caller.request_id,
    )


class TenantSettingsController(Controller):
    path = "/v1/admin/settings"
    tags = ["admin"]
    guards = [requires_role("admin")]

    @get("/", summary="The tenant's options (its default writer)")
    async def get_settings(
        self, db_session: NamedDependency[AsyncSession], caller: NamedDependency[Caller]
    ) -> TenantSettings:
        tenant = await services.tenant_settings(db_session, caller.tenant_id)
        return TenantSettings.of(tenant)

    @patch(
        "/",
        summary="Set the tenant's writers, embedder, destructive-ops policy, limits, share (null: default)",
        responses=error_responses(InvalidField),
    )
    async def update_settings(
        self,
        data: JSONBody[TenantSettingsUpdate],
        db_session: NamedDependency[AsyncSession],
        caller: NamedDependency[Caller],
        settings: NamedDependency[Settings],
        writers: NamedDependency[WriterRegistry],
        job_queue: NamedDependency[JobQueue],
    ) -> Response[TenantSettings]:
        changes: dict[str, object] = {}
        for name in (*_AS_GIVEN, "max_writer_concurrency", "daily_token_budget"):
            if (value := getattr(data, name)) is not msgspec.UNSET:
                changes[name] = value
        for field, most in (
            ("rate_limit_per_s", settings.rate_limit_per_s),
            ("rate_limit_burst", settings.rate_limit_burst),
        ):
            value = getattr(data, field)
            if value is msgspec.UNSET:
                continue
            if value is not None and most > 0 and value > most:
                raise InvalidField(
                    f"{field} may not exceed the deployment's ({most:g}).",
                    details={"field": field, "most": most},
                )
            changes[field] = value
        if data.write_weight is not msgspec.UNSET:
            most = settings.tenant_write_weight_max
            if data.write_weight is not None and data.write_weight > most:
                raise InvalidField(
                    f"write_weight may not exceed the deployment's ({most:g}).",
                    details={"field": "write_weight", "most": most},
                )
            changes["write_weight"] = data.write_weight
        move = (
            await _ask_embedder(db_session, caller, settings, data.embedder)
            if data.embedder is not msgspec.UNSET
            else None
        )
        tenant = await services.set_tenant_options(
            db_session,
            tenant_id=caller.tenant_id,
            changes=changes,
            known=writers.knows,
            actor=caller.actor,
            request_id=caller.request_id,
        )
        out = TenantSettings.of(tenant)
        after: list[BackgroundTask] = []  # after the commit:
        if move is not None:  # a worker re-embeds the tenant's memories
            after.append(BackgroundTask(enqueue_switch, job_queue.redis, tenant.id, move))
        if changes.keys() & set(SHARES):  # the scheduler holds the new shares (a raised budget unpauses)
            shares = Shares(
                weight=out.write_weight,
                cap=out.max_writer_concurrency or 0,
                budgeted=out.daily_token_budget is not None,
            )
            after.append(BackgroundTask(configure, job_queue.redis, tenant.id, shares))
        return Response(out, background=BackgroundTasks(after) if after else None)
