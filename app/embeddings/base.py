"""The embedder protocol, and how similar its vectors must be for a memory to count as related."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

# The cosine at which a memory is related enough to a new one to be shown to a writer that reconciles,
# by embedder family. Each embedder has its own scale: on 20 pairs of a new fact and the memory it
# updates or contradicts ("The user moved to Seattle." / "The user lives in Lyon.") against 12 pairs
# of unrelated facts, all-MiniLM-L6-v2 puts every related pair at 0.36 or above and every unrelated
# one at 0.25 or below; the lexical hashing embedder puts 18 of 20 related pairs at 0.15 or above,
# and 9 of 12 unrelated ones at 0. multilingual-e5-small (`e5`: memories and the texts compared with
# them are embedded as passages) runs high and narrow, and higher in Chinese and Japanese than in
# English: on tests/data/pairs/e5 (78 related and 77 unrelated pairs per language, in English, German,
# Spanish, Chinese and Japanese: bench/e5_floors.py) related pairs lie at 0.827-0.948 (en),
# 0.861-0.966 (de), 0.878-0.966 (es), 0.912-0.982 (zh) and 0.899-0.983 (ja), unrelated ones at
# 0.759-0.897, 0.832-0.903, 0.842-0.907, 0.876-0.947 and 0.858-0.951: the two overlap in every
# language, so no floor separates them. Missing a related memory costs more than showing an unrelated
# one (the writer cannot reconcile what it is not shown), so the floor sits under every related pair of
# every language: 0.82, 0.007 under the lowest ("The user has relocated to Prague." / "The user lives
# in Melbourne.", 0.827), keeping out 61 % of the English unrelated pairs and none of the others'.
# (0.83, chosen on 20 + 12 English pairs, missed 3 of these 78 English related pairs.)
RELATED_FLOORS = {"onnx": 0.30, "local": 0.30, "hashing": 0.15, "e5": 0.82}


# The cosine from which the near-duplicate rule (`guards.repeats`) may take an ADD for a repeat, by
# embedder family and the ADD's language, where the deployment's `duplicate_threshold` (0.95, set on
# all-MiniLM-L6-v2 and English) would merge distinct facts. E5 puts minimal pairs nearly as close as
# restatements, and the word rules that tell them apart (`distinct.distinct_facts`) read English: a
# German or Spanish weekday or number in words, and every detail in Chinese and Japanese, pass them. On
# tests/data/pairs/e5 (82 restatements and 84 distinct facts per language) the closest distinct pair
# is at 0.952 (en, "allergic to pollen" / "to penicillin"), 0.977 (de, "dienstags" / "donnerstags"),
# 0.977 (es, "ventanilla" / "pasillo"), 0.991 (zh, 周三 / 周四) and 0.997 (ja, 月曜日 / 水曜日), against
# restatements at a median of 0.99. Each threshold sits 0.001-0.003 above its language's closest
# distinct pair: no distinct fact is merged, and 99 % (en), 71 % (de), 79 % (es), 48 % (zh) and 16 %
# (ja) of the repeats are found (a missed repeat stores a near-copy; a merged distinct fact loses the
# newer one; 0.95 merged 1, 17, 23, 62 and 62 of the 84). A language not measured gets the strictest.
DUPLICATE_THRESHOLDS = {"e5": {"en": 0.955, "de": 0.98, "es": 0.98, "zh": 0.993, "ja": 0.998}}


def duplicate_thresholds(embedder: str) -> dict[str, float]:
    """The near-duplicate thresholds of `embedder` (its name) by language, where measured, else none."""
    return DUPLICATE_THRESHOLDS.get(family(embedder), {})


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
