"""The Python SDK of Memstore's REST API: `Client` (blocking) and `AsyncClient` (asyncio), over httpx.

    from app.client import Client

    with Client("http://localhost:8000", api_key="ms_...") as memstore:
        accepted = memstore.add_chunk("u-123", [{"role": "user", "content": "I moved to Seattle."}])
        memstore.wait_for_chunks([accepted.chunk_id])
        for memory in memstore.iter_memories("u-123"):
            print(memory.content, memory.version)

Answers are typed (`app.client.models`), lists are iterated page after page (`iter_*`), errors raise
`MemstoreError` with the API's error `code`, and chunk posts are retried safely under an idempotency
key. Nothing here imports the server: the SDK needs only httpx and msgspec.
"""

from __future__ import annotations

from app.client import models
from app.client._async import AsyncClient
from app.client._calls import RetryPolicy
from app.client._sync import Client
from app.client.errors import MemstoreError

__all__ = ["AsyncClient", "Client", "MemstoreError", "RetryPolicy", "models"]
