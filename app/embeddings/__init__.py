"""Embedders: text -> vector, behind one protocol so the model can change without touching callers."""

from __future__ import annotations

from app.embeddings.base import Embedder
from app.embeddings.hashing import HashingEmbedder

__all__ = ["Embedder", "HashingEmbedder", "get_embedder"]


def get_embedder(name: str, dim: int) -> Embedder:
    """The embedder configured by `MEMSTORE_EMBEDDER`."""
    if name == "hashing":
        return HashingEmbedder(dim)
    msg = f"unknown embedder {name!r} (available: hashing)"
    raise ValueError(msg)
