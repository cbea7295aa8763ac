"""API-key authentication (`Bearer`, or Mem0's `Token` scheme) and role guards.

Every request under /v1 resolves its key to a `Principal` (tenant + roles). Resolved keys are cached
per process for `auth_cache_ttl_s`, so the hot ingestion path does not pay a query per request, and so
are refused ones, so a flood of one bad key costs one query, not one each. A revocation reaches every
API process's cache within milliseconds over Redis (`KeyEvents`); the cache's lifetime is the bound
only while Redis is unreachable.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.handlers.base import BaseRouteHandler
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult
from litestar.types import Guard
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.tenancy import enter_tenant, tenant_scope
from app.domain.accounts.repositories import ApiKeyRepository
from app.domain.accounts.services import Principal
from app.lib import metrics
from app.lib.ratelimit import NO_LIMIT, Limit
from app.lib.security import has_role, hash_api_key

# Routes reachable without a key (health checks, metrics scrapers, the OpenAPI document, the admin
# console's static files, which hold nothing of a tenant's: the page asks for a key and sends it).
PUBLIC_PATHS = ["^/health$", "^/ready$", "^/metrics$", "^/schema", "^/admin(/|$)"]
# `Authorization: <scheme> <key>`: Memstore's own clients say Bearer; Mem0's say Token (docs/mem0.md).
KEY_SCHEMES = frozenset({"bearer", "token"})
# No key is longer; a longer one is refused before it is hashed or looked up.
MAX_KEY_CHARS = 256
# `last_used_at` is stamped at most this often per key.
LAST_USED_EVERY_S = 60.0
_MAX_CACHED = 10_000
_T = TypeVar("_T")


# The counter's series, looked up once (`labels()` costs more than the increment, on every request).
_LOOKUPS = {
    result: metrics.AUTH_LOOKUPS.labels(result)
    for result in ("cached", "queried", "refused_cached", "refused_unchecked")
}


class KeyResolver:
    """Key hash -> Principal (or refusal), with a short per-process cache of both."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        ttl_s: float,
        default_limit: Limit = NO_LIMIT,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.ttl_s = ttl_s
        self.default_limit = default_limit  # the deployment's per-key request rate
        self._cache: dict[str, tuple[float, Principal]] = {}
        self._refused: dict[str, float] = {}  # key hash -> until when it is refused without a query
        # One lookup per key at a time: when an entry expires under load, the requests that arrive
        # meanwhile share that lookup instead of each querying the database. It runs as its own task,
        # so a caller that is cancelled (a client gone) does not cancel it for the others.
        self._inflight: dict[str, asyncio.Task[Principal | None]] = {}

    async def resolve(self, secret: str) -> Principal | None:
        if len(secret) > MAX_KEY_CHARS:
            _LOOKUPS["refused_unchecked"].inc()
            return None
        key_hash = hash_api_key(secret)
        now = time.monotonic()
        cached = self._cache.get(key_hash)
        if cached is not None and cached[0] > now:
            _LOOKUPS["cached"].inc()
            return cached[1]
        if self._refused.get(key_hash, 0.0) > now:
            _LOOKUPS["refused_cached"].inc()
            return None
        task = self._inflight.get(key_hash)
        if task is None:
            task = asyncio.create_task(self._lookup(key_hash))
            self._inflight[key_hash] = task
            task.add_done_callback(lambda _: self._inflight.pop(key_hash, None))
        return await asyncio.shield(task)

    async def _lookup(self, key_hash: str) -> Principal | None:
        _LOOKUPS["queried"].inc()
        found = None
        # The key's tenant first (the one read across tenants, by a hash no one can guess); then the
        # key itself, as that tenant, like every other read of its rows.
        async with self.sessionmaker() as session:
            tenant_id = await ApiKeyRepository(session).tenant_of(key_hash)
        if tenant_id is not None:
            with tenant_scope([tenant_id]):
                async with self.sessionmaker() as session:
                    repo = ApiKeyRepository(session)
                    found = await repo.get_active_with_tenant_options(key_hash)
                    if found is not None and _stale(found[0].last_used_at):
                        await repo.touch(found[0].id, LAST_USED_EVERY_S)
                        await session.commit()
        expires = time.monotonic() + self.ttl_s
        if found is None:
            self._cache.pop(key_hash, None)
            _bounded(self._refused)[key_hash] = expires
            return None
        key, options = found
        principal = Principal(
            key_id=key.id,
            tenant_id=key.tenant_id,
            name=key.name,
            roles=frozenset(key.roles),
            rate_limit=tenant_rate_limit(options, self.default_limit),
        )
        _bounded(self._cache)[key_hash] = (expires, principal)
        return principal

    def forget(self, key_id: uuid.UUID | str) -> None:
        """Drop a revoked key from this process's cache at once."""
        for key_hash, (_, principal) in list(self._cache.items()):
            if str(principal.key_id) == str(key_id):
                del self._cache[key_hash]

    def welcome(self, key_hash: str) -> None:
        """A key was just created: stop refusing it from the cache, should it have been tried before."""
        self._refused.pop(key_hash, None)

    def forget_all(self) -> None:
        """Drop every cached answer (after a gap in the revocation feed, which may have missed some)."""
        self._cache.clear()
        self._refused.clear()


