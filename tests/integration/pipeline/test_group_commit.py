"""Group commit: results of several scopes applied in one transaction, and one bad result isolated."""

from __future__ import annotations

import asyncio
import uuid

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import Changeset, Chunk, Memory
from app.domain.memories.services import ApplyRequest, Provenance
from app.domain.pipeline.applier import Result
from app.domain.pipeline.locks import scope_lock_key
from app.domain.pipeline.repositories import ChunkRow, PipelineRepository
from app.domain.pipeline.services import PipelineDeps
from app.embeddings import HashingEmbedder
from app.lib import metrics
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys
from tests.integration.pipeline.test_core_loop import pipeline_deps
from tests.integration.system.test_metrics import sample
from tests.support.scenario import post_users

Client = AsyncTestClient[Litestar]


async def claim(deps: PipelineDeps, tenant_id: uuid.UUID, user_id: str) -> ChunkRow:
    lease = await deps.locks.try_acquire(scope_lock_key(tenant_id, user_id))
    assert lease is not None
    async with AsyncSession(deps.reads) as session:
        claim = await PipelineRepository(session).claim_next(tenant_id, user_id, 5, lease)
    assert claim.lock_held
    assert claim.claimed is not None
    assert claim.next is not None
    assert claim.next.id == claim.claimed.id
    assert (claim.next.attempts, claim.claimed.attempts) == (0, 1)
    return claim.claimed


def batches() -> tuple[float, float]:
    """(chunks, transactions) applied by group commit in this process so far."""
    text = metrics.render().decode()
    return sample(text, "memstore_apply_batch_chunks_sum"), sample(text, "memstore_apply_batch_chunks_count")


def result(chunk: ChunkRow, content: str, changeset_id: uuid.UUID | None = None) -> Result:
    request = ApplyRequest(
        tenant_id=chunk.tenant_id,
        user_id=chunk.user_id,
        ops=[Op(OpKind.ADD, content)],
        shown={},
        provenance=Provenance(actor="worker:test", writer="test", chunk_id=chunk.id),
        changeset_id=changeset_id or uuid.uuid4(),
    )
    # Embedded before the apply, as the worker does.
    return Result(chunk, request, {content: HashingEmbedder(384).embed_one(content)})


async def test_results_ready_together_commit_together_and_a_bad_one_fails_alone(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    engine: object,
) -> None:
    users = ["a", "b", "c", "d", "e"]
    await post_users(api, ingest_headers, users, facts=["I live in Oslo."])
    async with pipeline_deps(pipeline_settings, engine) as deps:
        chunks = {u: await claim(deps, tenant.tenant_id, u) for u in users}
        batches_before = batches()
        # a, b and c arrive in the same turn and share one transaction.
        together = await asyncio.gather(
            *(deps.applier.apply(result(chunks[u], f"The user {u} lives in Oslo.")) for u in "abc")
        )
        # e's result reuses c's changeset id: the batch with d's fails, then each is tried alone.
        clash = together[2]
        assert clash is not None
        fine = result(chunks["d"], "The user d lives in Oslo.")
        outcomes = await asyncio.gather(
            deps.applier.apply(fine),
            deps.applier.apply(result(chunks["e"], "never stored", changeset_id=clash.changeset_id)),
            return_exceptions=True,
        )
        # a-c formed one batch and d with e another (which failed, and each was then tried alone).
        chunks_after, transactions_after = batches()
        assert (chunks_after - batches_before[0], transactions_after - batches_before[1]) == (5, 2)

    assert all(o is not None and o.applied == 1 for o in together)
    assert not isinstance(outcomes[0], BaseException)
    assert outcomes[0] is not None
    assert outcomes[0].changeset_id == fine.request.changeset_id
    assert isinstance(outcomes[1], IntegrityError)
    async with sessionmaker() as session:
        status = dict(
            (
                await session.execute(
                    select(Chunk.user_id, Chunk.status).where(Chunk.tenant_id == tenant.tenant_id)
                )
            )
            .tuples()
            .all()
        )
        contents = set(
            (await session.scalars(select(Memory.content).where(Memory.tenant_id == tenant.tenant_id))).all()
        )
        changesets = (
            await session.scalars(select(Changeset.chunk_id).where(Changeset.tenant_id == tenant.tenant_id))
        ).all()
    assert status == dict.fromkeys("abcd", "applied") | {"e": "processing"}  # e waits for its retry
    assert contents == {f"The user {u} lives in Oslo." for u in "abcd"}
    assert sorted(map(str, changesets)) == sorted(str(chunks[u].id) for u in "abcd")


async def test_a_result_whose_claim_moved_on_is_skipped_in_a_batch(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    engine: object,
) -> None:
    """A chunk re-claimed elsewhere (its attempts moved on) is not applied by the stale claim, while the
    rest of its batch is."""
    await post_users(api, ingest_headers, ["x", "y"], facts=["I like tea."])
    async with pipeline_deps(pipeline_settings, engine) as deps:
        x, y = await claim(deps, tenant.tenant_id, "x"), await claim(deps, tenant.tenant_id, "y")
        async with sessionmaker() as session, session.begin():  # another worker took x since
            chunk = await session.get(Chunk, (x.tenant_id, x.id))
            assert chunk is not None
            chunk.attempts += 1
        stale, live = await asyncio.gather(
            deps.applier.apply(result(x, "The user x likes tea.")),
            deps.applier.apply(result(y, "The user y likes tea.")),
        )
    assert stale is None
    assert live is not None
    assert live.applied == 1
    async with sessionmaker() as session:
        contents = set(
            (await session.scalars(select(Memory.content).where(Memory.tenant_id == tenant.tenant_id))).all()
        )
    assert contents == {"The user y likes tea."}
