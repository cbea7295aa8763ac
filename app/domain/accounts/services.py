"""Rules of tenants and keys. Services never commit: the request or command boundary does."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import ApiKey, Tenant
from app.domain.accounts.repositories import ApiKeyRepository, TenantRepository
from app.domain.audit.services import Actor, record_event
from app.domain.search.tenant_embedder import OWN as OWN_EMBEDDER
from app.lib.errors import InvalidField, KeyExists, KeyRevoked, NotFoundError, TenantExists
from app.lib.ratelimit import Limit
from app.lib.security import ROLES, display_prefix, generate_api_key, has_role, hash_api_key

SYSTEM_ACTOR = "system"


@dataclass(frozen=True)
class Principal:
    """Who is calling: a key of one tenant with its roles."""

    key_id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    roles: frozenset[str]
    rate_limit: Limit | None = None  # the tenant's own request rate per key (None: the deployment's)

    @property
    def actor(self) -> str:
        """How this caller appears in provenance and the audit log."""
        return f"key:{self.key_id}"


@dataclass(frozen=True, slots=True)
class Caller:
    """What a handler needs of who calls: the key's tenant and roles, and the request it came with."""

    principal: Principal
    request_id: str | None

    @property
    def tenant_id(self) -> uuid.UUID:
        return self.principal.tenant_id

    @property
    def actor(self) -> str:
        return self.principal.actor

    def may(self, role: str) -> bool:
        """Whether the key holds `role` (`admin` holds every role)."""
        return has_role(self.principal.roles, role)

    def who(self, reason: str | None = None) -> Actor:
        """The caller as the author of a change, for provenance and the audit log."""
        return Actor(self.actor, self.request_id, reason)


def _check_roles(roles: Iterable[str]) -> list[str]:
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise InvalidField(
            f"Unknown roles: {', '.join(unknown)}.",
            details={"roles": unknown, "allowed": list(ROLES)},
        )
    ordered = [r for r in ROLES if r in set(roles)]
    if not ordered:
        raise InvalidField("A key needs at least one role.", details={"field": "roles"})
    return ordered


async def create_api_key(
    session: AsyncSession,
    *,
    tenant_id: uuid.UUID,
    name: str,
    roles: Iterable[str],
    actor: str,
    request_id: str | None = None,
    secret: str | None = None,
    rotated_from: uuid.UUID | None = None,
) -> tuple[ApiKey, str]:
    """Store a new key (hashed) and return it with its secret, which is never retrievable again."""
    secret = secret or generate_api_key()
    key_hash = hash_api_key(secret)
    repo = ApiKeyRepository(session)
    if await repo.get_by_hash(key_hash) is not None:
        raise KeyExists("That key is already registered.")
    key = await repo.add(
        ApiKey(
            tenant_id=tenant_id,
            name=name,
            prefix=display_prefix(secret),
            key_hash=key_hash,
            roles=_check_roles(roles),
            rotated_from=rotated_from,
        )
    )
    await record_event(
        session,
        tenant_id=tenant_id,
        actor=actor,
        action="api_key.created",
        target_type="api_key",
        target_id=str(key.id),
        request_id=request_id,
        summary={"name": name, "roles": key.roles}
        | ({"rotated_from": str(rotated_from)} if rotated_from else {}),
    )
    return key, secret


async def rotate_api_key(
    session: AsyncSession, *, tenant_id: uuid.UUID, key_id: uuid.UUID, actor: str, request_id: str | None
) -> tuple[ApiKey, str]:
    """A new key with the old one's name and roles; the old one stays valid until it is revoked, so
    clients can move to the new secret without a moment in which neither works."""
    old = await ApiKeyRepository(session).get(tenant_id, key_id)
    if old is None:
        raise NotFoundError("No such API key.")
    if old.revoked_at is not None:
        raise KeyRevoked("A revoked key cannot be rotated; create a new key.")
    return await create_api_key(
        session,
        tenant_id=tenant_id,
        name=old.name,
        roles=old.roles,
        actor=actor,
        request_id=request_id,
        rotated_from=old.id,
    )


async def list_api_keys(session: AsyncSession, tenant_id: uuid.UUID) -> Sequence[ApiKey]:
    return await ApiKeyRepository(session).list(tenant_id)


async def revoke_api_key(
    session: AsyncSession, *, tenant_id: uuid.UUID, key_id: uuid.UUID, actor: str, request_id: str | None
) -> None:
    """Revoke a key of this tenant; another tenant's key is reported as not found."""
    repo = ApiKeyRepository(session)
    if await repo.get(tenant_id, key_id) is None:
        raise NotFoundError("No such API key.")
    await repo.revoke(tenant_id, key_id)
    await record_event(
        session,
        tenant_id=tenant_id,
        actor=actor,
        action="api_key.revoked",
        target_type="api_key",
        target_id=str(key_id),
        request_id=request_id,
    )


