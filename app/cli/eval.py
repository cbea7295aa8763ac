"""`memstore eval locomo | jsonl`: writers on trial, on LoCoMo or on an operator's own conversations.

Each writer writes the same conversations into a fresh bank of its own through the real pipeline (in
this process: no worker or Redis needed); the same questions are then answered from each bank with
the same search, read model and judge (docs/evaluation.md). Runs against MEMSTORE_DATABASE_URL, else
the embedded database under MEMSTORE_DATA_DIR (the running `memstore up`'s if there is one).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from app.config import Settings, get_settings
from app.lib.logging import configure_logging

if TYPE_CHECKING:
    from app.domain.answer.reader import ChatModel
    from app.domain.evaluation.datasets import Dataset
    from app.domain.evaluation.services import Asking

eval_cli = typer.Typer(
    help="Evaluate writers: the same conversations and questions, only the writer changes.",
    no_args_is_help=True,
)

Writers = Annotated[
    str,
    typer.Option(
        "--writers", help="Comma-separated writer names: offline, openai, writers-file or plugin names."
    ),
]
AnswerModel = Annotated[
    str | None,
    typer.Option(
        "--answer-model",
        help="The read model: 'URL|MODEL', a model name (at MEMSTORE_READER_BASE_URL) or a URL (with "
        "MEMSTORE_READER_MODEL). Default: MEMSTORE_READER_*.",
    ),
]
JudgeModel = Annotated[
    str | None,
    typer.Option(
        "--judge-model",
        help="The judge, in the same forms (key: MEMSTORE_JUDGE_API_KEY, else MEMSTORE_READER_API_KEY). "
        "Default: the read model.",
    ),
]
TopK = Annotated[
    int, typer.Option("--top-k", min=1, help="Memories retrieved per question, for every writer.")
]
Sample = Annotated[
    int | None, typer.Option("--sample", min=1, help="Ask a fixed-seed subsample of N questions.")
]
Seed = Annotated[int, typer.Option("--seed", help="Seed of --sample.")]
JsonOut = Annotated[Path | None, typer.Option("--json", help="Write the full report (every question) here.")]
MarkdownOut = Annotated[Path | None, typer.Option("--markdown", help="Write the markdown tables here.")]
PlotOut = Annotated[
    Path | None, typer.Option("--plot", help="Write a bar chart (PNG) here; needs matplotlib.")
]
Concurrency = Annotated[int, typer.Option("--concurrency", min=1, help="Questions in flight at once.")]
TimeBoost = Annotated[
    str | None,
    typer.Option(
        "--time-boost",
        help="The search's time boost for a question that names a time (MEMSTORE_SEARCH_TIME_BOOST); "
        "several, comma-separated (0,1), ask each bank once per value.",
    ),
]
ValidAt = Annotated[
    str,
    typer.Option(
        "--valid-at",
        help="'named': a question that names a time is asked valid_at the end of it; 'off,named' asks "
        "each bank both ways.",
    ),
]
DataDir = Annotated[Path | None, typer.Option(help="Embedded data directory, when no URL is set.")]


def register(cli: typer.Typer) -> None:
    cli.add_typer(eval_cli, name="eval")


@eval_cli.command("locomo")
def locomo(
    file: Annotated[Path, typer.Argument(help="locomo10.json (snap-research/LoCoMo).")],
    writers: Writers,
    answer_model: AnswerModel = None,
    judge_model: JudgeModel = None,
    top_k: TopK = 10,
    sample: Sample = None,
    seed: Seed = 0,
    conversations: Annotated[
        str | None, typer.Option(help="Comma-separated conversations: 1-based positions or sample_ids.")
    ] = None,
    sessions: Annotated[
        str | None, typer.Option(help="Only these sessions (e.g. 1-3,5), and the questions they answer.")
    ] = None,
    include_adversarial: Annotated[
        bool, typer.Option(help="Also ask category 5 (adversarial: the answer is never said).")
    ] = False,
    json_out: JsonOut = None,
    markdown_out: MarkdownOut = None,
    plot_out: PlotOut = None,
    concurrency: Concurrency = 8,
    data_dir: DataDir = None,
    time_boost: TimeBoost = None,
    valid_at: ValidAt = "off",
) -> None:
    """LoCoMo: each session of a conversation is one chunk; categories 1-4 (5 with a flag). A question
    is asked at its conversation's last session's time ("last year" is read from there)."""
    from app.domain.evaluation.datasets import DatasetError, load_locomo

    try:
        dataset = load_locomo(
            file,
            conversations=_names(conversations),
            sessions=_numbers(sessions) if sessions else None,
            include_adversarial=include_adversarial,
        )
    except DatasetError as exc:
        typer.echo(f"memstore eval: {exc}", err=True)
        raise typer.Exit(2) from exc
    _evaluate(
        dataset,
        file,
        writers,
        answer_model,
        judge_model,
        top_k,
        sample,
        seed,
        json_out,
        markdown_out,
        plot_out,
        concurrency,
        data_dir,
        _askings(time_boost, valid_at),
    )


@eval_cli.command("jsonl")
def jsonl(
    file: Annotated[
        Path, typer.Argument(help="One JSON object a line: chunks and questions (docs/evaluation.md).")
    ],
    writers: Writers,
    answer_model: AnswerModel = None,
    judge_model: JudgeModel = None,
    top_k: TopK = 10,
    sample: Sample = None,
    seed: Seed = 0,
    json_out: JsonOut = None,
    markdown_out: MarkdownOut = None,
    plot_out: PlotOut = None,
    concurrency: Concurrency = 8,
    data_dir: DataDir = None,
    time_boost: TimeBoost = None,
    valid_at: ValidAt = "off",
) -> None:
    """An operator's own conversations and questions."""
    from app.domain.evaluation.datasets import DatasetError, load_jsonl

    try:
        dataset = load_jsonl(file)
    except DatasetError as exc:
        typer.echo(f"memstore eval: {exc}", err=True)
        raise typer.Exit(2) from exc
    _evaluate(
        dataset,
        file,
        writers,
        answer_model,
        judge_model,
        top_k,
        sample,
        seed,
        json_out,
        markdown_out,
        plot_out,
        concurrency,
        data_dir,
        _askings(time_boost, valid_at),
    )


