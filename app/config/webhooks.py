"""Webhooks (`/v1/admin/webhooks`): where deliveries may go, and how hard they are retried."""

from pydantic import BaseModel, Field


class WebhookSettings(BaseModel):
    webhook_allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts (names, as written in the URL) or addresses / CIDRs (e.g. 10.0.0.0/8) a webhook "
        "may reach although they are loopback, private, link-local or metadata addresses, which are refused "
        "otherwise; a JSON list.",
    )
    webhook_retry_schedule_s: list[float] = Field(
        default_factory=lambda: [5.0, 300.0, 1800.0, 7200.0, 18000.0],
        description="Seconds before each retry of a failed delivery (5 s, 5 min, 30 min, 2 h, 5 h); after "
        "the last, the delivery is given up (status `failed`, still redeliverable by hand).",
    )
    webhook_timeout_s: float = Field(
        default=10.0, gt=0, description="Longest one delivery attempt may take (connect and answer)."
    )
    webhook_batch: int = Field(
        default=64, ge=1, le=1000, description="Deliveries a worker sends at most per round (every second)."
    )
    webhook_secret_overlap_s: float = Field(
        default=86400.0,
        ge=0,
        description="After a secret rotation, how long the previous secret still signs deliveries beside "
        "the new one.",
    )
