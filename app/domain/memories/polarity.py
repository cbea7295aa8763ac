"""Whether two near-identical statements say opposite things ("likes jazz" / "dislikes jazz").

A sentence embedder places a statement and its negation close together: all-MiniLM-L6-v2 gives
"The user is vegetarian." and "The user is not vegetarian." a cosine of 0.94, "... is allergic to
peanuts." and its negation 0.945, a hair under the near-duplicate threshold (0.95). Treating a
negation as a repeat would silently drop the newer, opposite fact, so the near-duplicate check asks
this first. The rule is deliberately small and explicit (English): the two texts differ in the
parity of their negation words (not, never, no, n't ...), or one holds a word that the other holds
without a negating prefix (dislikes / likes, unhappy / happy).
"""

from __future__ import annotations

import re

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
_NEGATIONS = frozenset(
    ("not", "no", "never", "none", "nothing", "nobody", "nowhere", "neither", "nor", "without", "cannot")
)
_PREFIXES = ("dis", "un", "non", "in", "im", "ir", "il")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("\u2019", "'"))


def _negations(words: list[str]) -> int:
    return sum(1 for w in words if w in _NEGATIONS or w.endswith("n't"))


def _negates(word: str, others: set[str]) -> bool:
    """`word` is a prefixed negation of a word in `others` (dislikes -> likes)."""
    return any(word.startswith(p) and len(word) - len(p) >= 3 and word[len(p) :] in others for p in _PREFIXES)


def opposite_polarity(a: str, b: str) -> bool:
    """True when `a` and `b` read as a statement and its negation (so neither repeats the other)."""
    words_a, words_b = _words(a), _words(b)
    if _negations(words_a) % 2 != _negations(words_b) % 2:
        return True
    set_a, set_b = set(words_a), set(words_b)
    return any(_negates(w, set_b) for w in set_a - set_b) or any(_negates(w, set_a) for w in set_b - set_a)
