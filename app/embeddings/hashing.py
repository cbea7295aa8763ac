"""A dependency-free embedder: feature hashing of word unigrams and bigrams, L2-normalised.

It captures lexical overlap only (no synonyms), which is enough to find the memories a new
statement is about ("The user lives in Lyon" vs "I moved to Seattle" share "the user lives");
semantic embedders plug in behind the same protocol.

Chinese and Japanese are written without spaces, and Korean's syllables are not ASCII: a run of such
characters is read as characters, each ideograph one feature and each pair of neighbours another (as
CJK search engines index them), so "我住在上海" and "私は東京に住んでいます" share what they say, not
the empty vector every such text hashed to before ("hashing-v1", which made any two of them near
duplicates). Text in other scripts hashes as it did, so an English bank's vectors are unchanged.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re

_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
# Han ideographs (with extension A and the compatibility block), hiragana, katakana (and its
# half-width forms), Hangul syllables.
_CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uff66-\uff9f\uac00-\ud7af]+")
_IDEOGRAPH = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
# Words that carry no meaning of their own; dropping them keeps vectors about the content.
_STOPWORDS = frozenset(
    """
    a an the and or but of to in on at for with by from is am are was were be been being it its this that
    these those as so if then than too very can will just do does did i me my we our you your
    """.split()  # noqa: SIM905  (one word list reads better than fifty quoted strings)
)


def _cjk_features(text: str) -> list[str]:
    """Each ideograph, and each pair of neighbouring characters, of every CJK run in `text`. A lone kana
    or Hangul syllable says too little alone (a particle, half a word) to be a feature of its own."""
    features: list[str] = []
    for run in _CJK_RUN.findall(text):
        features.extend(ch for ch in run if _IDEOGRAPH.match(ch))
        features.extend(a + b for a, b in itertools.pairwise(run))
    return features


def _bucket(feature: str, dim: int) -> tuple[int, float]:
    digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    return value % dim, (1.0 if (value >> 63) & 1 else -1.0)


class HashingEmbedder:
    """Signed feature hashing (the "hashing trick") into `dim` buckets."""

    def __init__(self, dim: int = 384) -> None:
        self.dim = dim
        self.name = f"hashing-v2-{dim}"  # v2: CJK text read by characters

    def embed_one(self, text: str) -> list[float]:
        words = [w for w in _TOKEN.findall(text.lower()) if w not in _STOPWORDS]
        vector = [0.0] * self.dim
        features = words + [f"{a} {b}" for a, b in itertools.pairwise(words)] + _cjk_features(text)
        hit: set[int] = set()
        for feature in features:
            index, sign = _bucket(feature, self.dim)
            vector[index] += sign
            hit.add(index)
        # Only the buckets a feature hit are non-zero: the norm and the division visit those alone, in
        # index order (the same sum, to the bit, as over the whole vector).
        nonzero = sorted(hit)
        norm = math.sqrt(sum(vector[i] * vector[i] for i in nonzero))
        if norm == 0.0:
            # An empty or all-stopword text still needs a valid unit vector for cosine distance.
            vector[0] = 1.0
            return vector
        for i in nonzero:
            vector[i] /= norm
        return vector

    async def aclose(self) -> None:
        """Nothing is held open."""

    async def embed(self, texts: list[str]) -> list[list[float]]:
        return [self.embed_one(t) for t in texts]
