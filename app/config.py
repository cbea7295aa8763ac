"""The one settings object, read from ``MEMSTORE_*`` environment variables (and an optional file)."""

from __future__ import annotations

import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.db.engine import postgres_target
from app.lib.logging import register_secrets

LogFormat = Literal["auto", "console", "json"]
DestructiveKind = Literal["DELETE", "SUPERSEDE", "UPDATE"]

# What a stopping worker waits beyond a writer call: the apply and the give-back of what is left.
_SHUTDOWN_MARGIN_S = 15


class Settings(BaseSettings):
    """Every knob of the service; each has a default so an empty environment runs the embedded stack."""

    model_config = SettingsConfigDict(
        env_prefix="MEMSTORE_",
        env_file=os.environ.get("MEMSTORE_CONFIG_FILE", ".env"),
        env_file_encoding="utf-8",
        extra="ignore",
    )

    # --- where the state lives -------------------------------------------------------------
    database_url: str | None = Field(
        default=None,
        description="URL of Postgres with pgvector (postgresql://, postgres:// or postgresql+asyncpg://) "
        "the API and workers connect with, as the service role; unset = embedded.",
    )
    admin_database_url: str | None = Field(
        default=None,
        description="URL as the tables' owner, for migrations and operator commands (tenants, history, "
        "eval, reembed); unset = MEMSTORE_DATABASE_URL.",
    )
    redis_url: str | None = Field(
        default=None, description="Redis URL (redis://host:port/db or unix:///path); unset = embedded."
    )
    data_dir: Path = Field(
        default=Path(".memstore"), description="Directory of the embedded Postgres and Redis data."
    )
    db_pool_size: int = Field(default=10, description="Connections kept open per process.")
    db_max_overflow: int = Field(default=10, description="Extra connections allowed under burst.")
    db_connect_timeout_s: float = Field(default=5.0, description="Seconds to wait for a new DB connection.")

    # --- API -------------------------------------------------------------------------------
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

    # --- ingestion limits --------------------------------------------------------------------
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
        default=200.0,
        description="Requests a second per API key, across all API processes (0: no limit); more: 429.",
        ge=0,
    )
    rate_limit_burst: int = Field(
        default=400, description="Requests an API key may make at once before its rate applies.", ge=0
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

    # --- workers ---------------------------------------------------------------------------
    worker_max_jobs: int = Field(default=32, description="Concurrent jobs per worker process.")
    worker_job_timeout_s: float = Field(default=300.0, description="A job running longer is cancelled.")
    worker_poll_delay_s: float = Field(
        default=0.5,
        description="Seconds between a worker's looks at the queue when no wake-up reaches it (the most an "
        "idle scope's chunk waits if a wake-up is lost).",
    )
    worker_wake: bool = Field(
        default=True,
        description="The API publishes a wake-up with each batch of jobs it enqueues, so an idle worker "
        "looks at the queue at once instead of at its next poll.",
    )
    worker_shutdown_wait_s: int = Field(
        default=75,
        description="Seconds in-flight jobs get to finish after SIGTERM; at least MEMSTORE_WRITER_TIMEOUT_S "
        "(unset: it + 15 s), so a writer call under way ends and is applied instead of being cut off.",
    )
    worker_metrics_port: int | None = Field(
        default=None, description="Port on which each worker process serves /metrics; unset: none."
    )
    sweep_interval_s: int = Field(default=10, description="Seconds between sweeper passes.")
    sweep_min_age_s: float = Field(
        default=15.0, description="Queued chunks older than this are re-enqueued by the sweeper."
    )
    max_attempts: int = Field(default=5, description="Writer attempts per chunk before it is failed.")
    retry_backoff_s: float = Field(
        default=2.0, description="Delay before a chunk's second attempt; doubles each attempt (with jitter)."
    )
    retry_backoff_max_s: float = Field(default=60.0, description="Longest delay between two attempts.")
    context_messages: int = Field(
        default=10, description="Earlier messages of the scope shown to the writer for coreference."
    )
    candidate_limit: int = Field(default=10, description="Existing memories shown to the writer per query.")
    writer_timeout_s: float = Field(default=60.0, description="Longest a writer may take for one chunk.")
    writer_plugins: dict[str, str] = Field(
        default_factory=dict,
        description='Extra writers by import path, as JSON: {"name": "package.module:WriterClass"}.',
    )

    # --- writer and embeddings -------------------------------------------------------------
    writer: str = Field(
        default="offline",
        description="Default writer: offline, openai (MEMSTORE_WRITER_* endpoint) or a writers-file name.",
        min_length=1,
    )
    shadow_writers: list[str] = Field(
        default_factory=list,
        description="Writers (by name) that also write every chunk into a shadow bank of their own, as JSON.",
    )
    shadow_max_jobs: int = Field(
        default=8, ge=1, description="Shadow banks a worker process drains at once, besides its own jobs."
    )
    compare_match_threshold: float = Field(
        default=0.9, gt=0.0, le=1.0, description="Cosine similarity at which two banks' memories match."
    )
    writers_file: Path | None = Field(
        default=None, description="TOML file declaring named writers ([writers.NAME] tables); see docs."
    )
    writer_profile: str = Field(
        default="hy-memory",
        description="Protocol spoken to the openai writer: hy-memory, mem0, mem0-v3, memos, simple.",
    )
    writer_base_url: str = Field(
        default="http://127.0.0.1:8001/v1", description="OpenAI-compatible endpoint of the writer model."
    )
    writer_model: str = Field(default="hy-memory", description="Model name sent to the writer endpoint.")
    writer_api_key: str | None = Field(default=None, description="Bearer key for the writer endpoint.")
    writer_request_timeout_s: float = Field(
        default=30.0, description="Longest one HTTP request to the writer model may take."
    )
    writer_max_retries: int = Field(
        default=2, description="Retries of one model request on timeouts, 429 and 5xx (jittered backoff)."
    )
    writer_max_concurrency: int = Field(
        default=64, description="Model requests in flight per process and writer (more wait their turn)."
    )
    writer_max_tokens: int = Field(
        default=8192,
        description="Upper bound of max_tokens per model request (profiles ask what their reference asks; "
        "a cut-off answer is asked again with twice its budget, up to this).",
    )
    writer_response_format: Literal["auto", "json_schema", "json_object_schema", "json_object", "none"] = (
        Field(
            default="auto",
            description="Structured output: auto sends what each profile's reference sends, a weaker form "
            "if refused (docs/writers.md).",
        )
    )
    writer_extra_body: dict[str, Any] = Field(
        default_factory=dict, description="JSON merged into every model request body (vLLM options ...)."
    )
    writer_prompts_dir: Path | None = Field(
        default=None, description="Directory of replacement prompt templates (<profile>/<name>.txt)."
    )
    writer_max_ops: int = Field(
        default=50, description="Most ops applied from one chunk; the rest are dropped."
    )
    max_memory_chars: int = Field(default=2_000, description="Longest memory content a writer may store.")
    destructive_ops: Literal["allow", "review", "deny"] = Field(
        default="allow",
        description="Writer ops that destroy: allow (applied), review (held for a human) or deny (dropped).",
    )
    destructive_kinds: list[DestructiveKind] = Field(
        default_factory=lambda: list[DestructiveKind](["DELETE", "SUPERSEDE"]),
        description="Which writer ops count as destructive, as JSON (tenants may override).",
        min_length=1,
    )
    duplicate_threshold: float = Field(
        default=0.95,
        description="Cosine similarity at which an ADD is a near-duplicate of an active memory (NOOP).",
        gt=0.0,
        le=1.0,
    )
    embedder: str = Field(
        default="onnx",
        description="Embedder name: onnx (all-MiniLM-L6-v2 in-process, semantic), hashing (lexical, "
        "dependency-free), openai (an /v1/embeddings endpoint), local (sentence-transformers extra).",
    )
    embedding_dim: int = Field(
        default=384, description="Vector dimension of memories; fixed by the initial migration."
    )
    embedder_base_url: str = Field(
        default="http://127.0.0.1:8002/v1", description="OpenAI-compatible endpoint of the openai embedder."
    )
    embedder_model: str = Field(
        default="all-MiniLM-L6-v2",
        description="Model name sent to the openai embedder, or the onnx/local embedder's model (the "
        "packaged all-MiniLM-L6-v2, or a directory).",
    )
    embedder_threads: int = Field(
        default=0, ge=0, description="Threads of one onnx embedding run (0: one per core)."
    )
    embedder_api_key: str | None = Field(default=None, description="Bearer key for the embedder endpoint.")
    embedder_batch_size: int = Field(default=64, description="Texts per embedding request.", ge=1)
    embedder_timeout_s: float = Field(default=10.0, description="Longest one embedding request may take.")
    embedder_max_retries: int = Field(
        default=3, description="Retries of one embedding request on timeouts, 429 and 5xx (with backoff)."
    )

    # --- search ----------------------------------------------------------------------------
    search_ef_search: int = Field(
        default=200, description="hnsw.ef_search of approximate (HNSW) searches: recall against latency."
    )
    search_hnsw_min_scope: int = Field(
        default=20_000,
        description="Active memories above which a user's search uses the HNSW index instead of exact.",
    )
    search_pool: int = Field(
        default=100, description="Candidates each ranking (vector, lexical) contributes before fusion."
    )
    graph_index_batch: int = Field(
        default=64,
        ge=1,
        description="Memories the workers add to the vector graph per transaction (a writer wanting one "
        "of them waits for one batch at most).",
    )
    graph_index_budget_s: float = Field(
        default=0.8,
        ge=0.0,
        description="Seconds each worker process spends adding memories to the graph per second, at most; "
        "0 turns the indexer off (search then reads every new memory exactly).",
    )
    graph_index_all: bool = Field(
        default=False,
        description="Add every active memory to the vector graph, instead of those of the tenants searched "
        "over all users and the scopes above search_hnsw_min_scope (for a deployment whose first such "
        "search must not read a tenant exactly).",
    )
    search_fusion: Literal["relative", "rrf"] = Field(
        default="relative",
        description="How hybrid search combines its rankings: relative (each score over its best, "
        "weighted) or rrf (reciprocal rank fusion).",
    )
    search_vector_weight: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Weight of the vector ranking in relative fusion (the lexical one weighs 1 - it).",
    )
    search_rrf_k: int = Field(default=60, description="k of reciprocal rank fusion: 1 / (k + rank).", ge=1)
    search_max_top_k: int = Field(default=100, description="Largest top_k a search may ask for.")
    search_as_of_all_users_max_versions: int = Field(
        default=100_000,
        ge=0,
        description="Versions a search over all users as of a time may read (it reads the tenant's history "
        "up to then); more: 422, name a user (0: no bound).",
    )

    # --- answering (POST /v1/answer) -------------------------------------------------------
    reader_base_url: str | None = Field(
        default=None,
        description="OpenAI-compatible endpoint of the model that answers from memories; unset: /v1/answer "
        "answers 501.",
    )
    reader_model: str | None = Field(default=None, description="Model name sent to the reader endpoint.")
    reader_api_key: str | None = Field(default=None, description="Bearer key for the reader endpoint.")
    reader_timeout_s: float = Field(
        default=30.0, gt=0, description="Longest one request to the reader model may take."
    )
    reader_max_tokens: int = Field(default=512, ge=1, description="max_tokens of each reader request.")

    # --- logging ---------------------------------------------------------------------------
    log_level: str = Field(default="INFO", description="Minimum log level.")
    log_format: LogFormat = Field(
        default="auto", description="console (readable), json (production) or auto (json unless a TTY)."
    )

    @field_validator("database_url", "admin_database_url")
    @classmethod
    def _postgres_url(cls, url: str | None) -> str | None:
        """Refuse at start-up a URL no engine could use (another database or driver, unknown options)."""
        if url is not None:
            postgres_target(url)
        return url

    @model_validator(mode="after")
    def _shutdown_wait_covers_a_writer_call(self) -> Settings:
        """A worker stopping waits out the writer calls in flight: cut off, each is paid for again."""
        if "worker_shutdown_wait_s" not in self.model_fields_set:
            self.worker_shutdown_wait_s = math.ceil(self.writer_timeout_s) + _SHUTDOWN_MARGIN_S
        elif self.worker_shutdown_wait_s < self.writer_timeout_s:
            msg = (
                f"MEMSTORE_WORKER_SHUTDOWN_WAIT_S ({self.worker_shutdown_wait_s}) must be at least "
                f"MEMSTORE_WRITER_TIMEOUT_S ({self.writer_timeout_s:g}), or stopping workers cut writer "
                "calls off"
            )
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _secrets_never_logged(self) -> Settings:
        """Whatever they look like, this process's own keys are redacted from its log lines."""
        register_secrets((self.admin_key, self.writer_api_key, self.embedder_api_key, self.reader_api_key))
        return self

    @property
    def owner_database_url(self) -> str | None:
        """Where migrations and operator commands connect: as the tables' owner if configured apart."""
        return self.admin_database_url or self.database_url

    def as_owner(self) -> Settings:
        """These settings, connecting as the tables' owner (operator commands, which span tenants)."""
        return self.model_copy(update={"database_url": self.owner_database_url})

    @property
    def embedded_database(self) -> bool:
        """True when no external Postgres is configured and the embedded one is used."""
        return self.database_url is None

    @property
    def embedded_redis(self) -> bool:
        """True when no external Redis is configured and the embedded one is used."""
        return self.redis_url is None


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings()
