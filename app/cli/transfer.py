"""`memstore import locomo|jsonl FILE` and `memstore export --user U`: conversations and banks moved
between instances through the REST API, with the SDK, as any client would.

An import of conversations posts chunks in order, in batches, each under an idempotency key derived
from its content and place in the file, so running it again — after an interruption, or on purpose —
stores nothing twice: chunks already there are answered as replays and the import goes on with the
rest. With `--wait` (the default) it then waits until the workers have applied every chunk.

An export writes one user's chunks (their messages, in `seq` order), memories with every version and
its provenance, and changesets, as JSON Lines. Importing it into another instance loads that history
as it was written (`POST /v1/admin/users/{u}/import`, ids mapped, loading twice writes nothing): the
same bank, the same versions, the same past for `as_of`, hand edits and admin undo included. With
`--replay`, its chunks are posted for the target's own writer instead. Either way the resulting bank is
then compared with the exported one, memory by memory, and any difference is reported (exit 1).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Annotated, Any

import msgspec
import typer
from memstore_client import Client, MemstoreError, models
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import_cli = typer.Typer(help="Load conversations into a running Memstore (resumable).", no_args_is_help=True)

Url = Annotated[str, typer.Option("--url", envvar="MEMSTORE_URL", help="The API's base URL.")]
Key = Annotated[str, typer.Option("--key", envvar="MEMSTORE_API_KEY", help="An API key (admin for export).")]
Wait = Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until every chunk is applied.")]
BatchSize = Annotated[int, typer.Option(help="Chunks per request (at most the server's batch limit).", min=1)]
Timeout = Annotated[float, typer.Option(help="Seconds to wait for the chunks to be applied.", min=1)]

EXPORT_FORMAT = 1
# Chunk fields an import posts; the rest of an exported chunk line (seq, status ...) is information.
_CHUNK_FIELDS = ("user_id", "messages", "agent_id", "run_id", "metadata", "writer")


def register(cli: typer.Typer) -> None:
    cli.add_typer(import_cli, name="import")
    cli.command("export")(export)


@dataclass(frozen=True)
class ImportChunk:
    body: dict[str, Any]
    idempotency_key: str


class UnreadableImportError(Exception):
    """A file that cannot be imported, with where and why."""


def _console() -> Console:
    return Console(stderr=True)


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def keyed(source: str, bodies: list[dict[str, Any]]) -> list[ImportChunk]:
    """Each body under a key made of its content and how many identical bodies came before it, so
    the same file gives the same keys (a rerun stores nothing twice) and repeated chunks stay apart."""
    seen: Counter[str] = Counter()
    chunks = []
    for body in bodies:
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[
            :48
        ]
        seen[digest] += 1
        chunks.append(ImportChunk(body, f"import:{source}:{digest}:{seen[digest]}"))
    return chunks


def locomo_chunks(path: Path, conversations: list[str] | None, user: str | None) -> list[ImportChunk]:
    """LoCoMo's conversations as chunks, one per session, for the conversation's own user id (its
    `sample_id`) or `user`."""
    from app.domain.evaluation.datasets import DatasetError, load_locomo

    try:
        dataset = load_locomo(path, conversations=conversations)
    except DatasetError as exc:
        raise UnreadableImportError(str(exc)) from exc
    bodies = [
        {
            "user_id": user or chunk.user_id,
            "messages": [
                _message(
                    {
                        "role": m.role,
                        "content": m.content,
                        "name": m.name,
                        "created_at": m.created_at.isoformat() if m.created_at else None,
                    }
                )
                for m in chunk.messages
            ],
            "metadata": chunk.metadata(),
        }
        for chunk in dataset.chunks
    ]
    return keyed("locomo", bodies)


@dataclass
class JsonlFile:
    """What a JSON Lines file holds: chunks to post, and, when it is an export, its records by user."""

    chunks: list[ImportChunk]
    export: dict[str, Any] | None = None  # the export's header line
    records: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)

    def memories(self) -> dict[str, list[dict[str, Any]]]:
        return {user: kinds["memories"] for user, kinds in self.records.items() if kinds["memories"]}


def read_jsonl(path: Path, user: str | None = None) -> JsonlFile:
    """The chunks of a JSON Lines file (docs/api.md, "Import and export") and, when it is an export,
    its records by user (all of them under `user`, if given)."""
    bodies: list[dict[str, Any]] = []
    keys: list[str | None] = []
    found = JsonlFile(chunks=[])
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UnreadableImportError(f"cannot read {path}: {exc}") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise UnreadableImportError(f"{path}:{number}: not JSON ({exc})") from exc
        if not isinstance(record, dict):
            raise UnreadableImportError(f"{path}:{number}: expected a JSON object")
        kind = record.get("type", "chunk")
        if kind == "export":
            found.export = record
            continue
        owner = user or str(record.get("user_id"))
        if kind in ("memory", "changeset", "chunk") and found.export is not None:
            kinds = found.records.setdefault(owner, {"chunks": [], "changesets": [], "memories": []})
            kinds[f"{kind}s" if kind != "memory" else "memories"].append(record)
        if kind != "chunk":
            continue
        if not isinstance(record.get("user_id"), str) or not isinstance(record.get("messages"), list):
            raise UnreadableImportError(
                f"{path}:{number}: a chunk needs `user_id` (a string) and `messages` (a list)"
            )
        body = {k: record[k] for k in _CHUNK_FIELDS if record.get(k) is not None}
        if user:
            body["user_id"] = user
        bodies.append(body)
        key = record.get("idempotency_key")
        keys.append(str(key) if key and not user else None)
    derived = keyed("jsonl", bodies)
    found.chunks = [
        ImportChunk(c.body, key or c.idempotency_key) for c, key in zip(derived, keys, strict=True)
    ]
    return found


def load_history(
    client: Client,
    records: dict[str, dict[str, list[dict[str, Any]]]],
    *,
    console: Console,
    max_bytes: int = 256 * 1024,
    max_records: int = 200,
) -> Counter[str]:
    """Load each user's exported records as they were written (`POST /v1/admin/users/{u}/import`), in
    batches of at most `max_records` records and about `max_bytes`; rows written per kind."""
    written: Counter[str] = Counter()
    total = sum(len(items) for kinds in records.values() for items in kinds.values())
    with _progress(console) as progress:
        task = progress.add_task("loading history", total=total)
        for user_id, kinds in records.items():
            for kind in ("changesets", "chunks", "memories"):
                batch: list[dict[str, Any]] = []
                size = 0
                for record in [*kinds[kind], None]:
                    if record is not None:
                        batch.append(record)
                        size += len(msgspec.json.encode(record))
                    if batch and (record is None or size >= max_bytes or len(batch) >= max_records):
                        written.update(client.import_user(user_id, {kind: batch}).written)
                        progress.advance(task, len(batch))
                        batch, size = [], 0
    return written


@dataclass
class Imported:
    posted: int = 0
    new: int = 0
    states: Counter[str] | None = None


def post_chunks(
    client: Client,
    chunks: list[ImportChunk],
    *,
    batch_size: int,
    wait: bool,
    timeout_s: float,
    console: Console,
) -> Imported:
    """Post `chunks` in order, `batch_size` a request; with `wait`, until all are applied or failed."""
    result = Imported()
    ids: list[str] = []
    with _progress(console) as progress:
        task = progress.add_task("posting chunks", total=len(chunks))
        for start in range(0, len(chunks), batch_size):
            batch = chunks[start : start + batch_size]
            accepted = client.add_chunks([{**c.body, "idempotency_key": c.idempotency_key} for c in batch])
            ids.extend(str(a.chunk_id) for a in accepted)
            result.posted += len(accepted)
            result.new += sum(1 for a in accepted if not a.replayed)
            progress.advance(task, len(batch))
        if wait:
            result.states = _wait(client, ids, timeout_s, progress)
    return result


def _wait(client: Client, ids: list[str], timeout_s: float, progress: Progress) -> Counter[str]:
    task = progress.add_task("applying", total=len(ids))
    pending = list(dict.fromkeys(ids))
    states: Counter[str] = Counter()
    deadline = time.monotonic() + timeout_s
    while pending:
        still = []
        for chunk_id in pending:
            state = client.get_chunk(chunk_id)
            if state.finished:
                states[state.status] += 1
                progress.advance(task)
            else:
                still.append(chunk_id)
        pending = still
        if pending:
            if time.monotonic() > deadline:
                states["unfinished"] = len(pending)
                return states
            time.sleep(0.25)
    return states


def bank_of(client: Client, user_id: str) -> dict[str, Any]:
    """A user's bank as comparable facts: memories by content with status, version count per memory."""
    memories = sorted(
        (m.content, m.status, len(client.history(m.id).versions))
        for m in client.iter_memories(user_id, status="all", limit=1000)
    )
    return {"memories": memories, "versions": sum(n for _, _, n in memories)}


