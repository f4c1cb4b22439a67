"""Start `sia serve` (or another of the project's commands) as a real process and wait until it is ready.

The one launcher of the end-to-end tests (``tests/e2e/``) and of the benchmarks that time a real server
(``benchmarks/http.py``, ``benchmarks/served_batching.py``, the time to first token over HTTP in
``benchmarks/backbone.py``). It lives beside the command it starts (``server/cli.py``) so that tests and benchmarks
share it without either importing the other; it needs nothing beyond the standard library.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent  # the project's own executables, from this environment


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment less its SIA_* variables (the server reads only the settings in ``extra``),
    with one OpenMP thread, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIA_")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def _ready(url: str) -> bool:
    """Whether ``url`` answers 200 within 2 s (a refused connection or any other status: not yet)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class Server:
    url: str
    process: subprocess.Popen[str]


@contextmanager
def server_process(
    env: Mapping[str, str],
    log_path: Path,
    command: Sequence[str] | None = None,
    *,
    port: int,
    ready_timeout: float = 120.0,
) -> Iterator[Server]:
    """Run ``command`` (default ``sia serve``, listening on ``port``) with ``server_env(env)``, its output in
    ``log_path``; yield it once ``/readyz`` answers 200; stop it afterwards.

    Raises RuntimeError, with the end of the log, when it exits or is not ready within ``ready_timeout`` s.
    """
    argv = list(command) if command is not None else ["sia", "serve"]
    argv[0] = str(BIN / argv[0])
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, env=server_env(env), stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout
    try:
        while True:
            if _ready(f"{url}/readyz"):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{' '.join(argv)} did not become ready:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield Server(url, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def serving(env: Mapping[str, str], log_path: Path, command: Sequence[str] | None = None, *, port: int) -> Iterator[str]:
    """``server_process``, yielding only the base URL."""
    with server_process(env, log_path, command, port=port) as server:
        yield server.url
