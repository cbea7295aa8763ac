"""What the sync and async clients share: each API call as a request description and the type of its
answer, the retry policy, and the decoding of answers and errors. The clients only send.

Retries: an answer that says nothing was done (429, 503, with `Retry-After` honoured) is retried for
any call; a failure to connect or a gateway's 502/504, where the server may have acted, only for calls
that are safe to repeat — reads, and chunk posts, which always carry an `Idempotency-Key` (one is made
when the caller gives none), so a repeat returns the original chunk instead of writing a second one.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from memstore_client import models
from memstore_client.errors import MemstoreError

T = TypeVar("T")

_SAID_NOTHING_DONE = frozenset({429, 503})
_MAYBE_DONE = frozenset({502, 504})


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and the type its answer decodes to (None: no body expected)."""

    method: str
    path: str
    answer: type[T] | None
    params: Mapping[str, Any] = field(default_factory=dict)
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    repeatable: bool = False  # safe to send again if the server may have acted on it

    def request_kwargs(self) -> dict[str, Any]:
        params = {
            k: [_param(x) for x in v] if isinstance(v, list | tuple) else _param(v)
            for k, v in self.params.items()
            if v is not None
        }
        kwargs: dict[str, Any] = {"params": params, "headers": dict(self.headers)}
        if self.body is not None:
            kwargs["content"] = msgspec.json.encode(self.body)
            kwargs["headers"]["Content-Type"] = "application/json"
        return kwargs


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry (exponential backoff with jitter, `Retry-After` first)."""

    max_retries: int = 4
    backoff_s: float = 0.2
    max_backoff_s: float = 10.0

    def delay(self, attempt: int, response: httpx.Response | None) -> float:
        if response is not None:
            try:
                told = float(response.headers.get("retry-after", ""))
            except ValueError:
                told = -1.0
            if told >= 0:
                return min(told, self.max_backoff_s)
        backoff: float = min(self.backoff_s * 2.0**attempt, self.max_backoff_s)
        return backoff * (0.5 + random.random() / 2)  # noqa: S311  (jitter, not a secret)

    def should_retry(self, call: Call[Any], attempt: int, response: httpx.Response | None) -> bool:
        """After a transport failure (`response` None) or an error answer, whether to try again."""
        if attempt >= self.max_retries:
            return False
        if response is None:
            return call.repeatable
        if response.status_code in _SAID_NOTHING_DONE:
            return True
        return response.status_code in _MAYBE_DONE and call.repeatable


def decode(call: Call[T], response: httpx.Response) -> T:
    """The answer of `call`, or its error as a MemstoreError carrying the API's code."""
    if response.status_code >= 400:
        raise error_of(response)
    if call.answer is None:
        return None  # type: ignore[return-value]  # calls without an answer are typed Call[None]
    return msgspec.json.decode(response.content, type=call.answer)


def error_of(response: httpx.Response) -> MemstoreError:
    request_id = response.headers.get("x-request-id")
    try:
        error = msgspec.json.decode(response.content)["error"]
        return MemstoreError(
            response.status_code,
            str(error["code"]),
            str(error["message"]),
            error.get("details") or {},
            request_id,
        )
    except (msgspec.DecodeError, KeyError, TypeError):
        return MemstoreError(response.status_code, "http_error", response.text[:500], {}, request_id)


def unreachable(exc: httpx.TransportError) -> MemstoreError:
    return MemstoreError(0, "unreachable", f"{type(exc).__name__}: {exc}")


# --- the calls ------------------------------------------------------------------------------------


def _messages(messages: Sequence[models.Message | Mapping[str, Any]]) -> list[Any]:
    return [m if isinstance(m, models.Message) else dict(m) for m in messages]


def chunk_body(
    user_id: str,
    messages: Sequence[models.Message | Mapping[str, Any]],
    *,
    agent_id: str | None = None,
    run_id: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    writer: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"user_id": user_id, "messages": _messages(messages)}
    for name, value in (("agent_id", agent_id), ("run_id", run_id), ("writer", writer)):
        if value is not None:
            body[name] = value
    if metadata:
        body["metadata"] = dict(metadata)
    return body


