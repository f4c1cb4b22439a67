"""Fault injection against real `sia serve` processes: kill -9 in the middle of a turn; the database going away."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
from sqlalchemy.engine import make_url

from server.core.config import Settings
from server.db import migrate
from server.launcher import free_port, server_process
from server.store import Store
from tests.e2e.conftest import local_env


def test_kill_9_mid_turn_leaves_the_pre_turn_state(tmp_path: Path, checkpoint_dir: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    settings_env = {"LEASE_S": "15", "BUSY_TIMEOUT_S": "0.5"}  # long enough that a loaded machine still sees the hold
    port = free_port()
    with server_process(local_env(tmp_path, checkpoint_dir, port, **settings_env), tmp_path / "a.log", port=port) as server:
        r = httpx.post(f"{server.url}/v1/personas/sia/chat", json={"user": "k", "message": "hello", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200
        store = Store(settings)
        before = store.get_identity("sia", "k")
        before_state = store.read_state("sia", "k")
        with httpx.stream(
            "POST",
            f"{server.url}/v1/personas/sia/chat",
            timeout=60,
            json={"user": "k", "message": "a long one", "max_tokens": 64, "stream": True, "seed": 2},
        ) as s:
            assert next(s.iter_lines()).startswith("event: token")  # the turn is under way
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=10)
    after = store.get_identity("sia", "k")
    assert store.read_state("sia", "k") == before_state  # nothing of the interrupted turn was written
    assert (after.version, after.turn_count, after.busy) == (before.version, before.turn_count, True)  # its hold remains

    port = free_port()
    with server_process(local_env(tmp_path, checkpoint_dir, port, **settings_env), tmp_path / "b.log", port=port) as server:
        r = httpx.post(f"{server.url}/v1/personas/sia/chat", json={"user": "k", "message": "again", "max_tokens": 4}, timeout=60)
        if r.status_code == 409:  # the dead process's hold has not expired yet
            assert r.json()["error"]["code"] == "identity_busy"
            deadline = time.monotonic() + 60
            while store.get_identity("sia", "k").busy:  # until the 15 s hold expires
                assert time.monotonic() < deadline, "the dead process's hold never expired"
                time.sleep(0.1)
            r = httpx.post(
                f"{server.url}/v1/personas/sia/chat", json={"user": "k", "message": "again", "max_tokens": 4}, timeout=60
            )
        assert r.status_code == 200 and (r.json()["turn"], r.json()["state_version"]) == (1, before.version + 1)
    [_, second] = store.turns("sia", "k")
    assert second.version_before == before.version  # the new turn started from the pre-crash state
    store.close()


class TcpProxy:
    """A TCP relay to the database that can be cut (every connection dropped, nothing accepted) and restored."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def cut(self) -> None:
        assert self._server is not None
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread; nothing new gets in
        self._server.close()
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)
                c.close()
            self._conns.clear()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def test_database_outage_gives_503_and_recovers(postgres_url: str, tmp_path: Path, checkpoint_dir: Path) -> None:
    url = make_url(postgres_url)
    migrate.upgrade(Settings(database_url=postgres_url))
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    through_proxy = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    port = free_port()
    env = {"SIA_DATABASE_URL": through_proxy, "SIA_CHECKPOINT": str(checkpoint_dir), "SIA_PORT": str(port)}
    with server_process(env, tmp_path / "s.log", port=port) as server:
        chat = {"user": "o", "message": "hello", "max_tokens": 4}
        assert httpx.post(f"{server.url}/v1/personas/sia/chat", json=chat, timeout=60).status_code == 200
        proxy.cut()
        ready = httpx.get(f"{server.url}/readyz", timeout=30)
        assert ready.status_code == 503 and "database unavailable" in ready.json()["reason"]
        r = httpx.post(f"{server.url}/v1/personas/sia/chat", json=chat, timeout=60)
        assert r.status_code == 503 and r.json()["error"]["code"] == "database_unavailable" and r.headers["retry-after"]
        assert httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200  # alive, though not ready
        proxy.restore()
        deadline = time.monotonic() + 30
        while httpx.get(f"{server.url}/readyz", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "did not recover"
            time.sleep(0.2)
        r = httpx.post(f"{server.url}/v1/personas/sia/chat", json=chat, timeout=60)
        assert r.status_code == 200 and r.json()["turn"] == 1
    proxy.cut()
