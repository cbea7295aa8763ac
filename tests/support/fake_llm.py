"""A fake memory-writer model server that speaks real HTTP in the OpenAI chat-completions shape
(and `/v1/embeddings`, for the openai embedder).

Tests and benchmarks point a writer at it exactly as at vLLM. It answers from a script of `Reply`s
(consumed in order) and otherwise from a responder that speaks each profile's protocol well enough
to add what it is told. Replies can be slow, fail (500, 429 with Retry-After), break the body
(truncated, not JSON), or carry whatever content a test needs (invented ids, huge outputs).
Every request body is recorded, and what each caller (told apart by its bearer key) asked for is
counted: calls, the fake's token estimate, embedding requests and texts. `LlamaCppPython` wraps a
responder to answer as llama-cpp-python's server does with a small model behind it (its refusal of
`json_schema`, its grammar-enforced schema).

In-process: `async with FakeLLM() as fake: fake.base_url ...`. As its own process (benchmarks):
`python -m tests.support.fake_llm --latency 1.0` prints `PORT <n>` and serves until killed; a
benchmark changes its latency, reads the counts by caller and queues scripted replies over HTTP
(`/fake/settings`, `/fake/usage`, `/fake/script`).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import functools
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import jsonschema_rs
import uvicorn
from litestar import Litestar, Request, Response, get, post

from tests.support.waiting import wait_for


@dataclass
class Reply:
    """One answer of the fake model."""

    content: str | None = None  # the assistant message; None: the responder decides
    status: int = 200
    delay_s: float | None = None  # None: the server's latency
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None  # a raw body instead of a chat completion (truncated, not JSON ...)
    finish_reason: str = "stop"

    @classmethod
    def json(cls, value: Any, **kwargs: Any) -> Reply:
        return cls(content=json.dumps(value), **kwargs)


Responder = Callable[[dict[str, Any]], Reply]


@dataclass
class Call:
    """What a request of one of the writer protocols asks, read back from its messages: the protocol
    and step, what the user said in the new messages, and the memories or facts it shows."""

    # hy-memory.extract, hy-memory.reconcile, mem0.extract, mem0.update, mem0-v3.extract (Mem0 2.x's own
    # requests too, bench/vs_mem0), memos.extract, simple.extract, or unknown
    protocol: str
    said: list[str] = field(default_factory=list)  # the user's messages, in order
    existing: list[dict[str, Any]] = field(default_factory=list)  # memories shown (ids as shown)
    new: list[dict[str, Any]] = field(default_factory=list)  # hy-memory reconcile: the new memories
    facts: list[str] = field(default_factory=list)  # mem0 update: the new facts
    user: str = ""  # the prompt's user message


@functools.cache
def _reference_texts() -> dict[str, str]:
    """The reference texts the profiles send, to know a request by (read from the installed
    reference packages, as the profiles read them)."""
    from app.writers.profiles import get_profile

    texts: dict[str, str] = {}
    for name in ("hy-memory", "mem0", "mem0-v3", "memos"):
        texts |= {f"{name}:{key}": value for key, value in get_profile(name).prompts.texts.items()}
    return texts


def _json_arrays(text: str) -> list[Any]:
    """Every JSON array that starts a line of `text`, in order."""
    found = []
    for match in re.finditer(r"(?m)^\[", text):
        with contextlib.suppress(json.JSONDecodeError):
            found.append(json.JSONDecoder().raw_decode(text[match.start() :])[0])
    return found


def _role_lines(text: str, role: str = "user") -> list[str]:
    """The `role: content` lines of a rendered conversation (`role: [time]: content` for MemOS)."""
    found = []
    for line in text.splitlines():
        match = re.match(rf"^{role}: (?:\[[^\]]*\]: )?(.*)$", line)
        if match and match.group(1).strip():
            found.append(match.group(1).strip())
    return found


def _python_lists(text: str) -> list[Any]:
    """The Python-literal lists Mem0's update prompt shows between ``` fences."""
    found = []
    for block in re.findall(r"```\s*(\[.*?\])\s*```", text, flags=re.DOTALL):
        with contextlib.suppress(ValueError, SyntaxError):
            found.append(ast.literal_eval(block))
    return found


