"""An evaluation's report: scores per writer (overall and per question category, each with the
number of questions behind it), what writing cost, and every question's answer — as JSON, as a
markdown table, and as a bar chart when matplotlib is installed (`pip install memstore[bench]`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from statistics import fmean
from typing import Any

from app.domain.evaluation.services import QuestionResult, WriterRun
from app.lib.time_expressions import named_time

METRICS = (("judge_accuracy", "judge accuracy"), ("f1", "token F1"), ("evidence_recall", "evidence recall"))


def _mean(values: Iterable[float]) -> float | None:
    found = list(values)
    return round(fmean(found), 4) if found else None


def scores(results: list[QuestionResult]) -> dict[str, Any]:
    recalls = [r.evidence_recall for r in results if r.evidence_recall is not None]
    return {
        "n": len(results),
        "judge_accuracy": _mean(float(r.correct) for r in results),
        "f1": _mean(r.f1 for r in results),
        "evidence_recall": _mean(recalls),
        "evidence_n": len(recalls),  # questions with evidence turns
    }


def _total(usages: Iterable[dict[str, Any]], key: str) -> int:
    return sum(u[key] for u in usages if isinstance(u.get(key), int))


def writer_figures(run: WriterRun) -> dict[str, Any]:
    prompt = _total(run.usage, "prompt_tokens")
    completion = _total(run.usage, "completion_tokens")
    latencies = [float(u["latency_ms"]) for u in run.usage if isinstance(u.get("latency_ms"), int | float)]
    per_chunk = max(1, run.chunks)
    return {
        "chunks": run.chunks,
        "applied": run.statuses.get("applied", 0),
        "failed": run.statuses.get("failed", 0),
        "failures": run.failures,
        "memories": run.memories,
        "active_memories": run.active_memories,
        "memories_per_chunk": round(run.memories / per_chunk, 3),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "tokens_per_chunk": round((prompt + completion) / per_chunk, 1),
        # The model's time per chunk as the writer recorded it; None for writers that record none.
        "latency_ms_per_chunk": _mean(latencies),
        "pipeline_s": round(run.pipeline_s, 2),
        "pipeline_s_per_chunk": round(run.pipeline_s / per_chunk, 3),
    }


def summary(runs: list[WriterRun], context: dict[str, Any]) -> dict[str, Any]:
    """The report as JSON: `context` (dataset, protocol, sample), then per writer its scores and
    figures, then every question's record."""
    categories: dict[str, str] = context.get("categories", {})
    writers = {}
    for run in runs:
        by_category = {}
        for key, name in categories.items():
            chosen = [r for r in run.results if r.question.category == key]
            if chosen:
                by_category[key] = {"name": name, **scores(chosen)}
        timed = [r for r in run.results if named_time(r.question.question, r.question.asked_at)]
        writers[run.writer] = {
            "tenant": run.tenant,
            "overall": scores(run.results),
            "by_category": by_category,
            # the questions that name a time ("in May 2023"), which the time boost and valid_at act on
            "names_a_time": scores(timed) if timed else None,
            "writer": writer_figures(run),
            "answer": {
                "prompt_tokens": _total((r.answer_usage for r in run.results), "prompt_tokens"),
                "completion_tokens": _total((r.answer_usage for r in run.results), "completion_tokens"),
                "errors": sum(1 for r in run.results if r.error and r.error.startswith("answer")),
            },
            "judge": {
                "prompt_tokens": _total((r.judge_usage for r in run.results), "prompt_tokens"),
                "completion_tokens": _total((r.judge_usage for r in run.results), "completion_tokens"),
                "unparseable": sum(
                    1 for r in run.results if r.answer is not None and not r.judge_parsed and not r.error
                ),
                "errors": sum(1 for r in run.results if r.error and r.error.startswith("judge")),
            },
        }
    return {
        **context,
        "writers": writers,
        "questions": [_record(run.writer, r) for run in runs for r in run.results],
    }


def _record(writer: str, result: QuestionResult) -> dict[str, Any]:
    q = result.question
    return {
        "writer": writer,
        "id": q.id,
        "conversation": q.conversation,
        "category": q.category,
        "question": q.question,
        "gold": q.answer,
        "answer": result.answer,
        "correct": result.correct,
        "judge_parsed": result.judge_parsed,
        "judge_output": result.judge_output,
        "f1": round(result.f1, 4),
        "evidence": list(q.evidence),
        "evidence_found": result.evidence_found,
        "evidence_recall": result.evidence_recall,
        "memories": result.memories,
        "error": result.error,
    }


