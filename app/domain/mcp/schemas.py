"""The MCP tools' arguments: the REST bodies where a route takes one, small structs where it takes a path
and a query; each tool's input schema is made from its struct (`tool_input_schema`).

`add_memory` takes a chunk as `POST /v1/chunks/batch` takes one (with its own `idempotency_key`) and
`search_memories` the body of `POST /v1/memories/search`, so what an agent may send is what a REST
client may, checked by the same decoder.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

from app.domain.ingest.schemas import BatchChunkIn
from app.domain.search.schemas import SearchIn
from app.lib.paging import KEYSET_PATTERN
from app.lib.validation import Moment

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
MemoryId = Annotated[uuid.UUID, msgspec.Meta(description="The memory's id.")]

# The REST bodies, as they are.
AddMemoryArgs = BatchChunkIn
SearchMemoriesArgs = SearchIn


class GetMemoriesArgs(msgspec.Struct, forbid_unknown_fields=True):
    """`GET /v1/memories`'s query."""

    user_id: Id
    agent_id: Id | None = None
    status: Literal["active", "superseded", "deleted", "all"] = "active"
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100
    cursor: Annotated[str, msgspec.Meta(pattern=KEYSET_PATTERN)] | None = None
    as_of: Moment | None = None
    include_expired: bool = False  # also the memories whose expires_at has passed
    # Only the memories whose fact held then (valid time); with the default status, superseded ones too.
    valid_at: Moment | None = None


class MemoryRef(msgspec.Struct, forbid_unknown_fields=True):
    """One memory, by id (`get_memory`, `explain_memory`, `memory_history`)."""

    memory_id: MemoryId


class DeleteMemoryArgs(msgspec.Struct, forbid_unknown_fields=True):
    """`DELETE /v1/memories/{id}?reason=`."""

    memory_id: MemoryId
    reason: Annotated[str, msgspec.Meta(max_length=2_000)] | None = None


def _moment_schema(kind: type) -> dict[str, Any]:
    if kind is Moment:
        return {"type": "string", "format": "date-time"}
    msg = f"no schema for {kind!r}"
    raise NotImplementedError(msg)


def _deployment_fact(info: msgspec.inspect.Type) -> str | None:
    """The `Meta(extra={"deployment": ...})` mark of a field's type, if it has one."""
    for part in info.types if isinstance(info, msgspec.inspect.UnionType) else (info,):
        layer = part
        while isinstance(layer, msgspec.inspect.Metadata):
            fact = (layer.extra or {}).get("deployment")
            if isinstance(fact, str):
                return fact
            layer = layer.type
    return None


def tool_input_schema(args: type[msgspec.Struct], facts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`args`' JSON Schema as one object, its references inlined (MCP clients before 2026-07-28 read only
    `type`, `properties` and `required`), with the deployment's facts (its writers, the largest `top_k`)
    where a field carries a `deployment` mark, as the OpenAPI document has them (`deployment_facts`)."""
    (root,), components = msgspec.json.schema_components(
        [args], schema_hook=_moment_schema, ref_template="#/$defs/{name}"
    )

    def resolve(node: Any) -> Any:
        if isinstance(node, list):
            return [resolve(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return resolve(components[node["$ref"].removeprefix("#/$defs/")])
        return {key: resolve(value) for key, value in node.items()}

    schema: dict[str, Any] = resolve(root)
    # The tool's description says what it does; the struct's name and docstring are the server's.
    schema.pop("title", None)
    schema.pop("description", None)
    info = msgspec.inspect.type_info(args)
    fields = info.fields if isinstance(info, msgspec.inspect.StructType) else ()
    for field in fields:
        fact = _deployment_fact(field.type)
        if fact is None or fact not in facts:
            continue
        prop = schema["properties"][field.encode_name]
        branches = [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]
        for branch in branches:
            branch.update(facts[fact])
    return schema