def read_call(body: dict[str, Any]) -> Call:
    """Which protocol and step `body` is, and what it shows."""
    messages = body["messages"]
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    # the prompt's user turn (a repair request repeats it and appends the complaint)
    user = next(m["content"] for m in messages if m["role"] == "user")
    texts = _reference_texts()
    if system and system in (
        texts["hy-memory:EXTRACT_SYSTEM_PROMPT"],
        texts["hy-memory:EXTRACT_SYSTEM_PROMPT_ZH"],
    ):
        new = next((a for a in _json_arrays(user) if a and all("role" in m for m in a)), [])
        said = [m["content"] for m in new if m["role"] == "user"]
        return Call("hy-memory.extract", said=said, user=user)
    if any(
        user.startswith(texts[f"hy-memory:{k}"][:40]) for k in ("RECONCILE_PROMPT", "RECONCILE_PROMPT_ZH")
    ):
        blocks = [
            a for a in _json_arrays(user) if a and all(isinstance(m, dict) and "content" in m for m in a)
        ]
        existing = [m for a in blocks for m in a if "memory_id" in m]
        new = [m for a in blocks for m in a if "memory_id" not in m]
        return Call("hy-memory.reconcile", existing=existing, new=new, user=user)
    mem0_slot = "{datetime.now().strftime('%Y-%m-%d')}"
    if system and any(
        system.startswith(texts[f"mem0:{k}"].split(mem0_slot)[0])
        for k in ("USER_MEMORY_EXTRACTION_PROMPT", "AGENT_MEMORY_EXTRACTION_PROMPT")
    ):
        return Call("mem0.extract", said=_role_lines(user.removeprefix("Input:\n")), user=user)
    if not system and user.startswith(texts["mem0:DEFAULT_UPDATE_MEMORY_PROMPT"]):
        lists = _python_lists(user[len(texts["mem0:DEFAULT_UPDATE_MEMORY_PROMPT"]) :])
        existing = lists[0] if len(lists) == 2 else []
        return Call("mem0.update", existing=existing, facts=lists[-1] if lists else [], user=user)
    if system == texts["mem0-v3:ADDITIVE_EXTRACTION_PROMPT"]:
        new = user.split("## New Messages", 1)[-1].split("## Observation Date", 1)[0]
        return Call(
            "mem0-v3.extract",
            said=_role_lines(new),
            existing=json_after(user, "## Existing Memories"),
            user=user,
        )
    if any(
        user.startswith(texts[f"memos:{k}"][:60])
        for k in ("SIMPLE_STRUCT_MEM_READER_PROMPT", "SIMPLE_STRUCT_MEM_READER_PROMPT_ZH")
    ):
        conversation = re.split("\n(?:Conversation:|对话\uff1a)\n", user)[-1]
        return Call("memos.extract", said=_role_lines(conversation), user=user)
    if '{"memories"' in system:
        return Call("simple.extract", said=_simple_lines(user), user=user)
    return Call("unknown", user=user)


def _simple_lines(text: str) -> list[str]:
    """The user's lines of the `simple` protocol ("[date] user (name): text" per line)."""
    found = []
    for line in text.splitlines():
        match = re.match(r"^(?:\[[^\]]*\] )?user(?: \([^)]*\))?: (.*)$", line)
        if match and match.group(1).strip():
            found.append(match.group(1).strip())
    return found


def json_after(text: str, heading: str) -> Any:
    start = text.find(heading)
    if start < 0:
        return []
    value, _ = json.JSONDecoder().raw_decode(text[start + len(heading) :].lstrip())
    return value


