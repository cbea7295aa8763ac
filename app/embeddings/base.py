"""The embedder protocol, and how similar its vectors must be for a memory to count as related."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

# The cosine at which a memory is related enough to a new one to be shown to a writer that reconciles,
# by embedder family. Each embedder has its own scale: on 20 pairs of a new fact and the memory it
# updates or contradicts ("The user moved to Seattle." / "The user lives in Lyon.") against 12 pairs
# of unrelated facts, all-MiniLM-L6-v2 puts every related pair at 0.36 or above and every unrelated
# one at 0.25 or below; the lexical hashing embedder puts 18 of 20 related pairs at 0.15 or above,
# and 9 of 12 unrelated ones at 0. multilingual-e5-small (`e5`: memories and the texts compared with
# them are embedded as passages) runs high and narrow: on another 20 + 12 such English pairs it puts
# every related pair at 0.835 to 0.965 and every unrelated one at 0.747 to 0.829 (all-MiniLM-L6-v2 on
# the same pairs: 0.358 and up, 0.283 and below). 0.83 separates them, by 0.006 only: the lowest related
# pairs are changes the model must infer ("became vegetarian" / "favourite dish is beef bourguignon"),
# the highest unrelated ones two facts sharing only "The user".
RELATED_FLOORS = {"onnx": 0.30, "local": 0.30, "hashing": 0.15, "e5": 0.83}


# The cosine an embedder gives a question and a text unrelated to it, by family, where it is far from 0:
# hybrid search's relative fusion counts a vector match from there (`search.repositories`). E5's cosines
# crowd high: LoCoMo questions against random turns of their conversations average 0.758 (p90 0.80),
# and the best matches reach 0.85 to 0.95, so as a share of the best every candidate scored 0.8 to 1 and
# the lexical ranking decided alone; counted from 0.76, LoCoMo's R@10 in hybrid search rose from 0.626
# to 0.652 (bench/retrieval.py; 0.70 and 0.80 gave 0.648 and 0.653). all-MiniLM-L6-v2's average 0.19,
# and counting from there changed nothing measurable (0.661 against 0.662), so it stays at 0.
CHANCE_SIMILARITY = {"e5": 0.76}


def chance_similarity(embedder: str) -> float:
    """The chance-level cosine of `embedder` (its name) where it is measured and matters, else 0."""
    return CHANCE_SIMILARITY.get(family(embedder), 0.0)


def family(embedder: str) -> str:
    """The embedder family of a name (`onnx:all-MiniLM-L6-v2-int8:384` -> `onnx`, `hashing-v1-384` ->
    `hashing`)."""
    return embedder.split(":", 1)[0].split("-", 1)[0]


def related_floor(embedder: str, protocol_floor: float) -> float:
    """The floor for `embedder` (its name) where Memstore has measured one, else the protocol's own
    (the reference frameworks' floors are on their own embedders' scales)."""
    return RELATED_FLOORS.get(family(embedder), protocol_floor)


# How a search query reaches an asymmetric embedder (one trained to embed a query unlike the text it
# should find, as E5 is: "query: " / "passage: "): each query text behind this mark, which no stored
# text can start with (text fields refuse NUL), so that queries and texts share the cache and the runs
# of `coalesced.CoalescedEmbedder` without meeting. Only an embedder that says `asymmetric = True` is
# handed marked texts (`embed_queries`); every other embedder sees queries as plain texts.
QUERY_MARK = "\x00query\x00"


@runtime_checkable
class Embedder(Protocol):
    """Maps texts to unit-length vectors of a fixed dimension; cosine distance compares them."""

    name: str  # recorded with the vectors, so a change of embedder is detectable
    dim: int

    async def embed(self, texts: list[str]) -> list[list[float]]: ...

    async def aclose(self) -> None:
        """Release what the embedder holds open (an HTTP client); nothing for in-process ones."""
