"""How fast `memstore up` becomes ready, how much memory its processes hold, and how cleanly it stops.

Usage: python bench/startup.py [--runs 3] [--workers 1]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from _stack import add_settings_option, settings_of


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def role_of(proc: psutil.Process) -> str:
    cmd = " ".join(proc.cmdline())
    if "redis-server" in cmd:
        return "redis"
    if "postgres" in proc.name() or "postgres:" in cmd:
        return "postgres (all backends)"
    if " serve" in cmd:
        return "api"
    if " worker" in cmd:
        return "worker"
    return "other"


def one_run(data_dir: Path, workers: int, settings: dict[str, str]) -> dict[str, float]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env["MEMSTORE_LOG_LEVEL"] = "WARNING"
    env |= settings
    started = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app",
            "up",
            "--data-dir",
            str(data_dir),
            "--port",
            str(port),
            "--workers",
            str(workers),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ready_s = float("nan")
    while time.perf_counter() - started < 60:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                ready_s = time.perf_counter() - started
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    time.sleep(1.0)  # let the worker finish its start-up before sampling memory
    root = psutil.Process(proc.pid)
    family = [root, *root.children(recursive=True)]
    rss: dict[str, float] = {"supervisor": root.memory_info().rss / 2**20}
    for child in family[1:]:
        with_role = role_of(child)
        with contextlib.suppress(psutil.Error):
            rss[with_role] = rss.get(with_role, 0.0) + child.memory_info().rss / 2**20
    stop_started = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    code = proc.wait(90)
    stop_s = time.perf_counter() - stop_started
    _, alive = psutil.wait_procs(family[1:], timeout=5)
    return {
        "ready_s": ready_s,
        "stop_s": stop_s,
        "exit_code": code,
        "left_behind": len(alive),
        **{f"rss_mb:{k}": v for k, v in rss.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    add_settings_option(parser)
    args = parser.parse_args()
    settings = settings_of(args.env)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        results = [one_run(data_dir, args.workers, settings) for _ in range(args.runs)]
    cold, warm = results[0], results[1:]
    print(
        f"memstore up, {args.workers} worker(s), {args.runs} runs on one data dir (first = cold: initdb)"
        + (f", {' '.join(args.env)}" if args.env else "")
    )
    print(f"  time to /ready   cold {cold['ready_s']:.2f} s", end="")
    if warm:
        print(f"   warm median {statistics.median(r['ready_s'] for r in warm):.2f} s", end="")
    print()
    print(
        f"  stop on SIGINT   median {statistics.median(r['stop_s'] for r in results):.2f} s, "
        f"exit codes {[int(r['exit_code']) for r in results]}, "
        f"processes left behind {[int(r['left_behind']) for r in results]}"
    )
    last = results[-1]
    print("  RSS after ready (last run):")
    total = 0.0
    for key in sorted(k for k in last if k.startswith("rss_mb:")):
        total += last[key]
        print(f"    {key.removeprefix('rss_mb:'):<26} {last[key]:7.1f} MiB")
    print(f"    {'total':<26} {total:7.1f} MiB")


if __name__ == "__main__":
    main()
