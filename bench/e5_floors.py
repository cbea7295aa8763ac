"""The `e5` embedder's floors against labelled pairs in five languages (tests/data/pairs/e5/, written
by bench/pairs/make_pairs.py), per language:

- related vs unrelated pairs (a new fact and the memory it updates or contradicts, against two facts
  about the user on different topics): their cosine ranges, the floor that separates them and its
  margin, and the shares each side of the shipped floor (`RELATED_FLOORS["e5"]`);
- duplicate vs distinct pairs (a memory and a restatement, against a fact differing in one detail):
  their cosine ranges and, under the near-duplicate rule (`guards.repeats`) at the threshold, the
  distinct facts merged and the share of repeats found; and the lowest threshold that merges none.

    .venv/bin/python bench/e5_floors.py [--threshold 0.95] [--floor 0.82] [--show 5] [--langs en,de]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

from app.config import Settings
from app.domain.memories.services.guards import repeats
from app.embeddings.base import DUPLICATE_THRESHOLDS, related_floor
from app.embeddings.e5 import load_model, packaged_model

PAIRS_DIR = Path(__file__).parents[1] / "tests" / "data" / "pairs" / "e5"
LANGS = ("en", "de", "es", "zh", "ja")


def load(lang: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (PAIRS_DIR / f"{lang}.jsonl").open(encoding="utf-8")]


def cosines(pairs: list[dict[str, Any]]) -> list[float]:
    """Each pair's cosine, every distinct text embedded once, as a passage (as memories are)."""
    texts = list(dict.fromkeys(t for p in pairs for t in (p["a"], p["b"])))
    vectors = load_model(packaged_model()).encode(texts)
    row = {text: vectors[i] for i, text in enumerate(texts)}
    return [float(row[p["a"]] @ row[p["b"]]) for p in pairs]


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    q = statistics.quantiles(values, n=10) if len(values) > 1 else values * 9
    middle = statistics.median(values)
    return f"{min(values):.3f} / p10 {q[0]:.3f} / median {middle:.3f} / p90 {q[-1]:.3f} / {max(values):.3f}"


def related_report(pairs: list[dict[str, Any]], sims: list[float], floor: float, show: int) -> None:
    related = sorted(
        (s, p) for s, p in zip(sims, pairs, strict=True) if p["set"] == "related" and p["related"]
    )
    unrelated = sorted(
        (s, p) for s, p in zip(sims, pairs, strict=True) if p["set"] == "related" and not p["related"]
    )
    low, high = related[0][0], unrelated[-1][0]
    print(f"  related   {len(related):3d}: {spread([s for s, _ in related])}")
    print(f"  unrelated {len(unrelated):3d}: {spread([s for s, _ in unrelated])}")
    if low > high:
        print(
            f"  separated: any floor in ({high:.3f}, {low:.3f}], "
            f"midpoint {(low + high) / 2:.3f}, gap {low - high:.3f}"
        )
    else:
        print(
            f"  overlap: {sum(s >= low for s, _ in unrelated)} unrelated at or above "
            f"the lowest related ({low:.3f}), "
            f"{sum(s <= high for s, _ in related)} related at or below the highest unrelated ({high:.3f})"
        )
    kept = sum(s >= floor for s, _ in related)
    shut = sum(s < floor for s, _ in unrelated)
    print(
        f"  at floor {floor:.3f}: {kept}/{len(related)} related shown ({kept / len(related):.1%}), "
        f"{shut}/{len(unrelated)} unrelated kept out ({shut / len(unrelated):.1%}); "
        f"margin {low - floor:+.3f} below the lowest related, {floor - high:+.3f} above the highest unrelated"
    )
    for s, p in related[:show]:
        print(f"    low related   {s:.3f}  {p['a']}  |  {p['b']}")
    for s, p in unrelated[-show:]:
        print(f"    high unrelated {s:.3f}  {p['a']}  |  {p['b']}")


def duplicate_report(pairs: list[dict[str, Any]], sims: list[float], threshold: float, show: int) -> None:
    rows = [(s, p) for s, p in zip(sims, pairs, strict=True) if p["set"] == "duplicate"]
    dup = [(s, p) for s, p in rows if p["duplicate"]]
    distinct = [(s, p) for s, p in rows if not p["duplicate"]]
    print(f"  duplicate {len(dup):3d}: {spread([s for s, _ in dup])}")
    print(f"  distinct  {len(distinct):3d}: {spread([s for s, _ in distinct])}")

    def verdict(at: float) -> tuple[list[tuple[float, dict[str, Any]]], int]:
        merged = [(s, p) for s, p in distinct if repeats(p["b"], p["a"], s, at)]
        found = sum(repeats(p["b"], p["a"], s, at) for s, p in dup)
        return merged, found

    merged, found = verdict(threshold)
    print(
        f"  at threshold {threshold:.3f}: {len(merged)} distinct merged, {found}/{len(dup)} repeats found "
        f"({found / len(dup):.1%})"
    )
    for s, p in sorted(merged, key=lambda x: -x[0])[:show]:
        print(f"    merged {s:.3f} [{p['kind']}]  {p['a']}  |  {p['b']}")
    safe = sorted({round(s, 4) + 0.0001 for s, _ in distinct} | {threshold})
    lowest = next(t for t in safe if not verdict(t)[0]) if any(not verdict(t)[0] for t in safe) else None
    if lowest is None:
        print("  no threshold merges no distinct fact (the word rule alone merges some)")
    else:
        print(
            f"  lowest threshold merging none: {lowest:.4f}, {verdict(lowest)[1]}/{len(dup)} repeats found "
            f"({verdict(lowest)[1] / len(dup):.1%}; by words alone: {verdict(2.0)[1]})"
        )
    missed = sorted((s, p) for s, p in dup if not repeats(p["b"], p["a"], s, threshold))
    for s, p in missed[-show:]:
        print(f"    missed {s:.3f}  {p['a']}  |  {p['b']}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--threshold", type=float, help="one for every language (default: e5's own per language)"
    )
    parser.add_argument("--floor", type=float, default=related_floor("e5", 0.0))
    parser.add_argument("--show", type=int, default=3, help="closest misses to print per list")
    parser.add_argument("--langs", default=",".join(LANGS))
    args = parser.parse_args()
    for lang in args.langs.split(","):
        pairs = load(lang)
        started = time.perf_counter()
        sims = cosines(pairs)
        print(f"{lang}: {len(pairs)} pairs, embedded in {time.perf_counter() - started:.1f} s")
        related_report(pairs, sims, args.floor, args.show)
        own = max(Settings(embedder="e5").duplicate_threshold, DUPLICATE_THRESHOLDS["e5"][lang])
        duplicate_report(pairs, sims, args.threshold or own, args.show)


if __name__ == "__main__":
    main()