def protocol_responder(body: dict[str, Any]) -> Reply:
    """Answer as a cooperative memory model of the protocol the request speaks: remember what the
    user said, add what is new, change nothing else."""
    call = read_call(body)
    said = [f"The user said: {s}" for s in call.said]
    # Hy-Memory writes its JSON in a ```json fence, unless a grammar holds it to the JSON alone.
    fence = "schema" not in json.dumps(body.get("response_format") or {})
    if call.protocol == "hy-memory.extract":
        memory = [{"content": s, "tags": ["said"], "owner": "user"} for s in said]
        answer = json.dumps({"memory": memory, "intentions": [], "basic_info": {}})
        return Reply(content=f"```json\n{answer}\n```" if fence else answer)
    if call.protocol == "hy-memory.reconcile":
        known = {m["content"] for m in call.existing}
        ops = [
            {"op": "ADD", "content": m["content"], "owner": m["owner"], "tags": m["tags"]}
            for m in call.new
            if m["content"] not in known
        ]
        return Reply(content=f"```json\n{json.dumps(ops)}\n```" if fence else json.dumps(ops))
    if call.protocol == "mem0.extract":
        return Reply.json({"facts": call.said})
    if call.protocol == "mem0.update":  # new facts get the ids after the shown ones
        known = {m["text"] for m in call.existing}
        first_new = 1 + max((int(m["id"]) for m in call.existing), default=-1)
        events = [
            {"id": str(first_new + i), "text": f, "event": "ADD"}
            for i, f in enumerate(call.facts)
            if f not in known
        ]
        return Reply.json({"memory": events})
    if call.protocol == "mem0-v3.extract":
        # what the user said in the new messages, less what the existing memories shown already say
        known = {m["text"] for m in call.existing}
        fresh = [s for s in call.said if s not in known]
        return Reply.json(
            {"memory": [{"id": str(i), "text": s, "attributed_to": "user"} for i, s in enumerate(fresh)]}
        )
    if call.protocol == "memos.extract":
        items = [
            {"key": f"Said {i + 1}", "memory_type": "UserMemory", "value": s, "tags": ["said"]}
            for i, s in enumerate(said)
        ]
        return Reply.json({"memory list": items, "summary": " ".join(item["value"] for item in items)})
    if call.protocol == "simple.extract":
        return Reply.json({"memories": said})
    return Reply.json({})


# llama-cpp-python's answer to a `json_schema` response_format: its request model takes only "text" or
# "json_object", and its route handler turns FastAPI's validation error into an HTTP 500.
LLAMA_CPP_PYTHON_REFUSAL = json.dumps(
    {
        "error": {
            "message": "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', "
            "'type'), 'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema', 'ctx': "
            "{'expected': \"'text' or 'json_object'\"}}\n  Endpoint: /v1/chat/completions",
            "type": "internal_server_error",
            "param": None,
            "code": None,
        }
    }
).encode()


def small_model_json(body: dict[str, Any]) -> Reply:
    """What a small model writes when only "some JSON" is asked for: the same shape for every prompt,
    none of them the protocol's."""
    return Reply.json({"memory": "The user ..."})


class LlamaCppPython:
    """A responder that answers as llama-cpp-python's server with a small model behind it.

    `json_schema` is refused with its HTTP 500. A schema sent as `{"type": "json_object", "schema": S}`
    is enforced by grammar: the answer is the wrapped responder's, which must conform to S (one that
    does not is recorded in `violations` and answered with a 500, as no grammar would let it through).
    Plain `json_object`, or no response_format, gets `unconstrained`'s answer (the model's own shape).
    Scripted replies are sent as they are.
    """

    def __init__(
        self, responder: Responder = protocol_responder, unconstrained: Responder = small_model_json
    ):
        self.responder = responder
        self.unconstrained = unconstrained
        self.refused = 0  # json_schema requests answered with the 500
        self.enforced = 0  # requests answered under a schema
        self.violations: list[str] = []

    def __call__(self, body: dict[str, Any]) -> Reply:
        sent = body.get("response_format")
        if sent is not None and sent.get("type") not in ("text", "json_object"):
            self.refused += 1
            return Reply(status=500, body=LLAMA_CPP_PYTHON_REFUSAL)
        if sent is None or sent.get("type") == "text" or "schema" not in sent:
            return self.unconstrained(body)
        reply = self.responder(body)
        if reply.status != 200 or reply.body is not None:
            return reply
        try:
            errors = [
                e.message
                for e in jsonschema_rs.validator_for(sent["schema"]).iter_errors(
                    json.loads(reply.content or "")
                )
            ]
        except json.JSONDecodeError as exc:
            errors = [f"not JSON: {exc}"]
        if errors:
            self.violations.append("; ".join(errors))
            message = json.dumps({"error": {"message": f"fake: answer outside the grammar: {errors}"}})
            return Reply(status=500, body=message.encode())
        self.enforced += 1
        return reply


