"""The default semantic embedder for tests: the real model, loaded once per test session."""

from __future__ import annotations

from functools import cache

from app.embeddings import CoalescedEmbedder
from app.embeddings.onnx import OnnxEmbedder


@cache
def semantic_embedder() -> CoalescedEmbedder:
    """all-MiniLM-L6-v2 on ONNX Runtime, coalesced as `memstore up` runs it by default (one instance, so
    the model is read and checksummed once however many tests use it). Without a cache: tests that
    compare vectors of separate calls get fresh ones."""
    return CoalescedEmbedder(OnnxEmbedder(), cache_size=0)