def _stale(last_used_at: datetime | None) -> bool:
    """Whether `last_used_at` is due again (the UPDATE re-checks, for processes racing to stamp it)."""
    return last_used_at is None or datetime.now(UTC) - last_used_at > timedelta(seconds=LAST_USED_EVERY_S)


def tenant_rate_limit(options: dict[str, Any], default: Limit) -> Limit | None:
    """The tenant's own per-key request rate, where it set one (`PATCH /v1/admin/settings`); the
    deployment's for what it did not set. A tenant may only tighten the deployment's limit."""
    rate, burst = options.get("rate_limit_per_s"), options.get("rate_limit_burst")
    if not isinstance(rate, int | float) and not isinstance(burst, int):
        return None
    return Limit(
        rate_per_s=float(rate) if isinstance(rate, int | float) else default.rate_per_s,
        burst=burst if isinstance(burst, int) else default.burst,
    )


def _bounded(cache: dict[str, _T]) -> dict[str, _T]:
    """The cache, emptied first if it is full (a flood of distinct keys cannot grow it without end)."""
    if len(cache) >= _MAX_CACHED:
        cache.clear()
    return cache


class ApiKeyAuthenticationMiddleware(AbstractAuthenticationMiddleware):
    """`Authorization: Bearer <key>` (or `Token <key>`) -> `request.user` is the key's Principal; else 401."""

    async def authenticate_request(
        self, connection: ASGIConnection[Any, Any, Any, Any]
    ) -> AuthenticationResult:
        header = connection.headers.get("authorization", "")
        scheme, _, secret = header.partition(" ")
        if scheme.lower() not in KEY_SCHEMES or not secret.strip():
            raise NotAuthorizedException("A valid API key is required (Authorization: Bearer <key>).")
        resolver: KeyResolver = connection.app.state.services.key_resolver  # app.server.lifespan
        principal = await resolver.resolve(secret.strip())
        if principal is None:
            raise NotAuthorizedException("Unknown or revoked API key.")
        # The rest of the request reads and writes as this tenant (`app.db.tenancy`).
        enter_tenant(principal.tenant_id)
        return AuthenticationResult(user=principal, auth=principal)


def _principal(connection: ASGIConnection[Any, Any, Any, Any]) -> Principal | None:
    """The key's principal; None for the one kind of request that skips authentication: `OPTIONS`,
    which Litestar answers itself with the route's allowed methods (nothing of a tenant's)."""
    if connection.scope.get("method") == "OPTIONS":
        return None
    principal: Principal = connection.user
    return principal


@dataclass(frozen=True)
class RoleGuard:
    """Lets through keys holding any of `roles` (or `admin`); the roles are readable, so the route-by-
    credential tests derive what each route needs from the routes themselves."""

    roles: tuple[str, ...]

    # Async on purpose: Litestar runs synchronous guards in a worker thread.
    async def __call__(self, connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        principal = _principal(connection)
        if principal is not None and not any(has_role(principal.roles, r) for r in self.roles):
            if len(self.roles) == 1:
                raise PermissionDeniedException(f"This API key lacks the '{self.roles[0]}' role.")
            raise PermissionDeniedException(f"This API key needs one of the roles: {', '.join(self.roles)}.")


def requires_role(role: str) -> Guard:
    """A guard that lets through keys holding `role` (or `admin`)."""
    return RoleGuard((role,))


def requires_any_role(*roles: str) -> Guard:
    """A guard that lets through keys holding any of `roles` (or `admin`)."""
    return RoleGuard(roles)