class FakeLLM:
    """The server; `script` replies go first, then `responder`."""

    def __init__(
        self,
        responder: Responder = protocol_responder,
        latency_s: float = 0.0,
        model: str = "hy-memory",
        port: int = 0,  # 0: any free port; a given one serves again where a stopped server was
    ) -> None:
        self.responder = responder
        self.latency_s = latency_s
        self.embedding_latency_s: float | None = None  # None: `latency_s`
        self.model = model
        self.script: deque[Reply] = deque()
        # By caller (the bearer key of the request, "-" without one): chat calls, prompt and
        # completion tokens (the fake's estimate, 4 characters a token), embedding calls and texts.
        self.usage: dict[str, dict[str, int]] = {}
        self.requests: list[dict[str, Any]] = []
        # /v1/embeddings: scripted failures first, then vectors of `embedding_dim` from a hashing model
        # (scaled, so clients must normalise), unless `embedding_dim` is changed to test a mismatch.
        self.embedding_script: deque[Reply] = deque()
        self.embedding_requests: list[dict[str, Any]] = []
        self.embedding_dim = 384
        self.embed_text: Callable[[str], list[float]] | None = None  # None: the hashing model
        # While `held_embeddings` is used: /v1/embeddings requests wait until it ends (see there).
        self._embeddings_release: threading.Event | None = None
        self._embeddings_arrived = threading.Event()
        self.in_flight = 0
        self.max_in_flight = 0
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.port = port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def enqueue(self, *replies: Reply) -> None:
        self.script.extend(replies)

    def _count(self, request: Request[Any, Any, Any], **amounts: int) -> None:
        auth = request.headers.get("authorization", "")
        caller = auth.removeprefix("Bearer ").strip() or "-"
        counts = self.usage.setdefault(caller, {})
        for name, amount in amounts.items():
            counts[name] = counts.get(name, 0) + amount

    def app(self) -> Litestar:
        @post("/v1/chat/completions", status_code=200)
        async def chat(request: Request[Any, Any, Any]) -> Response[bytes]:
            body = await request.json()
            self.requests.append(body)
            reply = self.script.popleft() if self.script else self.responder(body)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                # A model's latency: time itself must pass.
                await asyncio.sleep(self.latency_s if reply.delay_s is None else reply.delay_s)
            finally:
                self.in_flight -= 1
            if reply.body is not None or reply.status != 200:
                raw = reply.body if reply.body is not None else b'{"error": {"message": "fake failure"}}'
                return Response(
                    raw, status_code=reply.status, headers=reply.headers, media_type="application/json"
                )
            content = reply.content if reply.content is not None else self.responder(body).content or ""
            usage = {
                "prompt_tokens": sum(len(m["content"]) // 4 for m in body["messages"]),
                "completion_tokens": len(content) // 4,
                "total_tokens": 0,
            }
            self._count(
                request,
                calls=1,
                prompt_tokens=usage["prompt_tokens"],
                completion_tokens=usage["completion_tokens"],
            )
            payload = {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", self.model),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": reply.finish_reason,
                    }
                ],
                "usage": usage,
            }
            return Response(
                json.dumps(payload).encode(), headers=reply.headers, media_type="application/json"
            )

        @post("/v1/embeddings", status_code=200)
        async def embeddings(request: Request[Any, Any, Any]) -> Response[bytes]:
            from app.embeddings import HashingEmbedder

            body = await request.json()
            self.embedding_requests.append(body)
            release = self._embeddings_release
            if release is not None:
                self._embeddings_arrived.set()
                await asyncio.to_thread(release.wait)
            reply = self.embedding_script.popleft() if self.embedding_script else Reply()
            default_delay = self.latency_s if self.embedding_latency_s is None else self.embedding_latency_s
            await asyncio.sleep(default_delay if reply.delay_s is None else reply.delay_s)  # its latency
            if reply.body is not None or reply.status != 200:
                raw = reply.body if reply.body is not None else b'{"error": {"message": "fake failure"}}'
                return Response(
                    raw, status_code=reply.status, headers=reply.headers, media_type="application/json"
                )
            embed_text = self.embed_text or HashingEmbedder(self.embedding_dim).embed_one
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            self._count(request, embedding_calls=1, embedding_texts=len(texts))
            data = [
                {"object": "embedding", "index": i, "embedding": [3.0 * v for v in embed_text(t)]}
                for i, t in enumerate(texts)
            ]
            data.reverse()  # servers may answer out of order; `index` says which is which
            payload = {"object": "list", "data": data, "model": body.get("model", self.model)}
            return Response(json.dumps(payload).encode(), media_type="application/json")

        @get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": self.model, "object": "model"}]}

        @get("/fake/stats")
        async def peek() -> dict[str, Any]:
            """Calls in flight now, peak and count since the last reset (benchmarks sample it)."""
            return {
                "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight,
                "requests": len(self.requests),
            }

        @post("/fake/stats", status_code=200)
        async def stats() -> dict[str, Any]:
            """Calls and peak concurrency since the last call of this endpoint (benchmarks read it)."""
            figures = {"requests": len(self.requests), "max_in_flight": self.max_in_flight}
            self.requests.clear()
            self.max_in_flight = self.in_flight
            return figures

        @post("/fake/settings", status_code=200)
        async def settings(data: dict[str, Any]) -> dict[str, Any]:
            """Change the latency of chat calls (`latency_s`) and of embeddings (`embedding_latency_s`,
            null: the same as chat calls) while serving."""
            if "latency_s" in data:
                self.latency_s = float(data["latency_s"])
            if "embedding_latency_s" in data:
                value = data["embedding_latency_s"]
                self.embedding_latency_s = None if value is None else float(value)
            return {"latency_s": self.latency_s, "embedding_latency_s": self.embedding_latency_s}

        @get("/fake/usage")
        async def usage() -> dict[str, dict[str, int]]:
            """What each caller has asked for since the last reset (`POST /fake/usage`)."""
            return self.usage

        @post("/fake/usage", status_code=200)
        async def reset_usage() -> dict[str, dict[str, int]]:
            counted, self.usage = self.usage, {}
            return counted

        @post("/fake/script", status_code=200)
        async def script(data: list[dict[str, Any]]) -> dict[str, int]:
            """Queue chat replies (`{"content": "..."}` each, as `Reply`), answered before the responder's."""
            self.enqueue(*(Reply(content=str(item["content"])) for item in data))
            return {"queued": len(self.script)}

        return Litestar(
            [chat, embeddings, models, peek, stats, settings, usage, reset_usage, script], debug=False
        )

    async def __aenter__(self) -> FakeLLM:
        config = uvicorn.Config(
            self.app(),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="off",
            backlog=2048,
            timeout_graceful_shutdown=1,  # requests told to hang must not hold up the test's end
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        task, server = self._task, self._server

        def started() -> bool:
            if task.done():
                task.result()  # it failed to start: its error
            return bool(server.started)

        await wait_for(started, timeout_s=30, what="the fake model server listening", interval_s=0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    @contextlib.contextmanager
    def held_embeddings(self) -> Iterator[threading.Event]:
        """/v1/embeddings requests wait, unanswered, until the block ends. The event yielded is set
        once one is waiting, so a test can look at the caller while it waits for the answer."""
        self._embeddings_arrived.clear()
        self._embeddings_release = release = threading.Event()
        try:
            yield self._embeddings_arrived
        finally:
            self._embeddings_release = None
            release.set()

    @contextlib.contextmanager
    def in_thread(self) -> Iterator[FakeLLM]:
        """Serve from a thread of its own, for callers that block the test's event loop (the API under
        `AsyncTestClient` calling the embedder)."""
        started = threading.Event()
        stop: list[asyncio.Event] = []

        async def serve() -> None:
            async with self:
                stop.append(asyncio.Event())
                started.set()
                await stop[0].wait()

        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
        thread.start()
        started.wait(10)
        try:
            yield self
        finally:
            loop.call_soon_threadsafe(stop[0].set)
            thread.join(10)
            loop.close()

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        assert self._task is not None
        self._server.should_exit = True
        self._server.force_exit = True
        await self._task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per call")
    parser.add_argument(
        "--embedding-latency",
        type=float,
        default=None,
        help="seconds per embedding request (default: --latency)",
    )
    args = parser.parse_args()

    async def serve() -> None:
        fake = FakeLLM(latency_s=args.latency)
        fake.embedding_latency_s = args.embedding_latency
        if args.port:
            config = uvicorn.Config(
                fake.app(),
                host="127.0.0.1",
                port=args.port,
                log_level="warning",
                lifespan="off",
                backlog=2048,
            )
            print(f"PORT {args.port}", flush=True)
            await uvicorn.Server(config).serve()
            return
        async with fake:
            print(f"PORT {fake.port}", flush=True)
            await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
