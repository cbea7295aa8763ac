"""Webhooks: a tenant's endpoints are told, signed (Standard Webhooks), about changes to its users'
memories, chunks and reviews.

- `events`: what producers call inside their transactions (`announce`): the outbox.
- `repositories`: the tables' SQL (the outbox in one statement; deliveries claimed in per-user order).
- `delivery`: the worker's sender, with retries on a schedule; `jobs`: its cron job.
- `signing`: the Standard Webhooks signature; `ssrf`: where a webhook may not go.
- `services`, `controllers`, `schemas`: `/v1/admin/webhooks`.
"""