def _cell(value: float | None, share: bool = True) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f} %" if share else f"{value:g}"


def _asking(askings: list[dict[str, Any]]) -> str:
    """How the questions were asked, when it was more than the plain way."""
    ways = [
        ", ".join(
            ([f"time boost {a['time_boost']:g}"] if a.get("time_boost") else [])
            + (["valid_at the end of a named time"] if a.get("valid_at") else [])
        )
        or "plain"
        for a in askings
    ]
    return f" Asked: {'; '.join(ways)}." if any(w != "plain" for w in ways) else ""


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown tables: overall, what writing cost, and per category."""
    protocol = report["protocol"]
    sample = report.get("sample")
    asked = (
        f"{sample['size']} of {sample['of']} (seed {sample['seed']})"
        if sample
        else str(report["questions_asked"])
    )
    lines = [
        f"# Writers on trial: {report['dataset']['name']}",
        "",
        f"Run `{report['run_id']}`. Questions: {asked}; {report['dataset']['chunks']} chunks. Retrieval: "
        f"Memstore hybrid search, top_k {protocol['top_k']}, embedder `{protocol['embedder']}`. "
        f"Answer model `{protocol['answer_model']['model']}`, judge `{protocol['judge_model']['model']}`."
        + _asking(protocol.get("askings") or []),
        "",
        "| writer | n | judge accuracy | token F1 | evidence recall | memories / chunk "
        "| writer tokens / chunk | writer latency / chunk | unparseable verdicts |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, writer in report["writers"].items():
        overall, figures = writer["overall"], writer["writer"]
        latency = figures["latency_ms_per_chunk"]
        lines.append(
            f"| {name} | {overall['n']} | {_cell(overall['judge_accuracy'])} | {_cell(overall['f1'])} "
            f"| {_cell(overall['evidence_recall'])} (n={overall['evidence_n']}) "
            f"| {figures['memories_per_chunk']:g} | {figures['tokens_per_chunk']:g} "
            f"| {'-' if latency is None else f'{latency:g} ms'} "
            f"| {writer['judge']['unparseable']} |"
        )
    lines += [
        "",
        "| writer | category | n | judge accuracy | token F1 | evidence recall |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for name, writer in report["writers"].items():
        for key, score in writer["by_category"].items():
            lines.append(
                f"| {name} | {key} {score['name']} | {score['n']} | {_cell(score['judge_accuracy'])} "
                f"| {_cell(score['f1'])} | {_cell(score['evidence_recall'])} |"
            )
        if score := writer.get("names_a_time"):
            lines.append(
                f"| {name} | naming a time (any category) | {score['n']} | {_cell(score['judge_accuracy'])} "
                f"| {_cell(score['f1'])} | {_cell(score['evidence_recall'])} |"
            )
    notes = []
    for name, writer in report["writers"].items():
        if failed := writer["writer"]["failed"]:
            notes.append(f"- {name}: {failed} of {writer['writer']['chunks']} chunks failed to be written")
        if errors := writer["answer"]["errors"] + writer["judge"]["errors"]:
            notes.append(f"- {name}: {errors} questions got no answer or no verdict (counted incorrect)")
    notes += [f"- {note}" for note in report["dataset"].get("notes", [])]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> str | None:
    """Bars of each writer's overall scores in a PNG at `path`; why not, when matplotlib is missing."""
    try:
        import matplotlib as mpl

        mpl.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'memstore[bench]'); no plot written"
    names = list(report["writers"])
    width = 0.8 / len(METRICS)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.8 * len(names) + 2), 4.0))
    for i, (key, label) in enumerate(METRICS):
        values = [100 * (report["writers"][n]["overall"][key] or 0.0) for n in names]
        positions = [j + (i - (len(METRICS) - 1) / 2) * width for j in range(len(names))]
        bars = axes.bar(positions, values, width, label=label)
        axes.bar_label(bars, fmt="%.0f", fontsize=8)
    n = report["writers"][names[0]]["overall"]["n"] if names else 0
    axes.set_xticks(range(len(names)), names)
    axes.set_ylim(0, 118)  # room for the legend above the bars
    axes.set_ylabel("%")
    axes.set_title(f"{report['dataset']['name']}: {n} questions, top_k {report['protocol']['top_k']}")
    axes.legend(loc="upper center", ncol=len(METRICS), fontsize=8, frameon=False)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return None
