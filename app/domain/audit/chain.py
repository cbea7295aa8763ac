"""How an audit event is hashed. Changing this breaks verification of existing chains: version it."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime
from typing import Any

GENESIS_HASH = "0" * 64


def event_hash(
    *,
    tenant_id: uuid.UUID,
    seq: int,
    prev_hash: str,
    actor: str,
    action: str,
    target_type: str | None,
    target_id: str | None,
    request_id: str | None,
    summary: dict[str, Any],
    created_at: datetime,
) -> str:
    """SHA-256 over a canonical JSON of the event and the previous event's hash."""
    payload = {
        "v": 1,
        "tenant_id": str(tenant_id),
        "seq": seq,
        "prev_hash": prev_hash,
        "actor": actor,
        "action": action,
        "target_type": target_type,
        "target_id": target_id,
        "request_id": request_id,
        "summary": summary,
        "created_at": created_at.isoformat(timespec="microseconds"),
    }
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()
