"""What one drain of a scope did (`ScopeRun`): the drain counts the chunks it applied and skipped,
the failures it records count theirs, and the job reads it to know when the scope wants its next turn.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass
class ScopeRun:
    """What one `process_scope` call did."""

    applied: int = 0
    failed: int = 0
    retried: int = 0
    skipped: int = 0
    locked_elsewhere: bool = False
    retry_at: datetime | None = None  # the scope waits for a chunk's backoff until then
    lost_lock: bool = False  # the scope lock was found gone mid-run
    no_shadow_slot: bool = False  # a shadow bank's scope put off: the process drains enough of them
    fed: list[uuid.UUID] = field(default_factory=list)  # shadow banks that got the scope's new chunks
    # The seq of the chunk claimed last under the current lease: the next claim reads on from there
    # (`PipelineRepository.claim_next`).
    claimed_seq: int | None = None
    # The chunks are copies (a shadow bank's, a replay's): their processing is a trace of its own,
    # linked to the chunk's (`app.lib.tracing`), instead of continuing it.
    linked: bool = False
    # A turn of the fair scheduler (`scheduler`): the drain stops after the chunk that ends past this
    # moment (monotonic clock), and says whether the scope has `more` ready.
    until: float | None = None
    more: bool = False

    @property
    def served(self) -> int:
        """The chunks this run finished or tried: what its tenant is charged for it."""
        return self.applied + self.failed + self.retried + self.skipped

    def summary(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "failed": self.failed,
            "retried": self.retried,
            "skipped": self.skipped,
            "locked_elsewhere": self.locked_elsewhere,
            "lost_lock": self.lost_lock,
            "retry_at": self.retry_at.isoformat() if self.retry_at else None,
            "no_shadow_slot": self.no_shadow_slot,
            "fed": [str(b) for b in self.fed],
        }