async def tenant_settings(session: AsyncSession, tenant_id: uuid.UUID) -> Tenant:
    tenant = await TenantRepository(session).get(tenant_id)
    if tenant is None:
        raise NotFoundError("No such tenant.")
    return tenant


async def set_tenant_options(
    session: AsyncSession,
    *,
    tenant_id: uuid.UUID,
    changes: dict[str, object],
    known: Callable[[str], bool],
    actor: str,
    request_id: str | None = None,
) -> Tenant:
    """Set the tenant's `writer` (its default writer), `shadow_writers` (writers that also write its
    chunks into shadow banks), `destructive_ops` (what a writer's destructive ops meet) and
    `destructive_kinds` (which ops those are), its rate limits, and its writer share (`write_weight`,
    `max_writer_concurrency`, `daily_token_budget`: `pipeline.scheduler`); None: the default. Unknown
    writer names are refused. Each change is audited."""
    for field, value in changes.items():
        if field not in ("writer", "shadow_writers"):
            continue
        names = value if isinstance(value, list) else [] if value is None else [value]
        for index, name in enumerate(names):
            if not known(str(name)) or (field == "shadow_writers" and name == "default"):
                where = field if field == "writer" else f"{field}[{index}]"
                raise InvalidField(
                    f"Unknown writer {name!r}.",
                    details={"field": where},
                )
    if not changes:
        return await tenant_settings(session, tenant_id)
    repo = TenantRepository(session)
    for field, value in changes.items():
        await repo.set_option(
            tenant_id, field, list(dict.fromkeys(value)) if isinstance(value, list) else value
        )
    if isinstance(shadows := changes.get("shadow_writers"), list):
        # When each shadow writer was named: its live bank receives the chunks received since then.
        named = (await tenant_settings(session, tenant_id)).settings.get("shadow_since") or {}
        now = datetime.now(UTC).isoformat()
        await repo.set_option(tenant_id, "shadow_since", {w: named.get(w, now) for w in shadows} or None)
    for field, value in changes.items():
        await record_event(
            session,
            tenant_id=tenant_id,
            actor=actor,
            action=f"tenant.{field}_set",
            target_type="tenant",
            target_id=str(tenant_id),
            summary={field: value},
            request_id=request_id,
        )
    return await tenant_settings(session, tenant_id)


async def tenant_by_name(session: AsyncSession, name: str) -> Tenant:
    tenant = await TenantRepository(session).get_by_name(name)
    if tenant is None:
        raise NotFoundError(f"No tenant named {name!r}.")
    return tenant


async def create_tenant(
    session: AsyncSession,
    name: str,
    *,
    admin_key: str | None = None,
    actor: str = SYSTEM_ACTOR,
    embedder: str | None = None,
) -> tuple[Tenant, str]:
    """A new tenant and its first admin key (the given secret, or a generated one); `embedder`: its own
    embedder from the start (None: the deployment's), which the caller has checked is one a tenant
    may have."""
    tenants = TenantRepository(session)
    if await tenants.get_by_name(name) is not None:
        raise TenantExists(f"A tenant named {name!r} already exists.")
    tenant = await tenants.add(Tenant(name=name, settings={OWN_EMBEDDER: embedder} if embedder else {}))
    await record_event(
        session,
        tenant_id=tenant.id,
        actor=actor,
        action="tenant.created",
        target_type="tenant",
        target_id=str(tenant.id),
        summary={"name": name, **({"embedder": embedder} if embedder else {})},
    )
    _, secret = await create_api_key(
        session, tenant_id=tenant.id, name="admin", roles=["admin"], actor=actor, secret=admin_key
    )
    return tenant, secret


async def bootstrap_default_tenant(
    session: AsyncSession, admin_key: str | None, name: str = "default"
) -> str | None:
    """Embedded mode: make sure a tenant exists and `admin_key` (if given) works.

    Returns a secret to print when one was generated, else None.
    """
    tenants = TenantRepository(session)
    tenant = await tenants.get_by_name(name)
    if tenant is None:
        if admin_key is None and await tenants.count() > 0:
            return None  # the operator set up tenants by hand; nothing to bootstrap
        _, secret = await create_tenant(session, name, admin_key=admin_key)
        return None if admin_key else secret
    if admin_key is not None and await ApiKeyRepository(session).get_by_hash(hash_api_key(admin_key)) is None:
        await create_api_key(
            session,
            tenant_id=tenant.id,
            name="admin (MEMSTORE_ADMIN_KEY)",
            roles=["admin"],
            actor=SYSTEM_ACTOR,
            secret=admin_key,
        )
    return None
