from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from server.core.config import Settings
from server.runtime.keys import KeyRing
from server.store import Store


def run_sia(tmp_path: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SIA_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1"}
    env.pop("SIA_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "server.cli", *args], env=env, input=stdin, capture_output=True, text=True, timeout=300
    )


def test_keys_create_list_revoke(tmp_path: Path) -> None:
    assert run_sia(tmp_path, "db", "upgrade").returncode == 0
    created = run_sia(tmp_path, "keys", "create", "--user", "ana", "--name", "app")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("sia_") and len(key) > 40
    store = Store(Settings(data_dir=tmp_path / "data"))
    try:
        ring = KeyRing(store)
        principal = ring.verify(key)
        assert principal is not None and (principal.role, principal.user_id) == ("user", "ana")
        listing = run_sia(tmp_path, "keys", "list").stdout
        assert "user=ana" in listing and "active" in listing and key not in listing  # the key itself is never shown again
        key_id = listing.split("\t", 1)[0]
        assert run_sia(tmp_path, "keys", "revoke", key_id).returncode == 0
        assert ring.verify(key) is None and "revoked" in run_sia(tmp_path, "keys", "list").stdout
        bad = run_sia(tmp_path, "keys", "create", "--user", "a\nb")
        assert bad.returncode == 2 and "printable" in bad.stderr
    finally:
        store.close()


def test_chat_with_a_stored_identity(tmp_path: Path, checkpoint_dir: Path) -> None:
    out = run_sia(
        tmp_path,
        "chat",
        "--persona",
        "sia",
        "--user",
        "ana",
        "--checkpoint",
        str(checkpoint_dir),
        "--max-tokens",
        "5",
        "--seed",
        "1",
        stdin="hello\nhow are you?\n\n",
    )
    assert out.returncode == 0, out.stderr
    assert "Talking to 'sia' as 'ana'" in out.stdout
    store = Store(Settings(data_dir=tmp_path / "data"))
    try:
        ident = store.get_identity("sia", "ana")
        assert (ident.turn_count, ident.version) == (2, 3)
        assert [t.message for t in store.turns("sia", "ana")] == ["hello", "how are you?"]
    finally:
        store.close()
    unknown = run_sia(tmp_path, "chat", "--persona", "nobody", "--user", "ana", "--checkpoint", str(checkpoint_dir), stdin="hi\n")
    assert unknown.returncode == 2 and "persona 'nobody' does not exist" in unknown.stderr and "Traceback" not in unknown.stderr
