"""The embedder protocol."""

from __future__ import annotations

from typing import Protocol


class Embedder(Protocol):
    """Maps texts to unit-length vectors of a fixed dimension; cosine distance compares them."""

    name: str  # recorded with the vectors, so a change of embedder is detectable
    dim: int

    async def embed(self, texts: list[str]) -> list[list[float]]: ...

    async def aclose(self) -> None:
        """Release what the embedder holds open (an HTTP client); nothing for in-process ones."""
