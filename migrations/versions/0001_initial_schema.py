"""initial schema: tenants, keys, the chunk inbox, memories with their versions, changesets, audit

The tables the architecture names, plus `scopes` (per-user chunk sequence) and `audit_heads` (the end
of each tenant's hash chain). Triggers make history append-only (architecture invariant 4).

Revision ID: 0001
Revises: 
Create Date: 2026-12-02 16:38:25.870726
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects import postgresql

from app.config import get_settings

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The vector dimension is a deployment setting, fixed when this migration first runs.
EMBEDDING_DIM = get_settings().embedding_dim

# History is append-only. The one exception is an explicit GDPR purge, which sets the transaction-local
# flag `memstore.purge` (and is itself recorded in the audit log, without content).
APPEND_ONLY_FUNCTION = """
CREATE FUNCTION memstore_forbid_history_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('memstore.purge', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END
$$;
"""

# A changeset may change its status (applied -> reverted) and nothing else.
CHANGESET_FUNCTION = """
CREATE FUNCTION memstore_changeset_status_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF current_setting('memstore.purge', true) = 'on' THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'changesets are append-only: DELETE is not allowed'
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF (to_jsonb(NEW) - 'status') IS DISTINCT FROM (to_jsonb(OLD) - 'status') THEN
        RAISE EXCEPTION 'changesets: only status may change'
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF NOT (OLD.status = 'applied' AND NEW.status = 'reverted') AND NEW.status IS DISTINCT FROM OLD.status THEN
        RAISE EXCEPTION 'changesets: status may only go from applied to reverted'
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END
$$;
"""

# An audit event is written unsealed and sealed once: seq, prev_hash and hash go from NULL to a value,
# and nothing else may change, ever.
AUDIT_FUNCTION = """
CREATE FUNCTION memstore_audit_seal_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND OLD.hash IS NULL AND OLD.seq IS NULL AND OLD.prev_hash IS NULL
       AND NEW.hash IS NOT NULL AND NEW.seq IS NOT NULL AND NEW.prev_hash IS NOT NULL
       AND (to_jsonb(NEW) - 'seq' - 'prev_hash' - 'hash') = (to_jsonb(OLD) - 'seq' - 'prev_hash' - 'hash') THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'DELETE' AND current_setting('memstore.purge', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit_events is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'restrict_violation';
END
$$;
"""

APPEND_ONLY_TABLES = ("memory_versions", "audit_events")


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.create_table('tenants',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('settings', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tenants')),
    sa.UniqueConstraint('name', name=op.f('uq_tenants_name'))
    )
    op.create_table('api_keys',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('roles', postgresql.ARRAY(sa.Text()), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_api_keys_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_keys')),
    sa.UniqueConstraint('key_hash', name=op.f('uq_api_keys_key_hash'))
    )
    op.create_index(op.f('ix_api_keys_tenant_id'), 'api_keys', ['tenant_id'], unique=False)
    op.create_table('audit_events',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=True), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('seq', sa.BigInteger(), nullable=True),
    sa.Column('actor', sa.String(length=200), nullable=False),
    sa.Column('action', sa.String(length=100), nullable=False),
    sa.Column('target_type', sa.String(length=50), nullable=True),
    sa.Column('target_id', sa.String(length=200), nullable=True),
    sa.Column('request_id', sa.String(length=100), nullable=True),
    sa.Column('summary', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('prev_hash', sa.String(length=64), nullable=True),
    sa.Column('hash', sa.String(length=64), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_audit_events_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_events'))
    )
    op.create_index('ix_audit_events_tenant_time', 'audit_events', ['tenant_id', 'created_at'], unique=False)
    op.create_index('uq_audit_events_tenant_seq', 'audit_events', ['tenant_id', 'seq'], unique=True)
    op.create_index('ix_audit_events_unsealed', 'audit_events', ['tenant_id', 'id'], unique=False, postgresql_where=sa.text('hash IS NULL'))
    op.create_table('audit_heads',
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('seq', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('hash', sa.String(length=64), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_audit_heads_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('tenant_id', name=op.f('pk_audit_heads'))
    )
    op.create_table('changesets',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('user_id', sa.String(length=200), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('chunk_id', sa.UUID(), nullable=True),
    sa.Column('writer', sa.String(length=100), nullable=True),
    sa.Column('model', sa.String(length=200), nullable=True),
    sa.Column('profile', sa.String(length=50), nullable=True),
    sa.Column('prompt_hash', sa.String(length=64), nullable=True),
    sa.Column('raw_output', sa.Text(), nullable=True),
    sa.Column('ops', postgresql.JSONB(astext_type=sa.Text()), server_default='[]', nullable=False),
    sa.Column('guards', postgresql.JSONB(astext_type=sa.Text()), server_default='[]', nullable=False),
    sa.Column('usage', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('target', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('status', sa.String(length=16), server_default='applied', nullable=False),
    sa.Column('actor', sa.String(length=200), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("kind IN ('writer', 'rollback', 'revert', 'restore', 'manual')", name=op.f('ck_changesets_kind')),
    sa.CheckConstraint("status IN ('applied', 'reverted')", name=op.f('ck_changesets_status')),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_changesets_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_changesets'))
    )
    op.create_index('ix_changesets_scope_time', 'changesets', ['tenant_id', 'user_id', 'created_at'], unique=False)
    op.create_index('ix_changesets_tenant_model_time', 'changesets', ['tenant_id', 'writer', 'model', 'created_at'], unique=False)
    op.create_index('uq_changesets_writer_chunk', 'changesets', ['chunk_id'], unique=True, postgresql_where=sa.text("kind = 'writer'"))
    op.create_table('chunks',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('user_id', sa.String(length=200), nullable=False),
    sa.Column('agent_id', sa.String(length=200), nullable=True),
    sa.Column('run_id', sa.String(length=200), nullable=True),
    sa.Column('seq', sa.BigInteger(), nullable=False),
    sa.Column('messages', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('metadata', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('idempotency_key', sa.String(length=200), nullable=True),
    sa.Column('body_hash', sa.String(length=64), nullable=False),
    sa.Column('writer', sa.String(length=100), nullable=True),
    sa.Column('status', sa.String(length=16), server_default='queued', nullable=False),
    sa.Column('attempts', sa.Integer(), server_default='0', nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('raw_output', sa.Text(), nullable=True),
    sa.Column('changeset_id', sa.UUID(), nullable=True),
    sa.Column('available_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('received_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('applied_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("status IN ('queued', 'processing', 'applied', 'failed')", name=op.f('ck_chunks_status')),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_chunks_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_chunks'))
    )
    op.create_index('ix_chunks_pending', 'chunks', ['updated_at'], unique=False, postgresql_where=sa.text("status IN ('queued', 'processing')"))
    op.create_index('ix_chunks_scope_pending', 'chunks', ['tenant_id', 'user_id', 'seq'], unique=False, postgresql_where=sa.text("status IN ('queued', 'processing')"))
    op.create_index('uq_chunks_scope_seq', 'chunks', ['tenant_id', 'user_id', 'seq'], unique=True)
    op.create_index('uq_chunks_tenant_idempotency_key', 'chunks', ['tenant_id', 'idempotency_key'], unique=True, postgresql_where=sa.text('idempotency_key IS NOT NULL'))
    op.create_table('memories',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('user_id', sa.String(length=200), nullable=False),
    sa.Column('agent_id', sa.String(length=200), nullable=True),
    sa.Column('run_id', sa.String(length=200), nullable=True),
    sa.Column('content', sa.Text(), nullable=False),
    sa.Column('tags', postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False),
    sa.Column('owner', sa.String(length=16), server_default='user', nullable=False),
    sa.Column('memory_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('status', sa.String(length=16), server_default='active', nullable=False),
    sa.Column('version', sa.Integer(), server_default='1', nullable=False),
    sa.Column('embedding', Vector(EMBEDDING_DIM), nullable=True),
    sa.Column('changeset_id', sa.UUID(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("owner IN ('user', 'agent')", name=op.f('ck_memories_owner')),
    sa.CheckConstraint("status IN ('active', 'superseded', 'deleted')", name=op.f('ck_memories_status')),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_memories_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_memories'))
    )
    op.create_index('ix_memories_scope', 'memories', ['tenant_id', 'user_id', 'status'], unique=False)
    op.create_table('memory_versions',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=True), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('user_id', sa.String(length=200), nullable=False),
    sa.Column('memory_id', sa.UUID(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('op', sa.String(length=16), nullable=False),
    sa.Column('content', sa.Text(), nullable=False),
    sa.Column('tags', postgresql.ARRAY(sa.Text()), nullable=False),
    sa.Column('owner', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('memory_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('embedding', Vector(EMBEDDING_DIM), nullable=True),
    sa.Column('supersedes', postgresql.ARRAY(sa.UUID()), nullable=True),
    sa.Column('superseded_by', sa.UUID(), nullable=True),
    sa.Column('changeset_id', sa.UUID(), nullable=False),
    sa.Column('chunk_id', sa.UUID(), nullable=True),
    sa.Column('writer', sa.String(length=100), nullable=True),
    sa.Column('model', sa.String(length=200), nullable=True),
    sa.Column('profile', sa.String(length=50), nullable=True),
    sa.Column('prompt_hash', sa.String(length=64), nullable=True),
    sa.Column('actor', sa.String(length=200), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("op IN ('ADD', 'UPDATE', 'SUPERSEDE', 'DELETE', 'ROLLBACK', 'RESTORE')", name=op.f('ck_memory_versions_op')),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_memory_versions_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_memory_versions'))
    )
    op.create_index('ix_memory_versions_changeset', 'memory_versions', ['changeset_id'], unique=False)
    op.create_index('ix_memory_versions_scope_time', 'memory_versions', ['tenant_id', 'user_id', 'created_at'], unique=False)
    op.create_index('uq_memory_versions_memory_version', 'memory_versions', ['memory_id', 'version'], unique=True)
    op.create_table('scopes',
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('user_id', sa.String(length=200), nullable=False),
    sa.Column('last_seq', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_scopes_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('tenant_id', 'user_id', name=op.f('pk_scopes'))
    )
    op.execute(APPEND_ONLY_FUNCTION)
    op.execute(CHANGESET_FUNCTION)
    op.execute(AUDIT_FUNCTION)
    op.execute(
        "CREATE TRIGGER memory_versions_append_only BEFORE UPDATE OR DELETE ON memory_versions "
        "FOR EACH ROW EXECUTE FUNCTION memstore_forbid_history_change()"
    )
    op.execute(
        "CREATE TRIGGER audit_events_append_only BEFORE UPDATE OR DELETE ON audit_events "
        "FOR EACH ROW EXECUTE FUNCTION memstore_audit_seal_only()"
    )
    for table in APPEND_ONLY_TABLES:
        op.execute(
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION memstore_forbid_history_change()"
        )
    op.execute(
        "CREATE TRIGGER changesets_status_only BEFORE UPDATE OR DELETE ON changesets "
        "FOR EACH ROW EXECUTE FUNCTION memstore_changeset_status_only()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS changesets_status_only ON changesets")
    for table in APPEND_ONLY_TABLES:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table}")
        op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
    op.execute("DROP FUNCTION IF EXISTS memstore_changeset_status_only()")
    op.execute("DROP FUNCTION IF EXISTS memstore_audit_seal_only()")
    op.execute("DROP FUNCTION IF EXISTS memstore_forbid_history_change()")
    op.drop_table('scopes')
    op.drop_index('uq_memory_versions_memory_version', table_name='memory_versions')
    op.drop_index('ix_memory_versions_scope_time', table_name='memory_versions')
    op.drop_index('ix_memory_versions_changeset', table_name='memory_versions')
    op.drop_table('memory_versions')
    op.drop_index('ix_memories_scope', table_name='memories')
    op.drop_table('memories')
    op.drop_index('uq_chunks_tenant_idempotency_key', table_name='chunks', postgresql_where=sa.text('idempotency_key IS NOT NULL'))
    op.drop_index('uq_chunks_scope_seq', table_name='chunks')
    op.drop_index('ix_chunks_scope_pending', table_name='chunks', postgresql_where=sa.text("status IN ('queued', 'processing')"))
    op.drop_index('ix_chunks_pending', table_name='chunks', postgresql_where=sa.text("status IN ('queued', 'processing')"))
    op.drop_table('chunks')
    op.drop_index('uq_changesets_writer_chunk', table_name='changesets', postgresql_where=sa.text("kind = 'writer'"))
    op.drop_index('ix_changesets_tenant_model_time', table_name='changesets')
    op.drop_index('ix_changesets_scope_time', table_name='changesets')
    op.drop_table('changesets')
    op.drop_table('audit_heads')
    op.drop_index('ix_audit_events_unsealed', table_name='audit_events', postgresql_where=sa.text('hash IS NULL'))
    op.drop_index('uq_audit_events_tenant_seq', table_name='audit_events')
    op.drop_index('ix_audit_events_tenant_time', table_name='audit_events')
    op.drop_table('audit_events')
    op.drop_index(op.f('ix_api_keys_tenant_id'), table_name='api_keys')
    op.drop_table('api_keys')
    op.drop_table('tenants')
