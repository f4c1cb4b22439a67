"""An app over a migrated database (SQLite, and PostgreSQL where reachable) with a tiny model, and keys."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from server.core.config import Settings
from server.db import migrate
from server.main import create_app
from server.runtime.keys import KeyRing
from tests.conftest import tiny_model


@pytest.fixture
def app_settings(settings: Settings) -> Settings:
    settings.max_body_bytes = 64 * 1024
    settings.max_message_chars = 2000
    settings.max_tokens_cap = 64
    settings.busy_timeout_s = 0.5
    return settings


@pytest.fixture
def client(app_settings: Settings) -> Iterator[TestClient]:
    """Development mode: no key exists, every request is allowed."""
    migrate.upgrade(app_settings)
    with TestClient(create_app(app_settings, model=tiny_model())) as c:
        yield c


@dataclass
class Keys:
    admin: str
    ana: str  # a user key bound to user "ana"
    bob: str  # a user key bound to user "bob"


@pytest.fixture
def keys(client: TestClient) -> Keys:
    """Create keys: the service leaves development mode and asks for them from now on."""
    ring: KeyRing = client.app.state.services.keys  # type: ignore[attr-defined]
    admin = ring.create("admin", name="ops")[1]
    ana = ring.create("user", user_id="ana", name="ana's app")[1]
    bob = ring.create("user", user_id="bob")[1]
    return Keys(admin=admin, ana=ana, bob=bob)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