def add_chunk(body: dict[str, Any], idempotency_key: str | None) -> Call[models.ChunkAccepted]:
    key = idempotency_key or f"sdk-{uuid.uuid4()}"
    return Call(
        "POST",
        "/v1/chunks",
        models.ChunkAccepted,
        body=body,
        headers={"Idempotency-Key": key},
        repeatable=True,
    )


class _Batch(msgspec.Struct):
    results: list[models.ChunkAccepted]


# A status read waits on the server at most this long for chunks to finish (well within the client's
# timeout), for at most this many chunks a request.
WAIT_STEP_S = 10.0
STATUS_IDS = 100


def get_chunk(chunk_id: uuid.UUID | str, wait_s: float) -> Call[models.ChunkStatus]:
    return get(f"/v1/chunks/{chunk_id}", models.ChunkStatus, wait=wait_s or None)


def get_chunks(chunk_ids: Sequence[str], wait_s: float) -> Call[models.ChunkStatuses]:
    return get("/v1/chunks", models.ChunkStatuses, chunk_id=list(chunk_ids), wait=wait_s or None)


def add_chunks(bodies: Sequence[dict[str, Any]]) -> Call[_Batch]:
    chunks = [{"idempotency_key": f"sdk-{uuid.uuid4()}", **b} for b in bodies]
    return Call("POST", "/v1/chunks/batch", _Batch, body={"chunks": chunks}, repeatable=True)


def get(path: str, answer: type[T], **params: Any) -> Call[T]:
    return Call("GET", path, answer, params=params, repeatable=True)


def post(path: str, answer: type[T], body: dict[str, Any]) -> Call[T]:
    return Call("POST", path, answer, body={k: v for k, v in body.items() if v is not None})


def patch(path: str, answer: type[T], body: dict[str, Any]) -> Call[T]:
    return Call("PATCH", path, answer, body={k: v for k, v in body.items() if v is not None})


def delete(path: str, answer: type[T], **params: Any) -> Call[T]:
    return Call("DELETE", path, answer, params=params)


class _Search(msgspec.Struct):
    results: list[models.SearchResult]


# Calls shared verbatim by both clients (each is one request; the clients add sending and paging).


def list_memories(
    user_id: str,
    *,
    status: str = "active",
    as_of: datetime | None = None,
    agent_id: str | None = None,
    limit: int = 100,
    cursor: str | None = None,
    include_expired: bool = False,
    valid_at: datetime | None = None,
) -> Call[models.MemoryPage]:
    return get(
        "/v1/memories",
        models.MemoryPage,
        user_id=user_id,
        status=status,
        as_of=as_of,
        valid_at=valid_at,
        agent_id=agent_id,
        limit=limit,
        cursor=cursor,
        include_expired=include_expired or None,
    )


def edit_memory(
    memory_id: uuid.UUID | str,
    content: str | None,
    tags: Sequence[str] | None,
    reason: str | None,
    expires_at: datetime | msgspec.UnsetType | None,
) -> Call[models.Memory]:
    """A hand edit; `expires_at` None sends null (never expires), UNSET leaves it out (as it was)."""
    body = {"content": content, "tags": list(tags) if tags is not None else None, "reason": reason}
    call = patch(f"/v1/memories/{memory_id}", models.Memory, body)
    if expires_at is msgspec.UNSET:
        return call
    return Call(call.method, call.path, call.answer, body={**call.body, "expires_at": expires_at})


def search(
    user_id: str,
    query: str,
    *,
    top_k: int = 10,
    as_of: datetime | None = None,
    agent_id: str | None = None,
    mode: str = "hybrid",
    include_expired: bool = False,
    valid_at: datetime | None = None,
    reference_time: datetime | None = None,
) -> Call[_Search]:
    body = {"user_id": user_id, "query": query, "top_k": top_k, "as_of": as_of, "agent_id": agent_id}
    options = (
        {"mode": mode}
        | ({"include_expired": True} if include_expired else {})
        | ({"valid_at": valid_at} if valid_at is not None else {})
        | ({"reference_time": reference_time} if reference_time is not None else {})
    )
    call = post("/v1/memories/search", _Search, body | options)
    return Call(call.method, call.path, call.answer, body=call.body, repeatable=True)  # a read


