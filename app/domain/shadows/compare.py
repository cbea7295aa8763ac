"""Comparing two banks of a tenant: its own (`primary`) and shadow banks, chunk by chunk and memory by
memory.

Chunks are paired by their source chunk (a bank's chunk is keyed by the tenant chunk it copies), so
only chunks both banks were given are compared. For each writer: what happened to those chunks, the
ops it applied (NOOPs apart), memories created per applied chunk (over-storage is a known failure of
memory writers), UPDATE / SUPERSEDE / DELETE per applied chunk, guards fired, failures, latency and
tokens per chunk. Two writers *agree* on a chunk both applied when they applied the same kinds of op
the same number of times. Memories are matched one to one within a user: pairs at least `threshold`
similar (cosine of their stored vectors) first, most similar first, then equal texts (case, spaces
and a final full stop aside); what is left is only in A or only in B.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.shadows.repositories import ActiveMemory, Outcome, ShadowRepository
from app.domain.shadows.services import PRIMARY, bank

CHANGING_OPS = ("UPDATE", "SUPERSEDE", "DELETE")
CREATING_OPS = ("ADD", "SUPERSEDE")
_EXAMPLES = 5


@dataclass
class WriterTally:
    """One writer's side of the compared chunks."""

    chunks: int = 0
    applied: int = 0
    failed: int = 0
    pending: int = 0
    ops: Counter[str] = field(default_factory=Counter)
    guards: Counter[str] = field(default_factory=Counter)
    latency_ms: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    with_usage: int = 0
    active_memories: int = 0

    def count(self, outcome: Outcome) -> None:
        self.chunks += 1
        if outcome.status == "applied":
            self.applied += 1
            self.ops.update(_kinds(outcome))
            self.guards.update(str(g.get("guard")) for g in outcome.guards)
        elif outcome.status == "failed":
            self.failed += 1
        else:
            self.pending += 1
        if outcome.usage:
            self.with_usage += 1
            self.latency_ms += float(outcome.usage.get("latency_ms") or 0)
            self.prompt_tokens += int(outcome.usage.get("prompt_tokens") or 0)
            self.completion_tokens += int(outcome.usage.get("completion_tokens") or 0)

    def report(self) -> dict[str, Any]:
        per_applied = max(1, self.applied)
        per_call = max(1, self.with_usage)
        return {
            "chunks": self.chunks,
            "applied": self.applied,
            "failed": self.failed,
            "pending": self.pending,
            "ops": dict(sorted(self.ops.items())),
            "memories_per_chunk": round(sum(self.ops[k] for k in CREATING_OPS) / per_applied, 4),
            "rates": {k.lower(): round(self.ops[k] / per_applied, 4) for k in CHANGING_OPS},
            "guards": dict(sorted(self.guards.items())),
            "latency_ms_per_chunk": round(self.latency_ms / per_call, 1),
            "tokens_per_chunk": {
                "prompt": round(self.prompt_tokens / per_call, 1),
                "completion": round(self.completion_tokens / per_call, 1),
            },
            "active_memories": self.active_memories,
        }


@dataclass
class Side:
    """A comparison of two banks over some users."""

    a: WriterTally = field(default_factory=WriterTally)
    b: WriterTally = field(default_factory=WriterTally)
    both_applied: int = 0
    agreeing: int = 0
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    matched: list[tuple[str, str, float | None]] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        return {
            "chunks": self.a.chunks,
            "both_applied": self.both_applied,
            "agreeing_chunks": self.agreeing,
            "agreement": round(self.agreeing / self.both_applied, 4) if self.both_applied else None,
            "a": self.a.report(),
            "b": self.b.report(),
            "memories": {
                "only_a": len(self.only_a),
                "only_b": len(self.only_b),
                "matched": len(self.matched),
                "examples": {
                    "only_a": self.only_a[:_EXAMPLES],
                    "only_b": self.only_b[:_EXAMPLES],
                    "matched": [
                        {"a": a, "b": b, "similarity": None if s is None else round(s, 4)}
                        for a, b, s in self.matched[:_EXAMPLES]
                    ],
                },
            },
        }


