"""Embedders: text -> vector, behind one protocol so the model can change without touching callers.

Every embedder built here comes wrapped in a `CoalescedEmbedder` (a cache of vectors, and concurrent
calls sharing model runs), the hashing one included: its model costs little, but one path for all
keeps the counts a test reads (`embedder_counts`) the same as those of the default embedder.
"""

from __future__ import annotations

from app.config import Settings
from app.embeddings.base import Embedder
from app.embeddings.coalesced import CoalescedEmbedder, EmbedderCounts
from app.embeddings.hashing import HashingEmbedder

__all__ = [
    "CoalescedEmbedder",
    "Embedder",
    "EmbedderCounts",
    "Embedders",
    "HashingEmbedder",
    "embed_queries",
    "embedder_counts",
    "embedder_from_settings",
]

EMBEDDERS = ("onnx", "e5", "hashing", "openai", "local")


def embedder_from_settings(settings: Settings, name: str | None = None) -> CoalescedEmbedder:
    """The embedder named `name` (default `MEMSTORE_EMBEDDER`) configured from `MEMSTORE_EMBEDDER_*`,
    with its cache and shared model runs."""
    return CoalescedEmbedder(model_from_settings(settings, name), cache_size=settings.embedder_cache_size)


class Embedders:
    """A process's embedders by name (`EMBEDDERS`): the deployment's (`MEMSTORE_EMBEDDER`) and those its
    tenants chose (`embedder` in the tenant settings), each built once, when first asked for, so a
    process loads a model only when a tenant that uses it needs it."""

    def __init__(self, settings: Settings, default: Embedder | None = None) -> None:
        self.settings = settings
        self._built: dict[str, Embedder] = {}
        if default is not None:
            self._built[settings.embedder] = default

    @property
    def default(self) -> Embedder:
        """The deployment's embedder."""
        return self.get(None)

    def get(self, name: str | None) -> Embedder:
        """The embedder `name` (None: the deployment's), built on first use."""
        key = name or self.settings.embedder
        built = self._built.get(key)
        if built is None:
            built = self._built[key] = embedder_from_settings(self.settings, key)
        return built

    def loaded(self) -> tuple[str, ...]:
        """The embedders built so far, by name."""
        return tuple(self._built)

    async def aclose(self) -> None:
        for embedder in self._built.values():
            await embedder.aclose()


async def embed_queries(embedder: Embedder, texts: list[str]) -> list[list[float]]:
    """Vectors of search queries (`CoalescedEmbedder.embed_queries`); a bare model built by hand embeds
    them as it embeds any text."""
    if isinstance(embedder, CoalescedEmbedder):
        return await embedder.embed_queries(texts)
    return await embedder.embed(texts)


def embedder_counts(embedder: Embedder) -> EmbedderCounts:
    """What `embedder` did so far: model runs, texts embedded, cache hits (`embedder_from_settings`'s
    embedders count them; a bare model built by hand does not, and is refused rather than read as 0)."""
    if not isinstance(embedder, CoalescedEmbedder):
        msg = f"{type(embedder).__name__} counts nothing: build it with embedder_from_settings"
        raise TypeError(msg)
    return embedder.counts


def model_from_settings(settings: Settings, name: str | None = None) -> Embedder:
    """The bare model behind `embedder_from_settings` (no cache, no coalescing)."""
    name = name or settings.embedder
    if name == "hashing":
        return HashingEmbedder(settings.embedding_dim)
    if name == "onnx":
        from app.embeddings.onnx import OnnxEmbedder

        return OnnxEmbedder(
            settings.embedder_model, settings.embedding_dim, threads=settings.embedder_threads
        )
    if name == "e5":
        from app.embeddings.e5 import E5Embedder

        # The model is fixed (the pinned, bundled multilingual-e5-small): embedder_model is not read.
        return E5Embedder(settings.embedding_dim, threads=settings.embedder_threads)
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