def _askings(time_boost: str | None, valid_at: str) -> list[Asking]:
    """Each way of asking the options name: every time boost with every valid_at mode."""
    from app.domain.evaluation.services import Asking

    modes = _names(valid_at) or ["off"]
    if set(modes) - {"off", "named"}:
        raise typer.BadParameter("'off', 'named' or 'off,named'", param_hint="--valid-at")
    try:
        boosts: list[float | None] = [float(v) for v in _names(time_boost) or []] or [None]
    except ValueError as exc:
        raise typer.BadParameter("numbers, comma-separated (0,1)", param_hint="--time-boost") from exc
    if any(b is not None and not 0 <= b <= 10 for b in boosts):
        raise typer.BadParameter("each from 0 to 10", param_hint="--time-boost")
    return [Asking(boost, mode == "named") for boost in boosts for mode in dict.fromkeys(modes)]


def _names(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def _numbers(value: str) -> set[int]:
    """'1-3,5' -> {1, 2, 3, 5}."""
    found: set[int] = set()
    try:
        for part in value.split(","):
            low, _, high = part.strip().partition("-")
            found.update(range(int(low), int(high or low) + 1))
    except ValueError as exc:
        msg = f"expected numbers and ranges such as 1-3,5, not {value!r}"
        raise typer.BadParameter(msg) from exc
    return found


def _model(
    spec: str | None, settings: Settings, api_key: str | None, option: str, max_tokens: int
) -> ChatModel:
    """A chat model from 'URL|MODEL', a model name or a URL, completed from MEMSTORE_READER_*."""
    from app.domain.answer.reader import ChatModel

    url, model = settings.reader_base_url, settings.reader_model
    if spec:
        first, bar, second = spec.partition("|")
        if bar:
            url, model = first.strip(), second.strip()
        elif first.startswith(("http://", "https://")):
            url = first
        else:
            model = first
    if not url or not model:
        msg = (
            f"needs a URL and a model: {option} 'URL|MODEL', "
            "or MEMSTORE_READER_BASE_URL and MEMSTORE_READER_MODEL"
        )
        raise typer.BadParameter(msg, param_hint=option)
    return ChatModel(url, model, api_key=api_key, timeout_s=settings.reader_timeout_s, max_tokens=max_tokens)


def _evaluate(
    dataset: Dataset,
    file: Path,
    writers: str,
    answer_model: str | None,
    judge_model: str | None,
    top_k: int,
    sample: int | None,
    seed: int,
    json_out: Path | None,
    markdown_out: Path | None,
    plot_out: Path | None,
    concurrency: int,
    data_dir: Path | None,
    askings: list[Asking],
) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from app.db.engine import create_engine
    from app.domain.evaluation import report
    from app.domain.evaluation.services import EvaluationError, new_run_id, run_evaluation
    from app.lib.embedded import EmbeddedError, database_only

    settings = get_settings()
    configure_logging("WARNING", settings.log_format, process="cli")
    if top_k > settings.search_max_top_k:
        raise typer.BadParameter(f"at most {settings.search_max_top_k}", param_hint="--top-k")
    names = _names(writers) or []
    if not names:
        raise typer.BadParameter("name at least one writer", param_hint="--writers")
    reader = _model(
        answer_model, settings, settings.reader_api_key, "--answer-model", settings.reader_max_tokens
    )
    judge_key = os.environ.get("MEMSTORE_JUDGE_API_KEY") or settings.reader_api_key
    judge = _model(
        judge_model or answer_model, settings, judge_key, "--judge-model", settings.reader_max_tokens
    )
    questions, sampled = dataset.sample(sample, seed)
    run_id = new_run_id()
    context: dict[str, Any] = {
        "run_id": run_id,
        "dataset": {
            "name": dataset.name,
            "file": str(file),
            "conversations": sorted({c.conversation for c in dataset.chunks}),
            "chunks": len(dataset.chunks),
            "questions": len(dataset.questions),
            "notes": dataset.notes,
        },
        "categories": dataset.categories,
        "sample": sampled,
        "questions_asked": len(questions),
        "protocol": {
            "writers": names,
            "top_k": top_k,
            "search": "hybrid",
            "embedder": settings.embedder
            if settings.embedder == "hashing"
            else f"{settings.embedder}:{settings.embedder_model}",
            "answer_model": {"base_url": reader.base_url, "model": reader.model},
            "judge_model": {"base_url": judge.base_url, "model": judge.model},
            "askings": [
                {
                    "time_boost": settings.search_time_boost if a.time_boost is None else a.time_boost,
                    "valid_at": "end of the named time" if a.valid_at_named else None,
                }
                for a in askings
            ],
        },
    }
    console = Console(stderr=True)

    async def run(database_url: str) -> dict[str, Any]:
        engine = create_engine(
            settings.model_copy(update={"database_url": database_url}), application_name="memstore-eval"
        )
        try:
            with Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            ) as bar:
                task = bar.add_task("starting", total=None)

                def progress(what: str, done: int, total: int) -> None:
                    bar.update(task, description=what, completed=done, total=total)

                runs = await run_evaluation(
                    engine,
                    settings,
                    dataset,
                    questions,
                    names,
                    reader=reader,
                    judge=judge,
                    top_k=top_k,
                    run_id=run_id,
                    actor=f"cli:{getpass.getuser()}",
                    concurrency=concurrency,
                    progress=progress,
                    askings=askings,
                )
            return report.summary(runs, context)
        finally:
            await reader.aclose()
            await judge.aclose()
            await engine.dispose()

    try:
        with database_only(data_dir or settings.data_dir, settings.owner_database_url) as database_url:
            outcome = asyncio.run(run(database_url))
    except (EvaluationError, EmbeddedError) as exc:
        typer.echo(f"memstore eval: {exc}", err=True)
        raise typer.Exit(1) from exc
    table = report.markdown(outcome)
    typer.echo(table)
    if json_out is not None:
        json_out.write_text(json.dumps(outcome, indent=2, default=str) + "\n", encoding="utf-8")
    if markdown_out is not None:
        markdown_out.write_text(table, encoding="utf-8")
    if plot_out is not None and (why := report.plot(outcome, plot_out)) is not None:
        typer.echo(f"memstore eval: {why}", err=True)
    banks = ", ".join(dict.fromkeys(w["tenant"] for w in outcome["writers"].values()))
    typer.echo(f"banks kept for inspection: {banks}", err=True)
