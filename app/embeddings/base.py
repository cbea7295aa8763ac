"""The embedder protocol, and how similar its vectors must be for a memory to count as related."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

# The cosine at which a memory is related enough to a new one to be shown to a writer that reconciles,
# by embedder family. Each embedder has its own scale: on 20 pairs of a new fact and the memory it
# updates or contradicts ("The user moved to Seattle." / "The user lives in Lyon.") against 12 pairs
# of unrelated facts, all-MiniLM-L6-v2 puts every related pair at 0.36 or above and every unrelated
# one at 0.25 or below; the lexical hashing embedder puts 18 of 20 related pairs at 0.15 or above,
# and 9 of 12 unrelated ones at 0.
RELATED_FLOORS = {"onnx": 0.30, "local": 0.30, "hashing": 0.15}


def family(embedder: str) -> str:
    """The embedder family of a name (`onnx:all-MiniLM-L6-v2-int8:384` -> `onnx`, `hashing-v1-384` ->
    `hashing`)."""
    return embedder.split(":", 1)[0].split("-", 1)[0]


def related_floor(embedder: str, protocol_floor: float) -> float:
    """The floor for `embedder` (its name) where Memstore has measured one, else the protocol's own
    (the reference frameworks' floors are on their own embedders' scales)."""
    return RELATED_FLOORS.get(family(embedder), protocol_floor)


@runtime_checkable
class Embedder(Protocol):
    """Maps texts to unit-length vectors of a fixed dimension; cosine distance compares them."""

    name: str  # recorded with the vectors, so a change of embedder is detectable
    dim: int

    async def embed(self, texts: list[str]) -> list[list[float]]: ...

    async def aclose(self) -> None:
        """Release what the embedder holds open (an HTTP client); nothing for in-process ones."""
