"""The writer: which one, its model endpoint, its budgets, and the guards on what it decides."""

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

DestructiveKind = Literal["DELETE", "SUPERSEDE", "UPDATE"]


class WriterSettings(BaseModel):
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
