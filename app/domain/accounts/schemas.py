"""Request and response bodies of the key endpoints."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

import msgspec

from app.db.models import Tenant
from app.domain.search.tenant_embedder import TenantEmbedder

Role = Literal["ingest", "read", "write", "admin"]


class CreateKeyRequest(msgspec.Struct, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    roles: Annotated[list[Role], msgspec.Meta(min_length=1)]


class CreatedKey(msgspec.Struct):
    id: uuid.UUID
    key: str
    name: str
    roles: list[str]
    prefix: str
    created_at: datetime
    rotated_from: uuid.UUID | None = None  # the key this one replaces (still valid until revoked)


class KeyInfo(msgspec.Struct):
    id: uuid.UUID
    name: str
    roles: list[str]
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None  # to within a minute
    rotated_from: uuid.UUID | None


class KeyList(msgspec.Struct):
    items: list[KeyInfo]


WriterName = Annotated[str, msgspec.Meta(min_length=1, max_length=100, extra={"deployment": "writers"})]
# A shadow writer is named: `default` (an alias of whichever writer is the default) is none.
ShadowWriterName = Annotated[
    str, msgspec.Meta(min_length=1, max_length=100, extra={"deployment": "named_writers"})
]


EmbedderName = Annotated[
    str, msgspec.Meta(min_length=1, max_length=100, extra={"deployment": "tenant_embedders"})
]


class TenantSettings(msgspec.Struct):
    """A tenant's options: `writer` writes its chunks that name none; `shadow_writers` also write each
    chunk into shadow banks of their own (null: the deployment's `MEMSTORE_SHADOW_WRITERS`)."""

    tenant_id: uuid.UUID
    name: str
    writer: str | None
    shadow_writers: list[str] | None = None
    # What a writer's destructive ops meet, and which ops those are (null: the deployment's).
    destructive_ops: str | None = None
    destructive_kinds: list[str] | None = None
    # Its own per-key request rate and burst, at most the deployment's (null: the deployment's).
    rate_limit_per_s: float | None = None
    rate_limit_burst: int | None = None
    # Its share of the writer fleet when other tenants have work too (1: an equal share), the most
    # writer calls it may have in flight across the fleet (null: no cap), and the writer tokens (prompt
    # + completion) it may spend a UTC day (null: no budget; spent, its chunks wait `queued`).
    write_weight: float = 1.0
    max_writer_concurrency: int | None = None
    daily_token_budget: int | None = None
    # Its own embedder (null: the deployment's `MEMSTORE_EMBEDDER`), and the one its memories are being
    # re-embedded with (null: none; meanwhile its searches answer 409 and its chunks wait).
    embedder: str | None = None
    embedder_switching_to: str | None = None

    @classmethod
    def of(cls, tenant: Tenant) -> TenantSettings:
        choice = TenantEmbedder.of(tenant.settings)
        shadows = tenant.settings.get("shadow_writers")
        kinds = tenant.settings.get("destructive_kinds")
        return cls(
            tenant_id=tenant.id,
            name=tenant.name,
            writer=tenant.settings.get("writer"),
            shadow_writers=list(shadows) if isinstance(shadows, list) else None,
            destructive_ops=tenant.settings.get("destructive_ops"),
            destructive_kinds=list(kinds) if isinstance(kinds, list) else None,
            rate_limit_per_s=tenant.settings.get("rate_limit_per_s"),
            rate_limit_burst=tenant.settings.get("rate_limit_burst"),
            write_weight=float(tenant.settings.get("write_weight") or 1.0),
            max_writer_concurrency=tenant.settings.get("max_writer_concurrency"),
            daily_token_budget=tenant.settings.get("daily_token_budget"),
            embedder=choice.own,
            embedder_switching_to=choice.switching_to,
        )


class TenantSettingsUpdate(msgspec.Struct, forbid_unknown_fields=True):
    # A configured writer name, or null for the deployment's default; absent: unchanged.
    writer: WriterName | msgspec.UnsetType | None = msgspec.UNSET
    # Configured writer names ([] for none), or null for the deployment's; absent: unchanged.
    shadow_writers: (
        Annotated[list[ShadowWriterName], msgspec.Meta(max_length=8)] | msgspec.UnsetType | None
    ) = msgspec.UNSET
    # allow (applied), review (held for a human: /v1/admin/reviews) or deny (dropped); null: the deployment's.
    destructive_ops: Literal["allow", "review", "deny"] | msgspec.UnsetType | None = msgspec.UNSET
    # The writer ops the policy covers; null: the deployment's (DELETE and SUPERSEDE).
    destructive_kinds: (
        Annotated[list[Literal["DELETE", "SUPERSEDE", "UPDATE"]], msgspec.Meta(min_length=1, max_length=3)]
        | msgspec.UnsetType
        | None
    ) = msgspec.UNSET
    # Requests a second (and at once) per API key of the tenant, never above the deployment's limit
    # (`MEMSTORE_RATE_LIMIT_PER_S`, `MEMSTORE_RATE_LIMIT_BURST`): a tenant may tighten, not loosen.
    rate_limit_per_s: (
        Annotated[float, msgspec.Meta(gt=0, extra={"deployment": "max_rate_limit_per_s"})]
        | msgspec.UnsetType
        | None
    ) = msgspec.UNSET
    rate_limit_burst: (
        Annotated[int, msgspec.Meta(ge=1, extra={"deployment": "max_rate_limit_burst"})]
        | msgspec.UnsetType
        | None
    ) = msgspec.UNSET
    # The tenant's share of the writer fleet when others have work too, at most the deployment's
    # `MEMSTORE_TENANT_WRITE_WEIGHT_MAX` (null: 1, an equal share).
    write_weight: (
        Annotated[float, msgspec.Meta(gt=0, le=1000, extra={"deployment": "max_write_weight"})]
        | msgspec.UnsetType
        | None
    ) = msgspec.UNSET
    # The most writer calls of the tenant in flight across the fleet (null: no cap).
    max_writer_concurrency: Annotated[int, msgspec.Meta(ge=1, le=100_000)] | msgspec.UnsetType | None = (
        msgspec.UNSET
    )
    # Writer tokens (prompt + completion) a UTC day (null: no budget; 0: no writing).
    daily_token_budget: Annotated[int, msgspec.Meta(ge=0, le=10**15)] | msgspec.UnsetType | None = (
        msgspec.UNSET
    )
    # One of the deployment's embedders for tenants (`MEMSTORE_TENANT_EMBEDDERS`), or null for the
    # deployment's: the tenant's memories are re-embedded with it, alone, before it is used.
    embedder: EmbedderName | msgspec.UnsetType | None = msgspec.UNSET
