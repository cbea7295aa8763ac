"""Request and response bodies of the key endpoints."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

import msgspec

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


class KeyInfo(msgspec.Struct):
    id: uuid.UUID
    name: str
    roles: list[str]
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


class KeyList(msgspec.Struct):
    items: list[KeyInfo]


class TenantSettings(msgspec.Struct):
    """A tenant's options; `writer` is the default writer of its chunks that name none."""

    tenant_id: uuid.UUID
    name: str
    writer: str | None


class TenantSettingsUpdate(msgspec.Struct, forbid_unknown_fields=True):
    # A configured writer name, or null for the deployment's default.
    writer: Annotated[str, msgspec.Meta(min_length=1, max_length=100)] | None