async def compare_banks(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    a: str,
    b: str,
    *,
    user_id: str | None = None,
    threshold: float = 0.9,
    chunk_rows: int = 200,
) -> dict[str, Any]:
    """The comparison of banks `a` and `b` (`primary` or a shadow bank's name) of the tenant: tenant-wide,
    per user, and the first `chunk_rows` chunks one by one."""
    sides = {
        name: tenant_id if name == PRIMARY else (await bank(session, tenant_id, name)).id for name in (a, b)
    }
    repo = ShadowRepository(session)
    outcomes_a = {o.source_id: o for o in await repo.outcomes(sides[a], user_id)}
    outcomes_b = {o.source_id: o for o in await repo.outcomes(sides[b], user_id)}
    common = [key for key in outcomes_a if key in outcomes_b]
    users = sorted({outcomes_a[key].user_id for key in common})

    total, per_user = Side(), {u: Side() for u in users}
    rows: list[dict[str, Any]] = []
    for key in common:
        first, second = outcomes_a[key], outcomes_b[key]
        for side in (total, per_user[first.user_id]):
            side.a.count(first)
            side.b.count(second)
        if first.status == second.status == "applied":
            agree = Counter(_kinds(first)) == Counter(_kinds(second))
            for side in (total, per_user[first.user_id]):
                side.both_applied += 1
                side.agreeing += agree
        else:
            agree = False
        if len(rows) < chunk_rows:
            rows.append(
                {
                    "source_chunk_id": key,
                    "user_id": first.user_id,
                    "seq": first.seq,
                    "a": _chunk_view(first),
                    "b": _chunk_view(second),
                    "agree": agree,
                }
            )

    memories_a = _by_user(await repo.active_memories(sides[a], user_id))
    memories_b = _by_user(await repo.active_memories(sides[b], user_id))
    similar: dict[str, list[tuple[uuid.UUID, uuid.UUID, float]]] = {}
    owner = {m.id: m.user_id for ms in memories_a.values() for m in ms}
    for pair in await repo.similar_pairs(sides[a], sides[b], user_id, threshold):
        similar.setdefault(owner.get(pair[0], ""), []).append(pair)
    for user in users:
        side = per_user[user]
        mine, theirs = memories_a.get(user, []), memories_b.get(user, [])
        side.a.active_memories, side.b.active_memories = len(mine), len(theirs)
        total.a.active_memories += len(mine)
        total.b.active_memories += len(theirs)
        matched, only_a, only_b = match_memories(mine, theirs, similar.get(user, []))
        side.matched, side.only_a, side.only_b = matched, only_a, only_b
        total.matched += matched
        total.only_a += only_a
        total.only_b += only_b

    return {
        "a": a,
        "b": b,
        "user_id": user_id,
        "threshold": threshold,
        "only_in_a_chunks": len(outcomes_a) - len(common),
        "only_in_b_chunks": len(outcomes_b) - len(common),
        "tenant": total.report(),
        "users": [{"user_id": u, **per_user[u].report()} for u in users],
        "chunks": rows,
    }


def match_memories(
    mine: list[ActiveMemory], theirs: list[ActiveMemory], similar: list[tuple[uuid.UUID, uuid.UUID, float]]
) -> tuple[list[tuple[str, str, float | None]], list[str], list[str]]:
    """One-to-one pairs: the `similar` pairs (at or above the threshold), best first, then equal texts;
    and the texts left on each side."""
    left = {m.id: m for m in mine}
    right = {m.id: m for m in theirs}
    matched: list[tuple[str, str, float | None]] = []
    for a_id, b_id, similarity in sorted(similar, key=lambda p: (-p[2], str(p[0]), str(p[1]))):
        if a_id in left and b_id in right:
            matched.append((left.pop(a_id).content, right.pop(b_id).content, similarity))
    by_text: dict[str, list[ActiveMemory]] = {}
    for memory in right.values():
        by_text.setdefault(_normalised(memory.content), []).append(memory)
    for a_id, memory in list(left.items()):
        same = by_text.get(_normalised(memory.content))
        if same:
            other = same.pop(0)
            del left[a_id], right[other.id]
            matched.append((memory.content, other.content, None))
    return matched, [m.content for m in left.values()], [m.content for m in right.values()]


