"""Embedders: text -> vector, behind one protocol so the model can change without touching callers."""

from __future__ import annotations

from app.config import Settings
from app.embeddings.base import Embedder
from app.embeddings.hashing import HashingEmbedder

__all__ = ["Embedder", "HashingEmbedder", "embedder_from_settings"]

EMBEDDERS = ("onnx", "hashing", "openai", "local")


def embedder_from_settings(settings: Settings, name: str | None = None) -> Embedder:
    """The embedder named `name` (default `MEMSTORE_EMBEDDER`) configured from `MEMSTORE_EMBEDDER_*`."""
    name = name or settings.embedder
    if name == "hashing":
        return HashingEmbedder(settings.embedding_dim)
    if name == "onnx":
        from app.embeddings.onnx import OnnxEmbedder

        return OnnxEmbedder(
            settings.embedder_model, settings.embedding_dim, threads=settings.embedder_threads
        )
    if name == "openai":
        from app.embeddings.openai import OpenAIEmbedder

        return OpenAIEmbedder(
            settings.embedder_base_url,
            settings.embedder_model,
            settings.embedding_dim,
            api_key=settings.embedder_api_key,
            batch_size=settings.embedder_batch_size,
            timeout_s=settings.embedder_timeout_s,
            max_retries=settings.embedder_max_retries,
        )
    if name == "local":
        from app.embeddings.local import LocalEmbedder

        return LocalEmbedder(
            settings.embedder_model, settings.embedding_dim, batch_size=settings.embedder_batch_size
        )
    msg = f"unknown embedder {name!r} (available: {', '.join(EMBEDDERS)})"
    raise ValueError(msg)
