"""A real redis-server on a free loopback port, for the ledger's Redis backend."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from proxy.running.workers import free_port


class RedisServer:
    """A real redis-server on a free loopback port, started and stopped by the tests."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port("127.0.0.1")
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not installed (.ci/run installs Debian's redis-server)")
        self.process = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

    def pause(self) -> None:
        """Stop the server answering, its data kept (SIGSTOP): every read times out."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a paused server could not stop
            self.process.terminate()
            self.process.wait(timeout=30)
        self.process = None