def exported_bank(records: list[dict[str, Any]]) -> dict[str, Any]:
    memories = sorted((r["content"], r["status"], len(r.get("versions", []))) for r in records)
    return {"memories": memories, "versions": sum(n for _, _, n in memories)}


def _report(console: Console, result: Imported) -> None:
    console.print(
        f"{result.posted} chunks posted: {result.new} new, {result.posted - result.new} already there"
    )
    if result.states is not None:
        console.print("chunks " + ", ".join(f"{n} {status}" for status, n in sorted(result.states.items())))


def _run_import(
    url: str,
    key: str,
    chunks: list[ImportChunk],
    *,
    batch_size: int,
    wait: bool,
    timeout_s: float,
    expected: dict[str, list[dict[str, Any]]] | None = None,
) -> None:
    console = _console()
    try:
        with Client(url, key) as client:
            result = post_chunks(
                client, chunks, batch_size=batch_size, wait=wait, timeout_s=timeout_s, console=console
            )
            _report(console, result)
            if result.states and (result.states.get("failed") or result.states.get("unfinished")):
                raise typer.Exit(1)
            if expected and wait:
                _verify(client, expected, console)
    except MemstoreError as exc:
        console.print(f"[red]memstore: {exc}[/red]", highlight=False)
        raise typer.Exit(1) from exc


