"""The rows an apply writes, per table, built from the plans the guards left: a changeset per request,
for each applied op the heads it adds or moves and one version row per memory it touches (with the
request's provenance), and a pending review per held op. `VersionWriter.write_applied` writes the heads
and versions."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from app.domain.memories.repositories import MemoryState
from app.domain.memories.services.guards import Plan, expiry_after, guard
from app.domain.memories.services.requests import ApplyOutcome
from app.writers.base import Op, OpKind


@dataclass
class Rows:
    """The rows a set of plans writes, per table."""

    changesets: list[dict[str, Any]] = field(default_factory=list)
    new: list[dict[str, Any]] = field(default_factory=list)
    changed: list[dict[str, Any]] = field(default_factory=list)
    versions: list[dict[str, Any]] = field(default_factory=list)
    reviews: list[dict[str, Any]] = field(default_factory=list)

    def add(self, plan: Plan) -> ApplyOutcome:
        request, provenance, guards = plan.request, plan.request.provenance, plan.guards
        changeset_id, memory_at = request.changeset_id, request.memory_at
        vectors = iter(plan.vectors)
        recorded: list[dict[str, Any]] = []
        base = {
            "tenant_id": request.tenant_id,
            "user_id": request.user_id,
            "changeset_id": changeset_id,
            "chunk_id": provenance.chunk_id,
            "writer": provenance.writer,
            "model": provenance.model,
            "profile": provenance.profile,
            "prompt_hash": provenance.prompt_hash,
            "actor": provenance.actor,
        }

        def version(
            memory_id: uuid.UUID,
            number: int,
            op: str,
            state: dict[str, Any],
            reason: str | None,
            embedding: list[float] | None = None,
            supersedes: list[uuid.UUID] | None = None,
            superseded_by: uuid.UUID | None = None,
        ) -> None:
            self.versions.append(
                {
                    **base,
                    "memory_id": memory_id,
                    "version": number,
                    "op": op,
                    "content": state["content"],
                    "tags": state["tags"],
                    "owner": state["owner"],
                    "status": state["status"],
                    "memory_at": state["memory_at"],
                    "expires_at": state["expires_at"],
                    "valid_from": state["valid_from"],
                    "valid_to": state["valid_to"],
                    "embedding": embedding,
                    "supersedes": supersedes,
                    "superseded_by": superseded_by,
                    "reason": reason or provenance.reason,
                }
            )

        applied = 0
        for index, op, targets in plan.accepted:
            entry: dict[str, Any] = {"index": index, **op.as_json(), "targets": [str(m.id) for m in targets]}
            recorded.append(entry)
            if index in plan.duplicates:
                next(vectors)
                entry |= {"op": OpKind.NOOP.value, "duplicate_of": plan.duplicates[index][0]}
                guard(guards, "near_duplicate", index, op, plan.duplicates[index][1])
                continue
            if op.kind is OpKind.NOOP:
                continue
            applied += 1
            if op.kind in (OpKind.ADD, OpKind.SUPERSEDE):
                memory_id, embedding = uuid.uuid4(), next(vectors)
                state = {
                    "content": (op.content or "").strip(),
                    "tags": list(op.tags),
                    "owner": op.owner,
                    "status": "active",
                    "memory_at": memory_at,
                    "expires_at": op.expires_at or request.expires_at,
                    "valid_from": op.valid_from,
                    "valid_to": op.valid_to,
                }
                self.new.append(
                    {
                        "id": memory_id,
                        "tenant_id": request.tenant_id,
                        "user_id": request.user_id,
                        "agent_id": request.agent_id,
                        "run_id": request.run_id,
                        "version": 1,
                        "embedding": embedding,
                        "changeset_id": changeset_id,
                        **state,
                    }
                )
                version(
                    memory_id,
                    1,
                    "ADD",
                    state,
                    op.reason,
                    embedding,
                    supersedes=[m.id for m in targets] or None,
                )
                # SUPERSEDE: each replaced memory gets a new, superseded version; a fact still open
                # stopped holding when the new one began (where the writer says), else when the new
                # one was stated.
                ended = op.valid_from or memory_at
                for old in targets:
                    valid_to = old.valid_to or ended
                    old_state = old.state() | {"status": "superseded", "valid_to": valid_to}
                    self.changed.append(
                        old.change(request.tenant_id, changeset_id, status="superseded", valid_to=valid_to)
                    )
                    version(
                        old.id, old.version + 1, "SUPERSEDE", old_state, op.reason, superseded_by=memory_id
                    )
                entry["memory_id"] = str(memory_id)
            elif op.kind is OpKind.UPDATE:
                old = targets[0]
                embedding = next(vectors)
                content = (op.content or "").strip()
                tags = list(op.tags) or list(old.tags)
                expires_at = expiry_after(op, old)
                valid_from, valid_to = op.valid_from or old.valid_from, op.valid_to or old.valid_to
                self.changed.append(
                    old.change(
                        request.tenant_id,
                        changeset_id,
                        content=content,
                        tags=tags,
                        embedding=embedding,
                        memory_at=memory_at,
                        expires_at=expires_at,
                        valid_from=valid_from,
                        valid_to=valid_to,
                    )
                )
                updated = old.state() | {
                    "content": content,
                    "tags": tags,
                    "memory_at": memory_at or old.memory_at,
                    "expires_at": expires_at,
                    "valid_from": valid_from,
                    "valid_to": valid_to,
                }
                version(old.id, old.version + 1, "UPDATE", updated, op.reason, embedding)
                entry["memory_id"] = str(old.id)
            elif op.kind is OpKind.DELETE:
                old = targets[0]
                self.changed.append(old.change(request.tenant_id, changeset_id, status="deleted"))
                version(old.id, old.version + 1, "DELETE", old.state() | {"status": "deleted"}, op.reason)
                entry["memory_id"] = str(old.id)

        reviews = [self._hold(plan, index, op, targets) for index, op, targets in plan.held]
        self.changesets.append(
            {
                "id": changeset_id,
                "tenant_id": request.tenant_id,
                "user_id": request.user_id,
                "kind": provenance.kind,
                "chunk_id": provenance.chunk_id,
                "writer": provenance.writer,
                "model": provenance.model,
                "profile": provenance.profile,
                "prompt_hash": provenance.prompt_hash,
                "raw_output": request.raw_output,
                "usage": request.usage or {},
                "actor": provenance.actor,
                "reason": provenance.reason,
                "ops": recorded,
                "guards": guards,
            }
        )
        return ApplyOutcome(changeset_id=changeset_id, applied=applied, guards=guards, reviews=reviews)

    def _hold(self, plan: Plan, index: int, op: Op, targets: list[MemoryState]) -> uuid.UUID:
        """A pending review for a held op: the op, its targets at the versions shown, its provenance."""
        request, provenance = plan.request, plan.request.provenance
        review_id = uuid.uuid4()
        self.reviews.append(
            {
                "id": review_id,
                "tenant_id": request.tenant_id,
                "user_id": request.user_id,
                "agent_id": request.agent_id,
                "run_id": request.run_id,
                "changeset_id": request.changeset_id,
                "chunk_id": provenance.chunk_id,
                "op_index": index,
                "op": {k: v for k, v in op.as_json().items() if k != "targets"},
                "targets": [{"memory_id": str(m.id), "version": m.version} for m in targets],
                "memory_at": request.memory_at,
                "writer": provenance.writer,
                "model": provenance.model,
                "profile": provenance.profile,
                "prompt_hash": provenance.prompt_hash,
            }
        )
        guard(plan.guards, "held_for_review", index, op, f"held as review {review_id}")
        return review_id
