"""hy-memory 2.0.6's extract and reconcile, as its writer pipeline calls them.

Scenario keys: base_url, model, now (ISO), memory_at (ISO), messages (the chunk: role, content,
name?), context (earlier chunks, each a list of messages, oldest first), extracted (the new memories
given to reconcile: content, owner, tags), existing (candidates: memory_id, content, owner, memory_at,
tags, created_at), step ("extract" or "reconcile").
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from app.writers import references


async def main(scenario: dict[str, Any]) -> None:
    sys.path.insert(0, str(references.folder(references.HY_MEMORY)))
    os.environ.update(
        {
            "MEMORY_LLM_BASE_URL": scenario["base_url"],
            "MEMORY_LLM_API_KEY": "reference",
            "MEMORY_LLM_MODEL": scenario["model"],
            # what the framework tells hy3 users to pass (Memstore sends it for Hy-Memory models)
            "MEMORY_LLM_EXTRA_BODY": json.dumps({"chat_template_kwargs": {"reasoning_effort": "no_think"}}),
            "MEMORY_LLM_MAX_RETRIES": "1",
        }
    )
    import freezegun
    from hy_memory.agent.extractor import Extractor
    from hy_memory.agent.llm_provider import LLMProvider
    from hy_memory.agent.reconciler import MemoryReconciler
    from hy_memory.config import MemoryConfig
    from hy_memory.models.memory import MemoryLayer, MemoryNode
    from hy_memory.pipelines.base import ChatMessage
    from hy_memory.pipelines.base import WriteRequest as HyRequest
    from hy_memory.pipelines.writer import MemoryWriter

    config = MemoryConfig.from_env()
    provider = LLMProvider(config)
    memory_at = datetime.fromisoformat(scenario["memory_at"])
    with freezegun.freeze_time(scenario["now"]):
        if scenario["step"] == "extract":
            # The earlier chunks as the writer stores them (get_flat_content), read back by its own history.
            stored = [
                SimpleNamespace(
                    node_id=f"raw-{i}",
                    content=HyRequest(messages=[ChatMessage.from_dict(m) for m in chunk]).get_flat_content(),
                    gmt_created=datetime(2020, 1, 1 + i),
                )
                for i, chunk in enumerate(scenario["context"])
            ]

            async def list_by_user(**_: Any) -> list[Any]:
                return list(stored)

            history = await MemoryWriter._get_recent_history(
                None, SimpleNamespace(list_by_user=list_by_user), "user", None, max_turns=10
            )
            # MemoryWriter._run_agent: the new messages as the extractor's content
            content = json.dumps(
                [
                    {
                        "role": m["role"],
                        "content": m["content"],
                        **({"name": m["name"]} if m.get("name") else {}),
                    }
                    for m in scenario["messages"]
                ],
                ensure_ascii=False,
            )
            await Extractor(provider, config.llm).extract(
                content=content,
                history_context=history,
                current_time=memory_at.isoformat(timespec="seconds"),
            )
        else:
            nodes = {
                m["memory_id"]: MemoryNode(
                    node_id=m["memory_id"],
                    user_id="user",
                    content=m["content"],
                    owner=m["owner"],
                    tags=list(m.get("tags") or []),
                    layer=MemoryLayer.L2_FACT,
                    memory_at=datetime.fromisoformat(m["memory_at"]) if m.get("memory_at") else None,
                    gmt_created=datetime.fromisoformat(m["created_at"]),
                )
                for m in scenario["existing"]
            }
            store = CandidateStore(nodes)
            meta = [{"content": m["content"], "layer": "L2_FACT", **m} for m in scenario["extracted"]]
            result = await MemoryReconciler(config, provider).reconcile(
                new_memories=[m["content"] for m in scenario["extracted"]],
                user_id="user",
                agent_id="default_agent",
                vector_store=store,
                embed_service=SimpleNamespace(embed_batch=store.embed_batch),
                current_time=memory_at.isoformat(timespec="seconds"),
                new_memories_with_meta=meta,
            )
            print(json.dumps({"degraded": result.degraded, "ops": [o.op for o in result.ops]}))
    await provider.close()


class CandidateStore:
    """The vector store as the reconciler sees it: every candidate found for every new memory, with
    a score above the framework's floor (which memories qualify is Memstore's side of the test)."""

    _is_local = True

    def __init__(self, nodes: dict[str, Any]) -> None:
        self.nodes = nodes

    async def embed_batch(self, texts: list[str]) -> list[list[float]]:
        return [[1.0, 0.0] for _ in texts]

    async def search(self, **_: Any) -> list[dict[str, Any]]:
        return [{"node": node, "score": 0.9} for node in self.nodes.values()]

    async def keyword_search(self, **_: Any) -> list[dict[str, Any]]:
        return []

    async def get_by_ids(self, ids: list[str]) -> list[Any]:
        return [self.nodes.get(i) for i in ids]

    async def get_embeddings(self, ids: list[str]) -> dict[str, list[float]]:
        return {}


if __name__ == "__main__":
    asyncio.run(main(json.load(sys.stdin)))
