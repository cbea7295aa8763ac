"""The Python SDK of Memstore's REST API: `Client` (blocking) and `AsyncClient` (asyncio), over httpx.

    from memstore_client import Client

    with Client("http://localhost:8000", api_key="ms_...") as memstore:
        accepted = memstore.add_chunk("u-123", [{"role": "user", "content": "I moved to Seattle."}])
        memstore.wait_for_chunks([accepted.chunk_id])
        for memory in memstore.iter_memories("u-123"):
            print(memory.content, memory.version)

Answers are typed (`memstore_client.models`), lists are iterated page after page (`iter_*`), errors
raise `MemstoreError` with the API's error `code`, and chunk posts are retried safely under an
idempotency key. The SDK is a distribution of its own (`memstore-client`): it needs only httpx and
msgspec, nothing of the server.
"""

from __future__ import annotations

from memstore_client import models
from memstore_client._async import AsyncClient
from memstore_client._calls import RetryPolicy
from memstore_client._sync import Client
from memstore_client.errors import MemstoreError

__all__ = ["AsyncClient", "Client", "MemstoreError", "RetryPolicy", "models"]
