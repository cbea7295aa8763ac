"""The API contract, checked from the outside: schemathesis against a running `memstore up`.

    .venv/bin/python -m tests.contract.run [--max-examples N] [--seed S] [--log FILE]

Starts `memstore up` (embedded Postgres + Redis, one worker, the `hashing` embedder) in a temporary
data directory on a free port, with a fake OpenAI-compatible read model so `POST /v1/answer` answers
(tests/support/fake_llm.py + fake_reader.py); chooses the `default` tenant's admin key
(MEMSTORE_ADMIN_KEY) and creates a second tenant (`memstore tenants create peer`), whose admin key is
the other user of the `object_level_authorization` check; runs the schemathesis CLI against
`/schema/openapi.json` with every check and every phase (examples, coverage, fuzzing, stateful), a
fixed seed and deterministic generation (tests/contract/schemathesis.toml); prints how many test
cases were generated and every failure; stops the server in every case. Exit status: schemathesis's
(0: no failure), 2 when the server does not come up, 3 when fewer cases than `--min-cases` were
generated.

Not a pytest module (its name does not match `test_*.py`): CI runs it as a command (about 1.5 to
2.5 minutes on two cores, some 4,500 generated test cases).

This module is also the run's schemathesis hooks file (`hooks = "tests.contract.run"` in the config),
so that the run cannot lock itself out — the only requests it changes or adds:

- `DELETE /v1/admin/keys/{key_id}` naming the run's own admin key (the stateful phase can take its id
  from `GET /v1/admin/keys`) is sent for another, unknown id instead: a revoked key would answer every
  later request 401.
- After a `PATCH /v1/admin/settings` that set the tenant's own request rate, the rate is set back to
  the deployment's (a generated 1e-300 requests/s would answer every later request 429).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: `python tests/contract/run.py`
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

CONFIG = Path(__file__).with_name("schemathesis.toml")
SCHEMA_PATH = "/schema/openapi.json"
SEED = 20241112
# Per operation in the fuzzing phase (coverage adds its boundary cases, stateful its scenarios): about
# 4,500 generated test cases in all.
MAX_EXAMPLES = 25
MIN_CASES = 2000
READY_WITHIN_S = 180

# Set by the runner for the schemathesis process (and read by the hooks below).
ENV_BASE = "MEMSTORE_CONTRACT_BASE_URL"
ENV_KEY = "MEMSTORE_CONTRACT_KEY"
ENV_KEY_ID = "MEMSTORE_CONTRACT_KEY_ID"
ENV_WFC = "MEMSTORE_CONTRACT_WFC"  # the users' keys, as a Web Fuzzing Commons auth document
ENV_CACHE = "MEMSTORE_CONTRACT_CACHE"  # schemathesis's cache (stored failures, for `st replay`)


# --- hooks --------------------------------------------------------------------------------------------

try:
    import schemathesis
except ImportError:  # pragma: no cover - the runner itself only needs the CLI
    schemathesis = None  # type: ignore[assignment]

if schemathesis is not None and os.environ.get(ENV_KEY_ID):

    @schemathesis.hook
    def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
        """Never revoke the key the run authenticates with."""
        if case.operation.method.upper() != "DELETE" or case.operation.path != "/v1/admin/keys/{key_id}":
            return
        params = case.path_parameters or {}
        if str(params.get("key_id", "")).lower() == os.environ[ENV_KEY_ID].lower():
            params["key_id"] = str(uuid.UUID(int=0xC0FFEE))
            case.path_parameters = params
            print(f"[contract] DELETE of the run's own admin key sent as {params['key_id']}", flush=True)

    @schemathesis.hook
    def after_call(context: Any, case: Any, response: Any) -> None:
        """A rate, a cap or a budget the tenant set for itself goes back to the deployment's at once (a
        budget of 0 would hold every later chunk of the run back, and a read waiting for one the whole
        30 s)."""
        if case.operation.method.upper() != "PATCH" or case.operation.path != "/v1/admin/settings":
            return
        if response.status_code != 200:
            return
        try:
            body = response.json()
        except ValueError:
            return
        if all(body.get(name) is None for name in _RESET):
            return
        _reset_limits()


# The settings a run's tenant may set itself that would hold the rest of the run back.
_RESET = ("rate_limit_per_s", "rate_limit_burst", "max_writer_concurrency", "daily_token_budget")


def _reset_limits() -> None:
    url = os.environ[ENV_BASE] + "/v1/admin/settings"
    headers = {"Authorization": f"Bearer {os.environ[ENV_KEY]}"}
    for _ in range(5):
        answer = httpx.patch(url, json=dict.fromkeys(_RESET), headers=headers, timeout=30)
        if answer.status_code == 200:
            return
        time.sleep(min(float(answer.headers.get("Retry-After", "1") or 1), 5.0))
    print(f"[contract] could not reset the tenant's limits: {answer.status_code}", flush=True)


# --- the runner -------------------------------------------------------------------------------------


def _server_env(admin_key: str, reader_url: str, reader_model: str) -> dict[str, str]:
    """Settings beside the defaults: the admin key chosen, the light embedder (for every tenant: a
    tenant's move to another embedder is a test of its own, tests/integration/search), the fake read
    model."""
    return {
        "MEMSTORE_ADMIN_KEY": admin_key,
        "MEMSTORE_EMBEDDER": "hashing",
        "MEMSTORE_TENANT_EMBEDDERS": "[]",
        "MEMSTORE_READER_BASE_URL": reader_url,
        "MEMSTORE_READER_MODEL": reader_model,
        "MEMSTORE_LOG_LEVEL": "WARNING",
    }


@contextlib.contextmanager
def memstore_up(
    admin_key: str, reader_url: str, reader_model: str, log_path: Path, say: Callable[[str], None] = print
) -> Iterator[tuple[str, Path]]:
    """`memstore up` on a free port in a fresh data directory; its base URL and data directory once
    /ready answers 200.
    Stopped (SIGINT, then SIGKILL to its process group) and its data removed whatever happens."""
    from tests.e2e.conftest import free_port, ready_within, start_up

    # Not under a private (0700) temporary root: Postgres runs as another user under root.
    workdir = Path(tempfile.mkdtemp(prefix="memstore-contract-"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # In a process group of its own: Ctrl-C of the runner is ours to pass on.
    proc = start_up(
        workdir / "data", port, log_path, workers=1, env=_server_env(admin_key, reader_url, reader_model),
        own_session=True,
    )  # fmt: skip
    try:
        try:
            took = ready_within(port, proc, log_path, READY_WITHIN_S)
        except AssertionError as exc:
            raise RuntimeError(f"memstore up: {exc}") from None
        say(f"memstore up ready at {base} in {took:.1f} s")
        yield base, workdir / "data"
    finally:
        _stop(proc, say)
        shutil.rmtree(workdir, ignore_errors=True)


def _stop(proc: subprocess.Popen[bytes], say: Callable[[str], None]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(90)
            say(f"memstore up stopped (exit {proc.returncode})")
        except subprocess.TimeoutExpired:
            say("memstore up did not stop within 90 s: killing its process group")
    # Whatever it left behind in its process group (it was started in a session of its own).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def _peer_tenant_key(data_dir: Path, say: Callable[[str], None]) -> str:
    """A second tenant's admin key (`memstore tenants create`, beside the running stack)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    created = subprocess.run(
        [sys.executable, "-m", "app", "tenants", "create", "peer", "--data-dir", str(data_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if created.returncode != 0:
        raise RuntimeError(f"memstore tenants create peer failed:\n{created.stderr[-4000:]}")
    say("tenant `peer` created (the second user of object_level_authorization)")
    return created.stdout.strip().splitlines()[-1]


def _wfc_document(path: Path, keys: dict[str, str]) -> Path:
    """The Web Fuzzing Commons auth document of the run's users, by name."""
    users = [
        {"name": name, "fixedHeaders": [{"name": "Authorization", "value": f"Bearer {key}"}]}
        for name, key in keys.items()
    ]
    path.write_text(json.dumps({"auth": users}))
    path.chmod(0o600)
    return path


def _admin_key_id(base: str, admin_key: str) -> str:
    keys = httpx.get(
        f"{base}/v1/admin/keys", headers={"Authorization": f"Bearer {admin_key}"}, timeout=30
    ).raise_for_status()
    items = keys.json()["items"]
    assert len(items) == 1, items  # a fresh tenant: the bootstrap key only
    return str(items[0]["id"])


def schemathesis_command(base: str, seed: int, max_examples: int, report_dir: Path) -> list[str]:
    """Every check is on in the config (`[checks] enabled = true`), not by `--checks all`: options given
    on the command line override the config's per-operation settings."""
    return [
        str(Path(sys.executable).with_name("schemathesis")),
        "--config-file", str(CONFIG),
        "run", f"{base}{SCHEMA_PATH}",
        "--phases", "examples,coverage,fuzzing,stateful",
        "--mode", "all",
        "--seed", str(seed),
        "--generation-deterministic",
        "--max-examples", str(max_examples),
        "--workers", "1",
        "--no-color",
        "--report", "junit",
        "--report-dir", str(report_dir),
    ]  # fmt: skip


# The CLI's summary: "Test cases:\n  4882 generated, 40 found 49 unique failures, 61 skipped".
_CASES = re.compile(r"Test cases:\s*\n?\s*([\d,]+) generated")
_FAILURES = re.compile(r"([\d,]+) unique failures?")


def generated_cases(output: str) -> int | None:
    match = _CASES.search(output)
    return int(match.group(1).replace(",", "")) if match else None


def unique_failures(output: str) -> int:
    match = _FAILURES.search(output.rpartition("Test cases:")[2])
    return int(match.group(1).replace(",", "")) if match else 0


class Say:
    """Prints the runner's lines and schemathesis's output, and writes them to the log file if any."""

    def __init__(self, log: Path | None) -> None:
        self.file = log.open("w") if log else None

    def __call__(self, text: str) -> None:
        self.write(f"[contract] {text}\n")

    def write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
        if self.file is not None:
            self.file.write(text)
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def run_schemathesis(cmd: list[str], env: dict[str, str], say: Say) -> tuple[int, str]:
    """The CLI's exit status and output; the output is printed as it comes and written to `log`."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            say.write(line)
        return proc.wait(), "".join(lines)
    finally:
        if proc.poll() is None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.poll() is None:
                proc.kill()


def main(argv: list[str] | None = None) -> int:
    from app.lib.security import generate_api_key
    from tests.support.fake_llm import FakeLLM
    from tests.support.fake_reader import reader_responder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-examples", type=int, default=MAX_EXAMPLES, help="per operation, fuzzing phase")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--min-cases", type=int, default=MIN_CASES, help="fail when fewer are generated")
    parser.add_argument("--log", type=Path, help="also write everything printed here")
    parser.add_argument("--server-log", type=Path, help="memstore up's output (default: a temporary file)")
    parser.add_argument("--report-dir", type=Path, help="the JUnit report (default: a temporary dir)")
    args = parser.parse_args(argv)

    # A CI cancellation (SIGTERM) unwinds like Ctrl-C, so the server is stopped.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    logging.getLogger("httpx").setLevel(logging.WARNING)

    started = time.monotonic()
    admin_key = generate_api_key()
    scratch = Path(tempfile.mkdtemp(prefix="memstore-contract-run-"))
    server_log = args.server_log or scratch / "memstore-up.log"
    report_dir = args.report_dir or scratch / "reports"
    say = Say(args.log)
    try:
        with (
            FakeLLM(responder=reader_responder).in_thread() as reader,
            memstore_up(admin_key, reader.base_url, reader.model, server_log, say) as (base, data_dir),
        ):
            peer_key = _peer_tenant_key(data_dir, say)
            wfc = _wfc_document(scratch / "auth.json", {"default": admin_key, "peer": peer_key})
            env = dict(os.environ)
            env.update(
                {
                    ENV_BASE: base,
                    ENV_KEY: admin_key,
                    ENV_KEY_ID: _admin_key_id(base, admin_key),
                    ENV_WFC: str(wfc),
                    ENV_CACHE: str(scratch / "cache"),
                }
            )
            env.pop("SCHEMATHESIS_HOOKS", None)
            cmd = schemathesis_command(base, args.seed, args.max_examples, report_dir)
            say(" ".join(cmd))
            code, output = run_schemathesis(cmd, env, say)
        cases, failures = generated_cases(output), unique_failures(output)
        say(
            f"schemathesis exit {code}; generated test cases: {cases if cases is not None else '?'}; "
            f"unique failures: {failures}; {time.monotonic() - started:.0f} s in all; "
            f"server log: {server_log}; reports: {report_dir}"
        )
        if code != 0:
            return code
        if cases is None or cases < args.min_cases:
            say(f"fewer than {args.min_cases} generated test cases")
            return 3
        if not args.server_log and not args.report_dir:
            shutil.rmtree(scratch, ignore_errors=True)  # kept after a failure, for its server log
        return 0
    except RuntimeError as exc:
        say(str(exc))
        return 2
    except KeyboardInterrupt:
        say("interrupted; memstore up stopped")
        return 130
    finally:
        say.close()


if __name__ == "__main__":
    sys.exit(main())
