"""operator_views: what `memstore status` and `/metrics` read across tenants, as counts and ages only

The service role sees one tenant at a time (migration 0008), yet an operator's screen and the alerts
look at all of them. Four SECURITY DEFINER functions of the tables' owner give the service exactly
that and no more: counts, ages, writer names and error classes (the head of a chunk's `last_error`
up to the colon after which a message may quote the model, at most 80 characters: the kind of fault,
never the model's output or the chunk's messages). Each reads through the partial indexes of
unfinished chunks, failed chunks, unsealed audit events and the review queue's (tenant, status)
prefix, one probe per tenant, so its cost follows the backlog and the tenants, not the tables.
`memstore_writer_stats` is the exception: it reads the writer changesets of its window (no index
serves `changesets.created_at` alone), so only `memstore status` calls it, never a scrape.

- `memstore_operator_status()`: per tenant (shadow banks are their own backlog, `memstore_shadow_*`):
  the queue, the oldest unapplied chunk's age, failed chunks, reviews waiting and the oldest's age,
  the audit chain's unsealed events and the oldest's age, and the sealed head's `seq`.
- `memstore_failed_chunks()`: failed chunks per tenant and error class, with the newest's time.
- `memstore_writer_stats(p_window_s, p_default_writer)`: per writer, over the last `p_window_s`
  seconds: chunks applied and failed, attempts and failed attempts, the writer calls' latency and
  the apply lag (accepted to applied) at the median and the 95th percentile.
- `memstore_operator_gauges()`: one row for each scrape: reviews waiting, the oldest's age, and the
  age of the oldest audit event not yet sealed.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SERVICE_ROLE = "memstore_service"

OPERATOR_STATUS = """
CREATE FUNCTION memstore_operator_status()
RETURNS TABLE (
    tenant_id uuid, tenant text,
    queued bigint, processing bigint, oldest_unapplied_age_s double precision,
    failed bigint,
    reviews_waiting bigint, oldest_review_age_s double precision,
    audit_unsealed bigint, oldest_unsealed_age_s double precision, audit_head_seq bigint
)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT t.id, t.name::text,
           q.queued, q.processing, q.oldest_age_s,
           f.failed,
           r.waiting, r.oldest_age_s,
           a.unsealed, a.oldest_age_s, coalesce(h.seq, 0)
    FROM tenants t
    CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE c.status = 'queued') AS queued,
               count(*) FILTER (WHERE c.status = 'processing') AS processing,
               greatest(coalesce(extract(epoch FROM now() - min(c.received_at)), 0), 0)::double precision
                   AS oldest_age_s
        FROM chunks c WHERE c.tenant_id = t.id AND c.status IN ('queued', 'processing')
    ) q
    CROSS JOIN LATERAL (
        SELECT count(*) AS failed FROM chunks c WHERE c.tenant_id = t.id AND c.status = 'failed'
    ) f
    CROSS JOIN LATERAL (
        SELECT count(*) AS waiting,
               greatest(coalesce(extract(epoch FROM now() - min(v.created_at)), 0), 0)::double precision
                   AS oldest_age_s
        FROM reviews v WHERE v.tenant_id = t.id AND v.status = 'pending'
    ) r
    CROSS JOIN LATERAL (
        SELECT count(*) AS unsealed,
               greatest(coalesce(extract(epoch FROM now() - min(e.created_at)), 0), 0)::double precision
                   AS oldest_age_s
        FROM audit_events e WHERE e.tenant_id = t.id AND e.hash IS NULL
    ) a
    LEFT JOIN audit_heads h ON h.tenant_id = t.id
    WHERE t.shadow_of IS NULL
    ORDER BY t.name
