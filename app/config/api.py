"""The API process: where it listens, its keys, and the limits it holds each request to."""

from pydantic import BaseModel, Field


class ApiSettings(BaseModel):
    host: str = Field(default="127.0.0.1", description="Address the API binds to.")
    port: int = Field(default=8000, description="Port the API binds to.")
    admin_key: str | None = Field(
        default=None,
        description="Admin key of the embedded bootstrap tenant; generated and printed once if unset.",
    )
    auth_cache_ttl_s: float = Field(
        default=10.0, description="Seconds a resolved API key is cached per process (revocation delay)."
    )
    max_body_bytes: int = Field(default=1_048_576, description="Largest request body accepted (413 above).")

    max_messages_per_chunk: int = Field(default=100, description="Most messages one chunk may carry.")
    max_message_chars: int = Field(default=20_000, description="Longest message content accepted.")
    max_batch_chunks: int = Field(default=100, description="Most chunks one batch request may carry.")
    ingest_writers: int = Field(
        default=2, description="Transactions writing accepted chunks concurrently, per API process."
    )
    ingest_max_group: int = Field(
        default=500, description="Most chunks committed together in one transaction."
    )
    ingest_max_pending: int = Field(
        default=10_000,
        description="Chunks waiting for a transaction per ingest writer and API process; more: 503.",
        ge=1,
    )
    max_bulk_revert_changesets: int = Field(
        default=10_000,
        description="Most changesets one bulk revert (POST /v1/admin/revert) takes; more: 422 (0: no bound).",
        ge=0,
    )
    mem0_compat: bool = Field(
        default=False,
        description="Serve Mem0's REST paths (MemoryClient(host=...)) on Memstore's services (docs/mem0.md).",
    )
    rate_limit_per_s: float = Field(
        default=5_000.0,
        description=(
            "Requests a second per API key, across all API processes (0: no limit); more: 429. A chat "
            "backend posts all its users' turns with one key: this bounds a runaway client, the per-user "
            "limit an abusive end user."
        ),
        ge=0,
    )
    rate_limit_burst: int = Field(
        default=10_000, description="Requests an API key may make at once before its rate applies.", ge=0
    )
    user_rate_limit_per_s: float = Field(
        default=10.0,
        description=(
            "Chunks a second per end user (a tenant's user_id), across all API processes and keys "
            "(0: no limit); more: 429."
        ),
        ge=0,
    )
    user_rate_limit_burst: int = Field(
        default=100,
        description="Chunks one user may send at once (a batch counts each) before the user's rate applies.",
        ge=0,
    )
    max_queued_per_scope: int = Field(
        default=10_000,
        description="Chunks of one user not yet applied before ingestion answers 429 (0: no cap).",
        ge=0,
    )
    max_queued_per_tenant: int = Field(
        default=200_000,
        description="Chunks of one tenant not yet applied before ingestion answers 429 (0: no cap).",
        ge=0,
    )
