"""ORM models, one module per table. Importing this package registers every table on `metadata`."""

from __future__ import annotations

from app.db.models.api_key import ApiKey
from app.db.models.audit_event import AuditEvent, AuditHead
from app.db.models.changeset import Changeset
from app.db.models.chunk import Chunk
from app.db.models.embedding_config import EmbeddingConfig
from app.db.models.graph_scope import GraphScope
from app.db.models.memory import Memory
from app.db.models.memory_version import MemoryVersion
from app.db.models.review import Review
from app.db.models.scope import Scope
from app.db.models.tenant import Tenant
from app.db.models.webhook import WebhookDelivery, WebhookEndpoint, WebhookEvent
from app.db.models.writer_view import WriterView

__all__ = [
    "ApiKey",
    "AuditEvent",
    "AuditHead",
    "Changeset",
    "Chunk",
    "EmbeddingConfig",
    "GraphScope",
    "Memory",
    "MemoryVersion",
    "Review",
    "Scope",
    "Tenant",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookEvent",
    "WriterView",
]