$$;
"""

# The kind of a chunk's fault: its error text up to the first colon ("writer raised ValueError",
# "UniqueViolationError"), or the second after the drain's "writer error:" ("writer error: unparseable
# extract output after one repair request"); what follows may quote the model's output.
FAILED_CHUNKS = """
CREATE FUNCTION memstore_failed_chunks()
RETURNS TABLE (tenant_id uuid, tenant text, error text, chunks bigint, newest_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT t.id, t.name::text, f.error, f.chunks, f.newest_at
    FROM tenants t
    CROSS JOIN LATERAL (
        SELECT left(CASE WHEN e.text LIKE 'writer error:%'
                         THEN 'writer error: ' || btrim(split_part(substr(e.text, 14), ':', 1))
                         ELSE btrim(split_part(e.text, ':', 1)) END, 80) AS error,
               count(*) AS chunks, max(c.updated_at) AS newest_at
        FROM chunks c CROSS JOIN LATERAL (SELECT coalesce(c.last_error, 'unknown') AS text) e
        WHERE c.tenant_id = t.id AND c.status = 'failed'
        GROUP BY 1
    ) f
    WHERE t.shadow_of IS NULL
    ORDER BY f.newest_at DESC
$$;
"""

# A chunk's writer: the one it named, else its tenant's default, else `p_default_writer` (the
# deployment's, which only the caller knows). Attempts: an applied chunk's last attempt succeeded (its
# others failed); a failed chunk's all failed. Chunks still being retried count once they finish. A
# changeset's `usage.latency_ms` is the time its writer calls took; the apply lag is the chunk's time
# from acceptance to applied.
WRITER_STATS = """
CREATE FUNCTION memstore_writer_stats(p_window_s double precision, p_default_writer text)
RETURNS TABLE (
    writer text, applied bigint, failed bigint, attempts bigint, failed_attempts bigint,
    latency_p50_ms double precision, latency_p95_ms double precision,
    apply_lag_p50_s double precision, apply_lag_p95_s double precision
)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    WITH finished AS (
        SELECT coalesce(cs.writer, c.writer, t.settings ->> 'writer', p_default_writer)::text AS writer,
               true AS ok, c.attempts,
               (cs.usage ->> 'latency_ms')::double precision AS latency_ms,
               extract(epoch FROM c.applied_at - c.received_at)::double precision AS lag_s
        FROM changesets cs
        JOIN chunks c ON c.tenant_id = cs.tenant_id AND c.id = cs.chunk_id
        JOIN tenants t ON t.id = cs.tenant_id
        WHERE cs.kind = 'writer' AND cs.created_at >= now() - make_interval(secs => p_window_s)
        UNION ALL
        SELECT coalesce(c.writer, t.settings ->> 'writer', p_default_writer)::text,
               false, c.attempts, NULL, NULL
        FROM chunks c JOIN tenants t ON t.id = c.tenant_id
        WHERE c.status = 'failed' AND c.updated_at >= now() - make_interval(secs => p_window_s)
    )
    SELECT writer,
           count(*) FILTER (WHERE ok), count(*) FILTER (WHERE NOT ok),
           coalesce(sum(greatest(attempts, 1)), 0)::bigint,
           coalesce(sum(greatest(attempts, 1) - CASE WHEN ok THEN 1 ELSE 0 END), 0)::bigint,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms),
           percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms),
           percentile_cont(0.5) WITHIN GROUP (ORDER BY lag_s),
           percentile_cont(0.95) WITHIN GROUP (ORDER BY lag_s)
    FROM finished
    GROUP BY writer
    ORDER BY writer
$$;
"""

# `/metrics`, in the scrape's one statement with `memstore_backlog()`.
OPERATOR_GAUGES = """
CREATE FUNCTION memstore_operator_gauges()
RETURNS TABLE (
    reviews_waiting bigint, review_oldest_age_s double precision, audit_unsealed_age_s double precision
)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT coalesce(sum(r.waiting), 0)::bigint,
           coalesce(max(r.oldest_age_s), 0)::double precision,
           (SELECT greatest(coalesce(extract(epoch FROM now() - min(e.created_at)), 0), 0)::double precision
            FROM audit_events e WHERE e.hash IS NULL)
    FROM tenants t
    CROSS JOIN LATERAL (
        SELECT count(*) AS waiting,
               greatest(coalesce(extract(epoch FROM now() - min(v.created_at)), 0), 0) AS oldest_age_s
        FROM reviews v WHERE v.tenant_id = t.id AND v.status = 'pending'
    ) r
    WHERE t.shadow_of IS NULL
$$;
"""

FUNCTIONS = {
    "memstore_operator_status()": OPERATOR_STATUS,
    "memstore_failed_chunks()": FAILED_CHUNKS,
    "memstore_writer_stats(double precision, text)": WRITER_STATS,
    "memstore_operator_gauges()": OPERATOR_GAUGES,
}


def upgrade() -> None:
    for signature, definition in FUNCTIONS.items():
        op.execute(definition)
        op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
        op.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {SERVICE_ROLE}")


def downgrade() -> None:
    for signature in FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
