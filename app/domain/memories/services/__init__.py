"""Memories' services: reading the bank, and applying ops as new versions.

Where things are:

- `requests`: what an apply is asked and answers (`ApplyRequest`, `Shown`, `Provenance`,
  `ApplyLimits`, `ApplyOutcome`);
- `apply`: `embed_ops`, then `apply_ops` / `apply_many`: lock the targets, run the guards, build the
  rows and write them, in the caller's transaction;
- `guards`: which ops may apply, which are held for review, which ADDs only repeat a memory;
- `rows`: the changeset, head, version and review rows an apply writes;
- `edits`: hand edits and deletes (`write` keys);
- `reads`: a page of the bank (now or as of a time), one memory, its versions;
- `cursors`: the keyset cursors of the HTTP lists.

Every row of `memories` and `memory_versions` is written by `memories.version_writer`, whoever
decides it (an apply here, an undo in `history`, an import in `transfer`, `memstore reembed`).

Other packages import from `app.domain.memories.services`; the names below are its public face.
"""

from app.domain.memories.services.apply import apply_many, apply_ops, embed_ops, texts_to_embed
from app.domain.memories.services.edits import delete_memory, edit_memory
from app.domain.memories.services.reads import get_memory, list_memories, memory_history
from app.domain.memories.services.requests import (
    MAX_MEMORY_CHARS,
    ApplyLimits,
    ApplyOutcome,
    ApplyRequest,
    Provenance,
    Shown,
    Vectors,
)

__all__ = [
    "MAX_MEMORY_CHARS",
    "ApplyLimits",
    "ApplyOutcome",
    "ApplyRequest",
    "Provenance",
    "Shown",
    "Vectors",
    "apply_many",
    "apply_ops",
    "delete_memory",
    "edit_memory",
    "embed_ops",
    "get_memory",
    "list_memories",
    "memory_history",
    "texts_to_embed",
]