def _kinds(outcome: Outcome) -> list[str]:
    return [str(op.get("op")) for op in outcome.ops if op.get("op") and op.get("op") != "NOOP"]


def _chunk_view(outcome: Outcome) -> dict[str, Any]:
    return {
        "status": outcome.status,
        "ops": dict(sorted(Counter(_kinds(outcome)).items())),
        "guards": sorted(str(g.get("guard")) for g in outcome.guards),
        "error": outcome.error if outcome.status == "failed" else None,
    }


def _by_user(memories: Sequence[ActiveMemory]) -> dict[str, list[ActiveMemory]]:
    found: dict[str, list[ActiveMemory]] = {}
    for memory in memories:
        found.setdefault(memory.user_id, []).append(memory)
    return found


def _normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().rstrip(".").casefold()


def render_markdown(report: dict[str, Any]) -> str:
    """The comparison as a reviewer reads it: one table tenant-wide, then one row per user."""
    a, b, total = report["a"], report["b"], report["tenant"]
    lines = [
        f"# {a} vs {b}",
        "",
        f"{total['chunks']} chunks given to both; {total['both_applied']} applied by both; "
        f"they agree on {total['agreeing_chunks']}"
        + (f" ({total['agreement']:.0%})." if total["agreement"] is not None else "."),
        "",
        f"| | {a} | {b} |",
        "| --- | --- | --- |",
    ]

    def row(label: str, key: Any) -> None:
        lines.append(f"| {label} | {key(total['a'])} | {key(total['b'])} |")

    row("applied / failed / pending", lambda s: f"{s['applied']} / {s['failed']} / {s['pending']}")
    row("memories per chunk", lambda s: s["memories_per_chunk"])
    for kind in ("update", "supersede", "delete"):
        row(f"{kind.upper()} per chunk", lambda s, k=kind: s["rates"][k])
    row("active memories", lambda s: s["active_memories"])
    row("guards", lambda s: ", ".join(f"{k} {v}" for k, v in s["guards"].items()) or "-")
    row("latency ms per chunk", lambda s: s["latency_ms_per_chunk"])
    row(
        "tokens per chunk (prompt / completion)",
        lambda s: f"{s['tokens_per_chunk']['prompt']} / {s['tokens_per_chunk']['completion']}",
    )
    memories = total["memories"]
    lines += [
        "",
        f"Memories: {memories['matched']} matched, {memories['only_a']} only in {a}, "
        f"{memories['only_b']} only in {b} (similarity at least {report['threshold']}, then equal text).",
    ]
    for side, name in (("only_a", a), ("only_b", b)):
        for text in memories["examples"][side]:
            lines.append(f"- only in {name}: {text}")
    if report["users"]:
        lines += [
            "",
            "| user | chunks | agreement | memories/chunk a | memories/chunk b | matched | only a | only b |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for user in report["users"]:
            agreement = "-" if user["agreement"] is None else f"{user['agreement']:.0%}"
            lines.append(
                f"| {user['user_id']} | {user['chunks']} | {agreement} | {user['a']['memories_per_chunk']} "
                f"| {user['b']['memories_per_chunk']} | {user['memories']['matched']} "
                f"| {user['memories']['only_a']} | {user['memories']['only_b']} |"
            )
    return "\n".join(lines) + "\n"
