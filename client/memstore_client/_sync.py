"""`Client`: the blocking SDK over httpx."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import httpx
import msgspec

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

    def get_chunk(self, chunk_id: uuid.UUID | str, *, wait_s: float = 0.0) -> models.ChunkStatus:
        """The chunk's progress; with `wait_s` (at most 30), once it is applied or failed, or after
        that long as it is then (the server waits: no polling)."""
        return self.send(c.get_chunk(chunk_id, wait_s))

    def get_chunks(
        self, chunk_ids: Sequence[uuid.UUID | str], *, wait_s: float = 0.0
    ) -> list[models.ChunkStatus]:
        """Several chunks' progress (at most 100), in order; with `wait_s`, once all are finished."""
        return (self.send(c.get_chunks([str(i) for i in chunk_ids], wait_s))).items

    def wait_for_chunks(
        self, chunk_ids: Sequence[uuid.UUID | str], *, timeout_s: float = 120.0, poll_s: float = 0.2
    ) -> list[models.ChunkStatus]:
        """Until every chunk is applied or failed; their final states, in order. The server holds each
        request until the chunks finish (`wait`); `poll_s` paces the requests only against a server
        that answers at once."""
        deadline = time.monotonic() + timeout_s
        wanted = [str(uuid.UUID(str(chunk_id))) for chunk_id in chunk_ids]
        done: dict[str, models.ChunkStatus] = {}
        while pending := [i for i in dict.fromkeys(wanted) if i not in done]:
            left = deadline - time.monotonic()
            if left <= 0:
                state = (self.get_chunks(pending[:1]))[0]
                raise TimeoutError(f"chunk {pending[0]} is still {state.status} after {timeout_s} s")
            asked = time.monotonic()
            for start in range(0, len(pending), c.STATUS_IDS):
                batch = pending[start : start + c.STATUS_IDS]
                for state in self.get_chunks(batch, wait_s=min(left, c.WAIT_STEP_S)):
                    if state.finished:
                        done[str(state.chunk_id)] = state
            if any(i not in done for i in pending) and time.monotonic() - asked < poll_s:
                time.sleep(poll_s)
        return [done[i] for i in wanted]

    # --- memories -------------------------------------------------------------------------------

    def list_memories(self, user_id: str, **filters: Any) -> models.MemoryPage:
        """One page (`status`, `as_of`, `valid_at`, `agent_id`, `limit`, `cursor`, `include_expired`)."""
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
        expires_at: datetime | msgspec.UnsetType | None = msgspec.UNSET,
    ) -> models.Memory:
        """A hand edit: a new version (op UPDATE) under this key. `expires_at`: when the memory is
        hidden from reads from (None: never; left out: as it was)."""
        return self.send(c.edit_memory(memory_id, content, tags, reason, expires_at))

    def delete_memory(self, memory_id: uuid.UUID | str, *, reason: str | None = None) -> models.Memory:
        """A soft delete: a new version with status deleted."""
        return self.send(c.delete(f"/v1/memories/{memory_id}", models.Memory, reason=reason))

    def explain(self, memory_id: uuid.UUID | str, *, raw_output: bool = False) -> models.Explanation:
        """Each version beside its source messages, the writer's view and its changeset."""
        return self.send(
            c.get(f"/v1/memories/{memory_id}/explain", models.Explanation, raw_output=raw_output)
        )

    def search(self, user_id: str, query: str, **options: Any) -> list[models.SearchResult]:
        """Best first (`top_k`, `as_of`, `valid_at`, `reference_time`, `agent_id`, `mode`,
        `include_expired`)."""
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

    def create_webhook(
        self,
        url: str,
        *,
        event_types: Sequence[str] = (),
        description: str | None = None,
        include_content: bool = False,
        enabled: bool = True,
    ) -> models.NewWebhook:
        """A webhook endpoint (docs/webhooks.md); its `secret` is answered this once."""
        return self.send(c.create_webhook(url, event_types, description, include_content, enabled))

    def list_webhooks(self) -> list[models.Webhook]:
        return (self.send(c.get("/v1/admin/webhooks", models.WebhookList))).items

    def get_webhook(self, webhook_id: uuid.UUID | str) -> models.Webhook:
        return self.send(c.get(f"/v1/admin/webhooks/{webhook_id}", models.Webhook))

    def update_webhook(self, webhook_id: uuid.UUID | str, **changes: Any) -> models.Webhook:
        """Change `url`, `event_types`, `description`, `include_content` or `enabled`."""
        return self.send(c.update_webhook(webhook_id, changes))

    def delete_webhook(self, webhook_id: uuid.UUID | str) -> None:
        self.send(c.delete_webhook(webhook_id))

    def rotate_webhook_secret(self, webhook_id: uuid.UUID | str) -> models.NewWebhook:
        """A new secret; the previous one still signs until `previous_secret_expires_at`."""
        return self.send(c.post(f"/v1/admin/webhooks/{webhook_id}/rotate-secret", models.NewWebhook, {}))

    def iter_webhook_deliveries(
        self, webhook_id: uuid.UUID | str, *, status: str | None = None
    ) -> Iterator[models.WebhookDelivery]:
        """The endpoint's delivery log, newest event first, with every attempt."""
        return self._pages(lambda cursor: c.list_webhook_deliveries(webhook_id, status=status, cursor=cursor))

    def redeliver_webhook(
        self, webhook_id: uuid.UUID | str, delivery_id: uuid.UUID | str
    ) -> models.WebhookDelivery:
        """Send a delivery again now, with a fresh retry schedule."""
        return self.send(
            c.post(
                f"/v1/admin/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver",
                models.WebhookDelivery,
                {},
            )
        )

    def _pages(self, page_call: Any) -> Iterator[Any]:
        cursor: str | None = None
        while True:
            page = self.send(page_call(cursor))
            yield from page.items
            cursor = page.next_cursor
            if cursor is None:
                return


__all__ = ["Client", "MemstoreError"]