def list_changesets(
    *,
    user_id: str | None = None,
    writer: str | None = None,
    model: str | None = None,
    kind: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> Call[models.ChangesetPage]:
    return get(
        "/v1/admin/changesets",
        models.ChangesetPage,
        user_id=user_id,
        writer=writer,
        model=model,
        kind=kind,
        since=since,
        until=until,
        limit=limit,
        cursor=cursor,
    )


def rollback(
    memory_id: uuid.UUID | str, to_version: int, dry_run: bool, reason: str | None
) -> Call[models.Diff]:
    body = {"to_version": to_version, "dry_run": dry_run, "reason": reason}
    return post(f"/v1/admin/memories/{memory_id}/rollback", models.Diff, body)


def revert(
    changeset_id: uuid.UUID | str, dry_run: bool, force: bool, reason: str | None
) -> Call[models.Diff]:
    body = {"dry_run": dry_run, "force": force, "reason": reason}
    return post(f"/v1/admin/changesets/{changeset_id}/revert", models.Diff, body)


def restore(user_id: str, as_of: datetime, dry_run: bool, reason: str | None) -> Call[models.Diff]:
    body = {"as_of": as_of, "dry_run": dry_run, "reason": reason}
    return post(f"/v1/admin/users/{_path(user_id)}/restore", models.Diff, body)


def bulk_revert(
    since: datetime,
    *,
    until: datetime | None = None,
    writer: str | None = None,
    model: str | None = None,
    user_id: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    reason: str | None = None,
) -> Call[models.Diff]:
    body = {
        "since": since,
        "until": until,
        "writer": writer,
        "model": model,
        "user_id": user_id,
        "dry_run": dry_run,
        "force": force,
        "reason": reason,
    }
    return post("/v1/admin/revert", models.Diff, body)


def list_users(
    prefix: str | None = None, limit: int = 100, cursor: str | None = None
) -> Call[models.UserPage]:
    return get("/v1/admin/users", models.UserPage, prefix=prefix, limit=limit, cursor=cursor)


def list_chunks(
    status: str = "all", user_id: str | None = None, limit: int = 100, cursor: str | None = None
) -> Call[models.ChunkPage]:
    return get(
        "/v1/admin/chunks", models.ChunkPage, status=status, user_id=user_id, limit=limit, cursor=cursor
    )


def list_audit(
    since: datetime | None = None, action: str | None = None, limit: int = 100, cursor: str | None = None
) -> Call[models.AuditPage]:
    return get("/v1/admin/audit", models.AuditPage, since=since, action=action, limit=limit, cursor=cursor)


def import_user(user_id: str, records: Mapping[str, Sequence[Mapping[str, Any]]]) -> Call[models.Imported]:
    body = {kind: list(records.get(kind, ())) for kind in ("chunks", "changesets", "memories")}
    # Loading a batch twice writes nothing the second time: safe to repeat.
    return Call(
        "POST", f"/v1/admin/users/{_path(user_id)}/import", models.Imported, body=body, repeatable=True
    )


def create_key(name: str, roles: Sequence[str]) -> Call[models.NewKey]:
    return post("/v1/admin/keys", models.NewKey, {"name": name, "roles": list(roles)})


def create_webhook(
    url: str, event_types: Sequence[str], description: str | None, include_content: bool, enabled: bool
) -> Call[models.NewWebhook]:
    body = {
        "url": url,
        "event_types": list(event_types),
        "description": description,
        "include_content": include_content,
        "enabled": enabled,
    }
    return post("/v1/admin/webhooks", models.NewWebhook, body)


def update_webhook(webhook_id: uuid.UUID | str, changes: Mapping[str, Any]) -> Call[models.Webhook]:
    # Sent as given: a None clears a field (`description`); absent fields stay as they are.
    return Call(
        "PATCH", f"/v1/admin/webhooks/{webhook_id}", models.Webhook, body=dict(changes), repeatable=True
    )


def delete_webhook(webhook_id: uuid.UUID | str) -> Call[None]:
    return Call("DELETE", f"/v1/admin/webhooks/{webhook_id}", None)


def list_webhook_deliveries(
    webhook_id: uuid.UUID | str, status: str | None = None, limit: int = 100, cursor: str | None = None
) -> Call[models.DeliveryPage]:
    return get(
        f"/v1/admin/webhooks/{webhook_id}/deliveries",
        models.DeliveryPage,
        status=status,
        limit=limit,
        cursor=cursor,
    )


def _path(segment: str) -> str:
    """A user id as one path segment (ids may hold any character)."""
    return quote(segment, safe="")
