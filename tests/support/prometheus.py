"""A real Prometheus (Debian's `prometheus` binary) scraping a live Memstore, for the tests of what
operators run against it: the rules of deploy/prometheus and the dashboard of deploy/grafana."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.live import free_port
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "memstore-rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "memstore.json"

PROMETHEUS = shutil.which("prometheus")

# What Grafana puts in place of its variables, for a query sent to Prometheus directly: a window
# a short test's samples fill (the rules' own windows are 5m and more).
GRAFANA_VARIABLES = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m", "DS_PROMETHEUS": ""}


@dataclass
class Prometheus:
    """A running Prometheus, queried over its HTTP API."""

    url: str
    http: httpx.AsyncClient

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """The series of an instant query; an error (a bad expression, a failed evaluation) raises."""
        response = await self.http.get(f"{self.url}/api/v1/query", params={"query": expr})
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise PromQLError(f"{body.get('errorType', response.status_code)}: {body.get('error', body)}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    async def rule_errors(self) -> list[str]:
        """The recording and alerting rules whose last evaluation failed, with the error."""
        groups = (await self.http.get(f"{self.url}/api/v1/rules")).json()["data"]["groups"]
        return [
            f"{rule.get('name')}: {rule.get('lastError')}"
            for group in groups
            for rule in group["rules"]
            if rule.get("health") == "err"
        ]

    async def scraped_after(self, moment: float, job: str = "memstore") -> bool:
        """Whether `job` has been scraped since `moment` (a Unix time)."""
        found = await self.query(f'timestamp(up{{job="{job}"}})')
        return bool(found) and float(found[0]["value"][1]) > moment


class PromQLError(Exception):
    """Prometheus refused or failed a query."""


@contextlib.asynccontextmanager
async def running_prometheus(
    target: str, workdir: Path, rules: Path = RULES, interval_s: float = 1.0
) -> AsyncIterator[Prometheus]:
    """Prometheus scraping `target`'s /metrics (a base URL) every `interval_s`, evaluating `rules` as
    often, with its storage in `workdir`; stopped on exit."""
    assert PROMETHEUS is not None, "no prometheus binary"
    host = re.sub(r"^https?://", "", target).rstrip("/")
    interval = f"{int(interval_s * 1000)}ms"
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "memstore", "static_configs": [{"targets": [host]}]}],
    }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    log = (workdir / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=10) as http:

            async def ready() -> int:
                if proc.poll() is not None:
                    raise AssertionError(f"prometheus exited: {(workdir / 'prometheus.log').read_text()}")
                return (await http.get(f"{url}/-/ready")).status_code

            await wait_for(
                ready,
                lambda status: status == 200,
                timeout_s=30,
                what="prometheus ready",
                interval_s=0.1,
                ignore=(httpx.HTTPError,),
            )
            yield Prometheus(url, http)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def dashboard_targets(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target of a Grafana dashboard, rows' panels included, with
    Grafana's variables replaced by what `GRAFANA_VARIABLES` says."""
    found = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                expr = re.sub(
                    r"\$\{?(\w+)\}?", lambda m: GRAFANA_VARIABLES.get(m.group(1), m.group(0)), target["expr"]
                )
                found.append((inner["title"], expr))
    return found
