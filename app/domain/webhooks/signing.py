"""Standard Webhooks signatures (https://www.standardwebhooks.com): `webhook-id`, `webhook-timestamp`
and `webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">` keyed by the secret's
bytes (`whsec_<base64>`). Any Standard Webhooks library verifies them (the tests use `standardwebhooks`)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import uuid

SECRET_PREFIX = "whsec_"  # noqa: S105  (the scheme's prefix, not a secret)


def new_secret() -> str:
    """A fresh endpoint secret: 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def message_id(event_id: uuid.UUID) -> str:
    """The `webhook-id` of an event: the same on every attempt and every endpoint, so a receiver can
    drop a duplicate."""
    return f"msg_{event_id.hex}"


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(secrets_: list[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The headers of one attempt, signed with each secret (the current one, and during a rotation's
    overlap the previous one: space-separated, as the standard allows)."""
    return {
        "content-type": "application/json",
        "user-agent": "memstore-webhooks/1",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(s, msg_id, timestamp, body) for s in secrets_),
    }