def _verify(client: Client, expected: dict[str, list[dict[str, Any]]], console: Console) -> None:
    """The bank each exported user now has here, against the export's."""
    differ = False
    for user_id, records in expected.items():
        want, have = exported_bank(records), bank_of(client, user_id)
        if want == have:
            console.print(
                f"bank of {user_id} reproduced: {len(have['memories'])} memories, {have['versions']} versions"
            )
            continue
        differ = True
        missing = Counter(map(tuple, want["memories"])) - Counter(map(tuple, have["memories"]))
        extra = Counter(map(tuple, have["memories"])) - Counter(map(tuple, want["memories"]))
        console.print(
            f"[yellow]bank of {user_id} differs from the export: {have['versions']} versions here, "
            f"{want['versions']} exported[/yellow]",
            highlight=False,
        )
        for content, status, versions in sorted(missing.elements()):
            console.print(f"  - {content!r} ({status}, {versions} versions)", highlight=False)
        for content, status, versions in sorted(extra.elements()):
            console.print(f"  + {content!r} ({status}, {versions} versions)", highlight=False)
    if differ:
        raise typer.Exit(1)


@import_cli.command("locomo")
def import_locomo(
    file: Annotated[Path, typer.Argument(help="LoCoMo's JSON file (locomo10.json).")],
    url: Url = "http://127.0.0.1:8000",
    key: Key = "",
    conversations: Annotated[
        str | None, typer.Option(help="Conversations by position or sample_id, e.g. 1,2 (default: all).")
    ] = None,
    user: Annotated[str | None, typer.Option(help="Post every chunk for this user id instead.")] = None,
    wait: Wait = True,
    batch_size: BatchSize = 50,
    timeout_s: Timeout = 600.0,
) -> None:
    """Post LoCoMo's conversations, one chunk per session, each conversation for its own user."""
    _need_key(key)
    wanted = [c.strip() for c in conversations.split(",") if c.strip()] if conversations else None
    try:
        chunks = locomo_chunks(file, wanted, user)
    except UnreadableImportError as exc:
        typer.echo(f"memstore: {exc}", err=True)
        raise typer.Exit(1) from exc
    _run_import(url, key, chunks, batch_size=batch_size, wait=wait, timeout_s=timeout_s)


