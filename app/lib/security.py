"""API key generation and hashing. Keys are 192-bit random secrets, so SHA-256 is a sufficient hash."""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "ms_"
ROLES = ("ingest", "read", "write", "admin")


def generate_api_key() -> str:
    """A new secret key, shown once to whoever asked for it."""
    return KEY_PREFIX + secrets.token_urlsafe(24)


def hash_api_key(key: str) -> str:
    """The stored form of a key (hex SHA-256)."""
    return hashlib.sha256(key.encode()).hexdigest()


def display_prefix(key: str) -> str:
    """The non-secret beginning of a key, to tell keys apart in listings."""
    return key[: len(KEY_PREFIX) + 6]


def has_role(roles: frozenset[str] | set[str] | list[str], required: str) -> bool:
    """`admin` implies every role."""
    return required in roles or "admin" in roles
