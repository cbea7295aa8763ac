"""SQL of tenants and API keys."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import ApiKey, Tenant


class TenantRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def get_by_name(self, name: str) -> Tenant | None:
        return await self.session.scalar(select(Tenant).where(Tenant.name == name))

    async def get(self, tenant_id: uuid.UUID) -> Tenant | None:
        return await self.session.get(Tenant, tenant_id)

    async def set_option(self, tenant_id: uuid.UUID, key: str, value: object) -> None:
        """Set (or, with None, remove) one option of `tenants.settings`."""
        tenant = await self.session.get(Tenant, tenant_id, with_for_update=True)
        if tenant is None:
            return
        options = {k: v for k, v in tenant.settings.items() if k != key}
        tenant.settings = options if value is None else {**options, key: value}
        await self.session.flush()

    async def count(self) -> int:
        return await self.session.scalar(select(func.count()).select_from(Tenant)) or 0

    async def add(self, tenant: Tenant) -> Tenant:
        self.session.add(tenant)
        await self.session.flush()
        return tenant


class ApiKeyRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def tenant_of(self, key_hash: str) -> uuid.UUID | None:
        """The tenant of the key with this hash, revoked or not: read across tenants, before the tenant
        is known, through a function of the tables' owner (migration 0008)."""
        found = await self.session.scalar(select(func.memstore_key_tenant(key_hash)))
        return None if found is None else uuid.UUID(str(found))

    async def get_active_with_tenant_options(self, key_hash: str) -> tuple[ApiKey, dict[str, Any]] | None:
        """An unrevoked key and its tenant's options (`tenants.settings`)."""
        row = (
            await self.session.execute(
                select(ApiKey, Tenant.settings)
                .join(Tenant, Tenant.id == ApiKey.tenant_id)
                .where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))
            )
        ).first()
        return None if row is None else (row[0], dict(row[1] or {}))

    async def get_by_hash(self, key_hash: str) -> ApiKey | None:
        return await self.session.scalar(select(ApiKey).where(ApiKey.key_hash == key_hash))

    async def get(self, tenant_id: uuid.UUID, key_id: uuid.UUID) -> ApiKey | None:
        return await self.session.scalar(
            select(ApiKey).where(ApiKey.tenant_id == tenant_id, ApiKey.id == key_id)
        )

    async def list(self, tenant_id: uuid.UUID) -> Sequence[ApiKey]:
        result = await self.session.scalars(
            select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at, ApiKey.id)
        )
        return result.all()

    async def add(self, key: ApiKey) -> ApiKey:
        self.session.add(key)
        await self.session.flush()
        return key

    async def touch(self, key_id: uuid.UUID, stale_s: float) -> None:
        """Stamp `last_used_at`, unless it was stamped less than `stale_s` ago."""
        await self.session.execute(
            update(ApiKey)
            .where(
                ApiKey.id == key_id,
                or_(
                    ApiKey.last_used_at.is_(None),
                    ApiKey.last_used_at < func.now() - func.make_interval(0, 0, 0, 0, 0, 0, stale_s),
                ),
            )
            .values(last_used_at=func.now())
        )

    async def revoke(self, tenant_id: uuid.UUID, key_id: uuid.UUID) -> bool:
        result = await self.session.execute(
            update(ApiKey)
            .where(ApiKey.tenant_id == tenant_id, ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
            .values(revoked_at=func.now())
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]
