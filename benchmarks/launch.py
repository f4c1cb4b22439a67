"""Start `sia serve` as a real uvicorn process for tests, and wait until it is ready."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    process: subprocess.Popen[str]


@contextmanager
def server_process(
    env: dict[str, str], log_path: Path, command: Sequence[str] | None = None, *, port: int, ready_timeout: float = 120
) -> Iterator[str]:
    """Run ``command`` (default ``sia serve``) with ``env`` on top of this process's; yield its base URL."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SIA_") or k == "SIA_TEST_POSTGRES_URL"}
    full_env.update({"OMP_NUM_THREADS": "1", **env})
    argv = list(command) if command is not None else ["sia", "serve"]
    argv[0] = str(BIN / argv[0])  # the project's own executables, from this environment
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, env=full_env, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout
    try:
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{' '.join(argv)} did not become ready:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield Server(url, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def serving(env: dict[str, str], log_path: Path, command: Sequence[str] | None = None, *, port: int) -> Iterator[str]:
    """``server_process``, yielding only the base URL."""
    with server_process(env, log_path, command, port=port) as server:
        yield server.url
