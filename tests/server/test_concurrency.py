"""Two processes x 20 concurrent turns on one identity: serial turns, no lost update, a consistent history."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from server.runtime.services import Services
from server.store import Store

TURNS, THREADS = 20, 4


def test_two_processes_share_one_identity(services: Services, store: Store, checkpoint_dir: Path) -> None:
    env = {
        **os.environ,
        "SIA_DATABASE_URL": store.settings.url,
        "SIA_BUSY_TIMEOUT_S": "60",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [sys.executable, "-m", "tests.server.turn_worker", str(checkpoint_dir), "sia", "shared", str(TURNS), str(THREADS)]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out))
    done = [d for r in results for d in r["done"]]
    busy = [b for r in results for b in r["busy"]]
    assert len(done) + len(busy) == 2 * TURNS
    assert len(done) >= TURNS  # a 60 s wait is far longer than 40 tiny turns need

    ident = store.get_identity("sia", "shared")
    assert ident.turn_count == len(done)  # every success counted once, nothing else
    assert ident.version == 1 + len(done)
    assert sorted(d["turn"] for d in done) == list(range(len(done)))  # each index handed out exactly once
    assert sorted(d["version"] for d in done) == list(range(2, 2 + len(done)))
    turns = store.turns("sia", "shared", limit=1000)
    assert [t.index for t in turns] == list(range(len(done)))
    assert [(t.version_before, t.version_after) for t in turns] == [(v, v + 1) for v in range(1, 1 + len(done))]
    assert sorted(t.reply for t in turns) == sorted(str(d["reply"]) for d in done)
    _, state = services.identities.state("sia", "shared")
    assert state.turns == len(done) and state.shock.count == len(done)  # no lost update
    history = store.history("sia", "shared")
    assert history[0].version == ident.version and history[0].turn_index == len(done) - 1
