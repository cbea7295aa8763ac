"""The default embedder (all-MiniLM-L6-v2 on ONNX Runtime) finds memories by meaning; the hashing
embedder, lexical, does not. The model is real and loaded once per test session."""

from __future__ import annotations

import asyncio
import math
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.domain.memories.services import Provenance, apply_ops
from app.embeddings import Embedder, HashingEmbedder
from app.embeddings.onnx import ModelIntegrityError, load_model, packaged_files
from app.server.asgi import create_app
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys, bearer
from tests.support.semantic import semantic_embedder

BANK = [
    "The user is vegetarian.",
    "The user lives in Seattle.",
    "The user mainly uses Python.",
    "The user has a golden retriever named Max.",
    "The user plays the cello in an orchestra.",
    "The user's sister is a nurse in Boston.",
    "The user runs a marathon every spring.",
    "The user drinks two cups of coffee each morning.",
    "The user works as a data engineer at a bank.",
]
# Questions that share no content word with the memory that answers them.
BY_MEANING = {
    "Does the user have any pets?": "The user has a golden retriever named Max.",
    "Does the user have any siblings?": "The user's sister is a nurse in Boston.",
    "where is the user's home": "The user lives in Seattle.",
    "What does the user do for exercise?": "The user runs a marathon every spring.",
}


async def store(
    sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID, user_id: str, embedder: Embedder
) -> None:
    async with sessionmaker() as session, session.begin():
        await apply_ops(
            session,
            tenant_id=tenant_id,
            user_id=user_id,
            ops=[Op(OpKind.ADD, c) for c in BANK],
            shown={},
            provenance=Provenance(actor="test", writer="test"),
            embedder=embedder,
        )


async def first_results(
    settings: Settings, embedder_name: str, tenant: TenantKeys, user_id: str, mode: str
) -> dict[str, list[str]]:
    """Each query of BY_MEANING (and the programming-language one) through POST /v1/memories/search."""
    app = create_app(settings.model_copy(update={"embedder": embedder_name}), configure_logs=False)
    found: dict[str, list[str]] = {}
    async with AsyncTestClient(app=app) as client:
        for query in [*BY_MEANING, "which programming language does the user use"]:
            response = await client.post(
                "/v1/memories/search",
                json={"user_id": user_id, "query": query, "top_k": 9, "mode": mode},
                headers=bearer(tenant.admin_key),
            )
            assert response.status_code == 200, response.text
            found[query] = [r["memory"]["content"] for r in response.json()["results"]]
    return found


async def test_meaning_only_queries_find_the_memory_first(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await store(sessionmaker, tenant.tenant_id, "u", semantic_embedder())
    found = await first_results(settings, "onnx", tenant, "u", "hybrid")
    for query, wanted in BY_MEANING.items():
        assert found[query][0] == wanted, (query, found[query])


async def test_the_hashing_embedder_does_not_find_them_first(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await store(sessionmaker, tenant.tenant_id, "u", HashingEmbedder(384))
    found = await first_results(settings, "hashing", tenant, "u", "hybrid")
    for query, wanted in BY_MEANING.items():
        assert found[query][0] != wanted, (query, found[query])


@pytest.mark.parametrize("embedder_name", ["onnx", "hashing"])
async def test_the_programming_language_example(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys, embedder_name: str
) -> None:
    """As a new user tried it: three memories, a question that shares no word with the answer. The
    default embedder alone (vector mode) puts the answer first; hashing puts it last."""
    embedder = semantic_embedder() if embedder_name == "onnx" else HashingEmbedder(384)
    async with sessionmaker() as session, session.begin():
        await apply_ops(
            session,
            tenant_id=tenant.tenant_id,
            user_id="u",
            ops=[Op(OpKind.ADD, c) for c in BANK[:3]],
            shown={},
            provenance=Provenance(actor="test", writer="test"),
            embedder=embedder,
        )
    found = await first_results(settings, embedder_name, tenant, "u", "vector")
    ranked = found["which programming language does the user use"]
    assert ranked.index("The user mainly uses Python.") == (0 if embedder_name == "onnx" else 2)


def _dot(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


async def test_concurrent_calls_share_model_runs_and_match_single_calls() -> None:
    embedder = semantic_embedder()
    texts = [f"The user visited city number {i} and liked its {'old ' * (i % 7)}museums." for i in range(40)]
    alone = [(await embedder.embed([t]))[0] for t in texts[:3]]
    runs_before = embedder.runs
    together = await asyncio.gather(*(embedder.embed([t]) for t in texts))
    assert embedder.runs - runs_before < len(texts) // 4  # coalesced into a few runs, not 40
    for single, batched in zip(alone, together[:3], strict=True):
        # Padded beside longer texts, the vector is the same.
        assert _dot(single, batched[0]) > 0.9999
    for [vector] in together:
        assert math.isclose(math.fsum(v * v for v in vector), 1.0, rel_tol=1e-5)


async def test_embedding_runs_off_the_event_loop() -> None:
    embedder = semantic_embedder()
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.005)  # the tick itself: counts the loop's turns while the model runs

    task = asyncio.create_task(ticker())
    await embedder.embed([f"A long paragraph about topic {i}. " * 20 for i in range(64)])
    stop.set()
    await task
    assert ticks > 5  # the loop kept running while the model worked


def test_a_model_file_that_is_not_the_pinned_one_is_refused(tmp_path: Path) -> None:
    model, tokenizer = packaged_files()
    tampered = tmp_path / "model.onnx"
    shutil.copyfile(model, tampered)
    with tampered.open("r+b") as handle:
        handle.seek(1000)
        byte = handle.read(1)
        handle.seek(1000)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ModelIntegrityError, match="sha256"):
        load_model(tampered, tokenizer, 0, True)


def test_loading_and_embedding_touch_no_network() -> None:
    """In a fresh process whose sockets cannot connect anywhere, the model loads and embeds."""
    script = textwrap.dedent(
        """
        import asyncio, socket

        def refuse(*args, **kwargs):
            raise OSError("network access attempted")

        socket.socket.connect = refuse
        socket.socket.connect_ex = refuse
        socket.create_connection = refuse
        from app.embeddings.onnx import OnnxEmbedder
        [vector] = asyncio.run(OnnxEmbedder().embed(["The user mainly uses Python."]))
        print(len(vector))
        """
    )
    env: dict[str, Any] = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "384"


async def test_a_model_directory_of_the_operators_is_used_unpinned(tmp_path: Path) -> None:
    """MEMSTORE_EMBEDDER_MODEL may name a directory with model.onnx and tokenizer.json; a directory
    without them is refused with a message that says what it needs."""
    from app.embeddings.onnx import OnnxEmbedder

    model, tokenizer = packaged_files()
    directory = tmp_path / "my-minilm"
    directory.mkdir()
    shutil.copyfile(model, directory / "model.onnx")
    shutil.copyfile(tokenizer, directory / "tokenizer.json")
    mine = OnnxEmbedder(str(directory))
    assert mine.name == "onnx:my-minilm:384"
    [a] = await mine.embed(["The user mainly uses Python."])
    [b] = await semantic_embedder().embed(["The user mainly uses Python."])
    assert _dot(a, b) > 0.9999
    with pytest.raises(ModelIntegrityError, match=r"must hold model\.onnx and tokenizer\.json"):
        OnnxEmbedder(str(tmp_path))
