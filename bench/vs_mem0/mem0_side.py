"""Mem0 OSS's side of bench/vs_mem0: runs in Mem0's own virtual environment, never Memstore's.

`run.py` starts it as `<mem0 venv>/bin/python mem0_side.py CONFIG COMMAND INPUT` and reads one JSON
object from the last line of its output. CONFIG is a JSON file: Mem0's `MemoryConfig` as a dict
(`memory`) and the fake model server's address (`fake_url`, for scripted replies). INPUT is a JSON
file with what the command needs:

- `stream`: `{"threads": N, "chunks": [{"user_id", "messages"}, ...]}`: N threads call
  `Memory.add()` on the chunks, each user's chunks in order by one thread (users dealt to threads in
  the order they first appear). With `"progress": true` it prints `START i` and `ACK i <ids>` as
  each add begins and returns, so the caller can kill it mid-run and know what was acknowledged.
- `dups`: `{"user_id", "messages", "n"}`: n threads call `add()` with the same messages at once.
- `overwrite`: `{"user_id", "first", "second", "scripted"}`: add `first`; queue `scripted` (the
  model's answers) on the fake server and add `second`; then overwrite the first memory with
  `Memory.update()` and read it back with `Memory.get()` and `Memory.history()`.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from mem0 import Memory


def deal(chunks: list[dict[str, Any]], threads: int) -> list[list[int]]:
    """Chunk indexes per thread: every chunk of a user goes to the same thread, in stream order."""
    owner: dict[str, int] = {}
    lanes: list[list[int]] = [[] for _ in range(threads)]
    for i, chunk in enumerate(chunks):
        lane = owner.setdefault(chunk["user_id"], len(owner) % threads)
        lanes[lane].append(i)
    return lanes


def stream(memory: Memory, job: dict[str, Any]) -> dict[str, Any]:
    chunks = job["chunks"]
    progress = bool(job.get("progress"))
    adds: list[dict[str, Any] | None] = [None] * len(chunks)
    say = threading.Lock()

    def lane(indexes: list[int]) -> None:
        for i in indexes:
            chunk = chunks[i]
            if progress:
                with say:
                    print(f"START {i}", flush=True)
            start = time.time()
            try:
                result = memory.add(chunk["messages"], user_id=chunk["user_id"])
                ids = [r["id"] for r in result["results"]]
                adds[i] = {"start": start, "end": time.time(), "ids": ids, "error": None}
            except Exception as exc:  # counted and reported: the caller fails the run on any
                adds[i] = {"start": start, "end": time.time(), "ids": [], "error": repr(exc)[:300]}
                ids = []
            if progress:
                with say:
                    print(f"ACK {i} {json.dumps(ids)}", flush=True)

    workers = [threading.Thread(target=lane, args=(ix,)) for ix in deal(chunks, int(job["threads"]))]
    started = time.time()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return {"started": started, "finished": time.time(), "adds": adds}


def dups(memory: Memory, job: dict[str, Any]) -> dict[str, Any]:
    n = int(job["n"])
    gate = threading.Barrier(n)
    errors: list[str] = []

    def one() -> None:
        gate.wait()
        try:
            memory.add(job["messages"], user_id=job["user_id"])
        except Exception as exc:
            errors.append(repr(exc)[:300])

    workers = [threading.Thread(target=one) for _ in range(n)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    stored = memory.get_all(filters={"user_id": job["user_id"]}, top_k=1000)["results"]
    return {"errors": errors, "stored": [m["memory"] for m in stored]}


def overwrite(memory: Memory, job: dict[str, Any], fake_url: str) -> dict[str, Any]:
    user = job["user_id"]
    first = memory.add(job["first"], user_id=user)["results"]
    httpx.post(f"{fake_url}/fake/script", json=[{"content": c} for c in job["scripted"]]).raise_for_status()
    second = memory.add(job["second"], user_id=user)["results"]
    after_add = [m["memory"] for m in memory.get_all(filters={"user_id": user}, top_k=100)["results"]]
    target = first[0]["id"]
    new_text = second[0]["memory"] if second else job["scripted_text"]
    memory.update(target, text=new_text)
    return {
        "first": first,
        "second": second,
        "active_after_second_add": after_add,
        "updated_id": target,
        "get_after_update": memory.get(target)["memory"],
        "history": [
            {k: h.get(k) for k in ("event", "old_memory", "new_memory", "is_deleted")}
            for h in memory.history(target)
        ],
        "active_after_update": [
            m["memory"] for m in memory.get_all(filters={"user_id": user}, top_k=100)["results"]
        ],
    }


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    command = sys.argv[2]
    job = json.loads(Path(sys.argv[3]).read_text())
    memory = Memory.from_config(config["memory"])
    if command == "stream":
        result = stream(memory, job)
    elif command == "dups":
        result = dups(memory, job)
    elif command == "overwrite":
        result = overwrite(memory, job, config["fake_url"])
    else:
        raise SystemExit(f"unknown command {command!r}")
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