@import_cli.command("jsonl")
def import_jsonl(
    file: Annotated[Path, typer.Argument(help="One chunk per line, or a `memstore export` file.")],
    url: Url = "http://127.0.0.1:8000",
    key: Key = "",
    user: Annotated[str | None, typer.Option(help="Load everything for this user id instead.")] = None,
    replay: Annotated[
        bool, typer.Option(help="An export: post its chunks for this instance's writer, not its history.")
    ] = False,
    wait: Wait = True,
    batch_size: BatchSize = 50,
    timeout_s: Timeout = 600.0,
) -> None:
    """Post the chunks of a JSON Lines file in order; load an export's history as it was written (or,
    with --replay, post its chunks). An export's bank is then compared with the result."""
    _need_key(key)
    try:
        found = read_jsonl(file, user)
    except UnreadableImportError as exc:
        typer.echo(f"memstore: {exc}", err=True)
        raise typer.Exit(1) from exc
    if found.export is None or replay:
        _run_import(
            url,
            key,
            found.chunks,
            batch_size=batch_size,
            wait=wait,
            timeout_s=timeout_s,
            expected=found.memories(),
        )
        return
    console = _console()
    try:
        with Client(url, key) as client:
            written = load_history(client, found.records, console=console)
            console.print(
                "written: "
                + ", ".join(f"{written[k]} {k}" for k in ("changesets", "chunks", "memories", "versions"))
            )
            unfinished = [
                c["chunk_id"]
                for kinds in found.records.values()
                for c in kinds["chunks"]
                if c.get("status") in ("queued", "processing")
            ]
            if wait and unfinished:
                with _progress(console) as progress:
                    states = _wait(client, [str(i) for i in unfinished], timeout_s, progress)
                console.print(
                    "unfinished chunks now " + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
                )
            else:
                _verify(client, found.memories(), console)
    except MemstoreError as exc:
        console.print(f"[red]memstore: {exc}[/red]", highlight=False)
        raise typer.Exit(1) from exc


def export(
    user: Annotated[str, typer.Option("--user", help="The user whose bank and history to export.")],
    url: Url = "http://127.0.0.1:8000",
    key: Key = "",
    out: Annotated[Path, typer.Option("--out", help="Where to write the JSON Lines ('-': stdout).")] = Path(
        "-"
    ),
) -> None:
    """Write a user's chunks, memories with every version, and changesets as JSON Lines (admin key)."""
    _need_key(key)
    console = _console()
    try:
        with Client(url, key) as client:
            if str(out) == "-":
                counts = export_user(client, user, sys.stdout, console)
            else:
                with out.open("w", encoding="utf-8") as sink:
                    counts = export_user(client, user, sink, console)
    except MemstoreError as exc:
        console.print(f"[red]memstore: {exc}[/red]", highlight=False)
        raise typer.Exit(1) from exc
    console.print(", ".join(f"{n} {kind}" for kind, n in counts.items()) + f" of {user} exported")


def export_user(client: Client, user_id: str, sink: IO[str], console: Console) -> dict[str, int]:
    """Write the export of `user_id` to `sink`; how many records of each kind."""

    def line(record: Any) -> None:
        sink.write(msgspec.json.encode(record).decode() + "\n")

    line(
        {
            "type": "export",
            "format": EXPORT_FORMAT,
            "user_id": user_id,
            "exported_at": datetime.now(UTC).isoformat(),
        }
    )
    chunks = sorted(client.iter_chunks("all", user_id), key=lambda c: c.seq)
    for chunk in chunks:
        line(_chunk_record(chunk))
    memories = list(client.iter_memories(user_id, status="all", limit=1000))
    with _progress(console) as progress:
        task = progress.add_task("exporting memories", total=len(memories))
        for memory in memories:
            versions = client.history(memory.id).versions
            line({"type": "memory", **msgspec.to_builtins(memory), "versions": versions})
            progress.advance(task)
    changesets = list(client.iter_changesets(user_id=user_id))
    for changeset in reversed(changesets):  # oldest first
        line({"type": "changeset", **msgspec.to_builtins(changeset)})
    return {"chunks": len(chunks), "memories": len(memories), "changesets": len(changesets)}


def _chunk_record(chunk: models.ChunkStatus) -> dict[str, Any]:
    record: dict[str, Any] = {
        "type": "chunk",
        "chunk_id": chunk.chunk_id,
        "user_id": chunk.user_id,
        "messages": [_message(m) for m in chunk.messages or []],
        "idempotency_key": f"export:{chunk.chunk_id}",
        "seq": chunk.seq,
        "status": chunk.status,
        "received_at": chunk.received_at,
        "attempts": chunk.attempts,
    }
    for name in ("agent_id", "run_id", "writer", "metadata", "applied_at", "changeset_id", "error"):
        value = getattr(chunk, name)
        if value:
            record[name] = value
    return record


def _message(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored message as a chunk takes it again (fields never set left out)."""
    return {k: v for k, v in stored.items() if v is not None}


def _need_key(key: str) -> None:
    if not key:
        typer.echo("memstore: an API key is needed (--key or MEMSTORE_API_KEY)", err=True)
        raise typer.Exit(2)
