"""What the deploy files' containers run, run directly: docker-compose.yml's migration and API commands with their
environment against the local PostgreSQL, and two `sia serve` replicas over one database taking a concurrent
workload on shared identities. (Docker does not run here; the files' structure is checked in tests/test_deploy.py.)
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import httpx

from server.core.config import Settings
from server.db import migrate
from server.launcher import BIN, free_port, serving
from server.store import Store
from tests.test_deploy import ROOT, compose, service_env


def test_the_containers_commands_run_here(postgres_url: str, tmp_path: Path, checkpoint_dir: Path) -> None:
    env = service_env("migrate", {"POSTGRES_PASSWORD": "pw"})
    env["SIA_DATABASE_URL"] = postgres_url  # the compose database, here: the local server
    command = compose()["services"]["migrate"]["command"]  # type: ignore[index]
    done = subprocess.run(
        [str(BIN / command[0]), *command[1:]],
        cwd=ROOT,
        env={"PATH": str(BIN), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    settings = Settings(database_url=postgres_url)
    assert migrate.current_revision(settings) == migrate.head_revision(settings)

    api_env = service_env("api", {"POSTGRES_PASSWORD": "pw", "SIA_MAX_TOKENS_CAP": "16"})
    api_env.update(SIA_DATABASE_URL=postgres_url, SIA_CHECKPOINT=str(checkpoint_dir))
    port = free_port()
    api_command = compose()["services"]["api"]["command"]  # type: ignore[index]
    api_command = [*api_command[: api_command.index("--port") + 1], str(port)]
    with serving(api_env, tmp_path / "api.log", api_command, port=port) as url:
        r = httpx.post(f"{url}/v1/personas/sia/chat", json={"user": "u", "message": "hi", "max_tokens": 17})
        assert r.status_code == 422 and r.json()["error"]["code"] == "max_tokens_too_large"  # SIA_MAX_TOKENS_CAP read
        r = httpx.post(f"{url}/v1/personas/sia/chat", json={"user": "u", "message": "hi", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and r.json()["turn"] == 0
    assert '"level": "WARNING"' in (tmp_path / "api.log").read_text()  # JSON logs, and the development-mode warning


def test_two_replicas_over_one_database(postgres_url: str, tmp_path: Path, checkpoint_dir: Path) -> None:
    settings = Settings(database_url=postgres_url)
    migrate.upgrade(settings)
    ports = [free_port(), free_port()]
    env = {
        "SIA_DATABASE_URL": postgres_url,
        "SIA_CHECKPOINT": str(checkpoint_dir),
        "SIA_BUSY_TIMEOUT_S": "60",
        "SIA_AUTO_MIGRATE": "false",
    }
    with (
        serving({**env, "SIA_PORT": str(ports[0])}, tmp_path / "a.log", port=ports[0]) as url_a,
        serving({**env, "SIA_PORT": str(ports[1])}, tmp_path / "b.log", port=ports[1]) as url_b,
    ):
        ok: list[tuple[str, int]] = []
        failed: list[str] = []
        lock = threading.Lock()

        def client(worker: int) -> None:
            base = (url_a, url_b)[worker % 2]
            with httpx.Client(base_url=base, timeout=120) as http:
                for i in range(4):
                    user = ("shared-1", "shared-2")[(worker + i) % 2]
                    r = http.post("/v1/personas/sia/chat", json={"user": user, "message": f"w{worker} t{i}", "max_tokens": 4})
                    with lock:
                        (ok.append((user, r.json()["turn"])) if r.status_code == 200 else failed.append(r.text))

        threads = [threading.Thread(target=client, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failed == []
    store = Store(settings)
    try:
        for user in ("shared-1", "shared-2"):
            turns = sorted(t for u, t in ok if u == user)
            assert turns == list(range(16)), user  # 32 turns over two replicas: each index exactly once
            ident = store.get_identity("sia", user)
            assert (ident.turn_count, ident.version, ident.busy) == (16, 17, False)
            records = store.turns("sia", user, limit=100)
            assert [(t.index, t.version_before, t.version_after) for t in records] == [(i, i + 1, i + 2) for i in range(16)]
            assert [h.version for h in store.history("sia", user)][:3] == [17, 16, 15]
    finally:
        store.close()
