"""The default semantic embedder for tests: the real model, loaded once per test session."""

from __future__ import annotations

from functools import cache

from app.embeddings.onnx import OnnxEmbedder


@cache
def semantic_embedder() -> OnnxEmbedder:
    """all-MiniLM-L6-v2 on ONNX Runtime, as `memstore up` runs it by default (one instance, so the
    model is read and checksummed once however many tests use it)."""
    return OnnxEmbedder()
