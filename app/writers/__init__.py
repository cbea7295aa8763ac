"""Memory writers: turn new messages plus existing memories into ops (ADD / UPDATE / SUPERSEDE / DELETE)."""

from __future__ import annotations

from app.writers.base import (
    Candidate,
    Message,
    Op,
    OpKind,
    Writer,
    WriteRequest,
    WriterError,
    WriteResult,
)

__all__ = [
    "Candidate",
    "Message",
    "Op",
    "OpKind",
    "WriteRequest",
    "WriteResult",
    "Writer",
    "WriterError",
]
