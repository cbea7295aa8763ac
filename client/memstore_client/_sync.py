"""`Client`: the blocking SDK over httpx."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import httpx

from memstore_client import _calls as c
from memstore_client import models
from memstore_client.errors import MemstoreError

T = TypeVar("T")


class Client:
    """Memstore's REST API (docs/api.md) from blocking code.

    `Client("http://localhost:8000", api_key="ms_...")`; use as a context manager, or `close()` it.
    Every error answer raises `MemstoreError` with the API's `code`.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout_s: float = 30.0,
        retry: c.RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.retry = retry or c.RetryPolicy()
        self._http = httpx.Client(
            base_url=base_url,
            timeout=timeout_s,
            transport=transport,
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": "memstore-sdk"},
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def send(self, call: c.Call[T]) -> T:
        """Send `call`, retrying as its policy allows; its decoded answer."""
        attempt = 0
        while True:
            response: httpx.Response | None = None
            try:
                response = self._http.request(call.method, call.path, **call.request_kwargs())
            except httpx.TransportError as exc:
                if not self.retry.should_retry(call, attempt, None):
                    raise c.unreachable(exc) from exc
            else:
                if response.status_code < 400 or not self.retry.should_retry(call, attempt, response):
                    return c.decode(call, response)
            time.sleep(self.retry.delay(attempt, response))
            attempt += 1

    # --- ingestion ------------------------------------------------------------------------------

    def add_chunk(
        self,
        user_id: str,
        messages: Sequence[models.Message | Mapping[str, Any]],
        *,
        agent_id: str | None = None,
        run_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        writer: str | None = None,
        idempotency_key: str | None = None,
    ) -> models.ChunkAccepted:
        """Post one chunk (durable on return). Retried safely: it always carries an idempotency key."""
        body = c.chunk_body(
            user_id, messages, agent_id=agent_id, run_id=run_id, metadata=metadata, writer=writer
        )
        return self.send(c.add_chunk(body, idempotency_key))

    def add_chunks(self, chunks: Sequence[Mapping[str, Any]]) -> list[models.ChunkAccepted]:
        """Post several chunks at once (`/v1/chunks/batch`); each may carry its own `idempotency_key`."""
        return self.send(c.add_chunks([dict(chunk) for chunk in chunks])).results

    def get_chunk(self, chunk_id: uuid.UUID | str) -> models.ChunkStatus:
        return self.send(c.get(f"/v1/chunks/{chunk_id}", models.ChunkStatus))

    def wait_for_chunks(
        self, chunk_ids: Sequence[uuid.UUID | str], *, timeout_s: float = 120.0, poll_s: float = 0.2
    ) -> list[models.ChunkStatus]:
        """Until every chunk is applied or failed; their final states, in order."""
        deadline = time.monotonic() + timeout_s
        done: dict[str, models.ChunkStatus] = {}
        for chunk_id in chunk_ids:
            while True:
                state = self.get_chunk(chunk_id)
                if state.finished:
                    done[str(chunk_id)] = state
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"chunk {chunk_id} is still {state.status} after {timeout_s} s")
                time.sleep(poll_s)
        return [done[str(chunk_id)] for chunk_id in chunk_ids]

    # --- memories -------------------------------------------------------------------------------

    def list_memories(self, user_id: str, **filters: Any) -> models.MemoryPage:
        """One page (`status`, `as_of`, `agent_id`, `limit`, `cursor`)."""
        return self.send(c.list_memories(user_id, **filters))

    def iter_memories(self, user_id: str, **filters: Any) -> Iterator[models.Memory]:
        """Every memory of the user matching `filters`, page after page."""
        return self._pages(lambda cursor: c.list_memories(user_id, **filters, cursor=cursor))

    def get_memory(self, memory_id: uuid.UUID | str) -> models.Memory:
        return self.send(c.get(f"/v1/memories/{memory_id}", models.Memory))

    def history(self, memory_id: uuid.UUID | str) -> models.History:
        return self.send(c.get(f"/v1/memories/{memory_id}/history", models.History))

    def edit_memory(
        self,
        memory_id: uuid.UUID | str,
        *,
        content: str | None = None,
        tags: Sequence[str] | None = None,
        reason: str | None = None,
    ) -> models.Memory:
        """A hand edit: a new version (op UPDATE) under this key."""
        body = {"content": content, "tags": list(tags) if tags is not None else None, "reason": reason}
        return self.send(c.patch(f"/v1/memories/{memory_id}", models.Memory, body))

    def delete_memory(self, memory_id: uuid.UUID | str, *, reason: str | None = None) -> models.Memory:
        """A soft delete: a new version with status deleted."""
        return self.send(c.delete(f"/v1/memories/{memory_id}", models.Memory, reason=reason))

    def explain(self, memory_id: uuid.UUID | str, *, raw_output: bool = False) -> models.Explanation:
        """Each version beside its source messages, the writer's view and its changeset."""
        return self.send(
            c.get(f"/v1/memories/{memory_id}/explain", models.Explanation, raw_output=raw_output)
        )

    def search(self, user_id: str, query: str, **options: Any) -> list[models.SearchResult]:
        """Best first (`top_k`, `as_of`, `agent_id`, `mode`)."""
        return self.send(c.search(user_id, query, **options)).results

    # --- admin ----------------------------------------------------------------------------------

    def iter_changesets(self, **filters: Any) -> Iterator[models.Changeset]:
        """Changesets, newest first (`user_id`, `writer`, `model`, `kind`, `since`, `until`)."""
        return self._pages(lambda cursor: c.list_changesets(**filters, cursor=cursor))

    def get_changeset(self, changeset_id: uuid.UUID | str) -> models.Changeset:
        """With the writer's raw output (an audited read)."""
        return self.send(c.get(f"/v1/admin/changesets/{changeset_id}", models.Changeset))

    def rollback(
        self, memory_id: uuid.UUID | str, to_version: int, *, dry_run: bool = False, reason: str | None = None
    ) -> models.Diff:
        return self.send(c.rollback(memory_id, to_version, dry_run, reason))

    def revert(
        self,
        changeset_id: uuid.UUID | str,
        *,
        dry_run: bool = False,
        force: bool = False,
        reason: str | None = None,
    ) -> models.Diff:
        return self.send(c.revert(changeset_id, dry_run, force, reason))

    def restore(
        self, user_id: str, as_of: datetime, *, dry_run: bool = False, reason: str | None = None
    ) -> models.Diff:
        return self.send(c.restore(user_id, as_of, dry_run, reason))

    def bulk_revert(self, since: datetime, **options: Any) -> models.Diff:
        """Revert matching writer changesets (`until`, `writer`, `model`, `user_id`, `dry_run`, `force`)."""
        return self.send(c.bulk_revert(since, **options))

    def iter_users(self, prefix: str | None = None) -> Iterator[models.User]:
        return self._pages(lambda cursor: c.list_users(prefix, cursor=cursor))

    def iter_chunks(self, status: str = "all", user_id: str | None = None) -> Iterator[models.ChunkStatus]:
        """Chunks with their messages, newest first (`status`: failed, queued, processing, applied or all)."""
        return self._pages(lambda cursor: c.list_chunks(status, user_id, cursor=cursor))

    def iter_audit(self, **filters: Any) -> Iterator[models.AuditEvent]:
        """Audit events, oldest first (`since`, `action`)."""
        return self._pages(lambda cursor: c.list_audit(**filters, cursor=cursor))

    def verify_audit(self) -> models.AuditVerdict:
        return self.send(c.get("/v1/admin/audit/verify", models.AuditVerdict))

    def import_user(
        self, user_id: str, records: Mapping[str, Sequence[Mapping[str, Any]]]
    ) -> models.Imported:
        """Load a batch of a `memstore export` (`chunks`, `changesets`, `memories`) as it was written."""
        return self.send(c.import_user(user_id, records))

    def create_key(self, name: str, roles: Sequence[str]) -> models.NewKey:
        return self.send(c.create_key(name, roles))

    def _pages(self, page_call: Any) -> Iterator[Any]:
        cursor: str | None = None
        while True:
            page = self.send(page_call(cursor))
            yield from page.items
            cursor = page.next_cursor
            if cursor is None:
                return


__all__ = ["Client", "MemstoreError"]
