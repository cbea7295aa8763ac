"""How fast `memstore up` becomes ready, how much memory its processes hold, and how cleanly it stops.

Usage: python bench/startup.py [--runs 3] [--workers 1]
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from _stack import GONE, add_settings_option, caller_env, free_port, role_of, settings_of, up_command

# How the memory report names a role of `_stack.role_of`: Postgres's RSS is summed over its backends.
LABELS = {"postgres": "postgres (all backends)"}


def one_run(data_dir: Path, workers: int, settings: dict[str, str]) -> dict[str, float]:
    port = free_port()
    env = caller_env() | {"MEMSTORE_LOG_LEVEL": "WARNING"} | settings
    started = time.perf_counter()
    proc = subprocess.Popen(
        up_command(data_dir, port, workers=workers),
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
        role = role_of(child)
        if role == GONE:
            continue
        label = LABELS.get(role, role)
        with contextlib.suppress(psutil.Error):
            rss[label] = rss.get(label, 0.0) + child.memory_info().rss / 2**20
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
