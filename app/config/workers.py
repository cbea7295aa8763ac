"""The workers: concurrency, the sweeper, retries, and what a writer is given and allowed."""

import math
from typing import Self

from pydantic import BaseModel, Field, model_validator

# What a stopping worker waits beyond a writer call: the apply and the give-back of what is left.
_SHUTDOWN_MARGIN_S = 15


class WorkerSettings(BaseModel):
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
    scheduler_turn_s: float = Field(
        default=0.5,
        gt=0,
        description="Longest a worker slot drains one scope before the fair scheduler gives the slot to "
        "whoever is next (the scope is ready again behind them): a tenant arriving behind a backlog waits "
        "about this, not for the backlog.",
    )
    tenant_write_weight_max: float = Field(
        default=1.0,
        gt=0,
        description="The most write_weight a tenant's admin may give its own tenant (PATCH "
        "/v1/admin/settings): at 1, a tenant may take a smaller share than the others, not a larger one; "
        "an operator gives any with `memstore tenants set --write-weight`.",
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

    @model_validator(mode="after")
    def _shutdown_wait_covers_a_writer_call(self) -> Self:
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
