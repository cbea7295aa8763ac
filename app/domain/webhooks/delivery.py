"""Delivering the outbox: due deliveries claimed, sent signed, their outcome recorded.

At least once, in order per user: a delivery is claimed with a lease (its attempt counted first), sent
with no transaction open, and its outcome recorded after; a worker that dies mid-attempt leaves it to
be taken again when the lease ends. Only the head of each (endpoint, user) queue is claimed, so a
user's events reach an endpoint in the order they were committed; a head that fails holds its queue
until it is delivered or given up (then the next goes). The event id (`webhook-id`) is the same on
every attempt.

Retries follow `MEMSTORE_WEBHOOK_RETRY_SCHEDULE_S` (5 s, 5 min, 30 min, 2 h, 5 h after the failed
attempts); after the last the delivery is `failed`, and stays in the delivery log with every attempt,
redeliverable by hand. A 2xx answer is a delivery; anything else (another status, a redirect, a
timeout, an address the SSRF guard refuses) a failed attempt.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp
import msgspec
import structlog
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.config import Settings
from app.db.tenancy import tenant_scope
from app.domain.webhooks import signing
from app.domain.webhooks.events import redact
from app.domain.webhooks.repositories import Claimed, DeliveryRepository
from app.domain.webhooks.ssrf import AddressPolicy, BlockedAddressError, GuardedResolver, check_literal

log = structlog.get_logger("app.domain.webhooks.delivery")

MAX_ERROR_CHARS = 500
DUE_TENANTS_PER_ROUND = 100


@dataclass(frozen=True)
class Attempt:
    """What one attempt met."""

    delivered: bool
    status: int | None
    error: str | None
    duration_ms: int


def body(claimed: Claimed) -> bytes:
    """The request body: `{"type", "timestamp", "data"}`, contents only if the endpoint opted in."""
    data = claimed.event.data if claimed.endpoint.include_content else redact(claimed.event.data)
    return msgspec.json.encode(
        {"type": claimed.event.type, "timestamp": claimed.event.created_at.isoformat(), "data": data}
    )


def signing_secrets(claimed: Claimed, now: datetime) -> list[str]:
    endpoint = claimed.endpoint
    current = [endpoint.secret]
    expires = endpoint.previous_secret_expires_at
    if endpoint.previous_secret and expires is not None and expires > now:
        return [*current, endpoint.previous_secret]
    return current


def _blocked(exc: BaseException) -> BlockedAddressError | None:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, BlockedAddressError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


async def attempt(http: aiohttp.ClientSession, claimed: Claimed, policy: AddressPolicy) -> Attempt:
    """Send `claimed` once."""
    payload = body(claimed)
    msg_id = signing.message_id(claimed.event.id)
    headers = signing.headers(signing_secrets(claimed, datetime.now(UTC)), msg_id, int(time.time()), payload)
    started = time.monotonic()
    status: int | None = None
    error: str | None = None
    try:
        check_literal(claimed.endpoint.url, policy)
        async with http.post(
            claimed.endpoint.url, data=payload, headers=headers, allow_redirects=False
        ) as resp:
            status = resp.status
            await resp.content.read(4096)  # the answer's head; the rest is not ours to wait for
        if not 200 <= status < 300:
            error = f"HTTP {status}"
    except Exception as exc:  # noqa: BLE001  (every fault of an attempt is recorded on it)
        blocked = _blocked(exc)
        error = f"blocked: {blocked}" if blocked else f"{type(exc).__name__}: {exc}"
    duration_ms = int((time.monotonic() - started) * 1000)
    return Attempt(error is None, status, None if error is None else error[:MAX_ERROR_CHARS], duration_ms)


def retry_in(settings: Settings, attempts: int) -> float | None:
    """Seconds before the next attempt after `attempts` failed ones; None: given up."""
    schedule = settings.webhook_retry_schedule_s
    return schedule[attempts - 1] if attempts <= len(schedule) else None


class Deliverer:
    """The delivery job's work: rounds of due heads, tenant by tenant, until none is due or the time
    given is spent."""

    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self.policy = AddressPolicy.of(settings.webhook_allowed_hosts)

    def _client(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            resolver=GuardedResolver(self.policy), use_dns_cache=False, limit=self.settings.webhook_batch
        )
        timeout = aiohttp.ClientTimeout(total=self.settings.webhook_timeout_s)
        return aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False)

    async def run(self, budget_s: float) -> int:
        """Deliver what is due; the number of attempts made."""
        deadline = time.monotonic() + budget_s
        async with AsyncSession(self.engine) as session:
            tenants = await DeliveryRepository(session).due_tenants(DUE_TENANTS_PER_ROUND)
        if not tenants:
            return 0
        made = 0
        async with self._client() as http:
            while tenants and time.monotonic() < deadline:
                busy = []
                for tenant_id in tenants:
                    sent = await self.round(http, tenant_id)
                    made += sent
                    if sent:
                        busy.append(tenant_id)
                tenants = busy
        return made

    async def round(self, http: aiohttp.ClientSession, tenant_id: uuid.UUID) -> int:
        """One attempt for each due head of the tenant's queues, at once; their outcomes recorded."""
        lease_s = self.settings.webhook_timeout_s + 30
        with tenant_scope([tenant_id]):
            async with AsyncSession(self.engine, expire_on_commit=False) as session, session.begin():
                claimed = await DeliveryRepository(session).claim(
                    tenant_id, self.settings.webhook_batch, lease_s
                )
            if not claimed:
                return 0
            attempts = await asyncio.gather(*(attempt(http, c, self.policy) for c in claimed))
            async with AsyncSession(self.engine) as session, session.begin():
                repo = DeliveryRepository(session)
                for c, a in zip(claimed, attempts, strict=True):
                    again = None if a.delivered else retry_in(self.settings, c.attempts)
                    await repo.record(
                        tenant_id,
                        c.id,
                        attempt={
                            "at": datetime.now(UTC).isoformat(),
                            "attempt": c.attempts,
                            "status": a.status,
                            "error": a.error,
                            "duration_ms": a.duration_ms,
                        },
                        delivered=a.delivered,
                        retry_in_s=again,
                        response_status=a.status,
                        error=a.error,
                    )
                    _log(c, a, again)
        return len(claimed)


def _log(c: Claimed, a: Attempt, again: float | None) -> None:
    fields = {
        "delivery_id": str(c.id),
        "endpoint_id": str(c.endpoint.id),
        "event_type": c.event.type,
        "attempt": c.attempts,
        "status": a.status,
    }
    if a.delivered:
        log.info("webhook.delivered", **fields)
    elif again is None:
        log.warning("webhook.given_up", error=a.error, **fields)
    else:
        log.info("webhook.retry_scheduled", error=a.error, retry_in_s=again, **fields)
