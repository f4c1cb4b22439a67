"""Served behaviour: does a persona remember a user through the HTTP API, and only that user?

For each held-out episode of the fact corpus, a user of persona ``sia`` states three facts through
``POST /v1/personas/sia/chat`` (or, with ``--route openai``, ``POST /v1/chat/completions`` with model ``sia`` and
only the new message: greedy replies), chats about ``--between`` unrelated things, then asks about
one fact (the episode's first probe). A second user, who never said anything, asks the same question. A reply
counts as right when it contains the fact's value (case-insensitive, whole word). The service runs in process on
the checkpoint (default: the bundled one) with a fresh SQLite database.

    python -m benchmarks.served_memory [--episodes 8] [--between 2] [--route chat|openai] [--checkpoint PATH] [--out FILE]

Writes benchmarks/results/served_memory.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from server.core.config import Settings
from server.db import migrate
from server.main import create_app
from sia.checkpoint import DEFAULT_CACHE, load_model
from sia.learn.adapter import facts

log = logging.getLogger("benchmarks.served_memory")
RESULTS = Path(__file__).parent / "results" / "served_memory.json"


def mentions(reply: str, value: str) -> bool:
    return re.search(rf"\b{re.escape(value)}\b", reply, flags=re.IGNORECASE) is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--between", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--route", choices=("chat", "openai"), default="chat")
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    model = load_model(args.checkpoint, cache_dir=DEFAULT_CACHE)
    episodes = facts.episodes("heldout", args.episodes, 7, between=args.between, kinds=("colour", "pet", "hobby"))
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), checkpoint=args.checkpoint, log_json=False)
        migrate.upgrade(settings)  # a fresh database, as `sia db upgrade` makes it
        with TestClient(create_app(settings, model=model)) as client:

            def say(user: str, message: str) -> str:
                sampling = {"user": user, "temperature": 0, "max_tokens": args.max_tokens}
                if args.route == "openai":  # the identity carries the history: only the new message is sent
                    body = {"model": "sia", "messages": [{"role": "user", "content": message}], **sampling}
                    response = client.post("/v1/chat/completions", json=body)
                    response.raise_for_status()
                    return str(response.json()["choices"][0]["message"]["content"])
                response = client.post("/v1/personas/sia/chat", json={"message": message, **sampling})
                response.raise_for_status()
                return str(response.json()["reply"])

            for i, episode in enumerate(episodes):
                user, stranger = f"served-{i}", f"stranger-{i}"
                for turn in episode.turns:
                    say(user, turn.user)
                probe = episode.probes[0]
                own, other = say(user, probe.question), say(stranger, probe.question)
                rows.append(
                    {
                        "kind": probe.kind,
                        "value": probe.value,
                        "question": probe.question,
                        "reply": own,
                        "right": mentions(own, probe.value),
                        "stranger_reply": other,
                        "stranger_right": mentions(other, probe.value),
                    }
                )
                log.warning("%s: %r -> %r (stranger: %r)", probe.value, probe.question, own, other)
    right = sum(r["right"] for r in rows) / len(rows)
    stranger = sum(r["stranger_right"] for r in rows) / len(rows)
    result = {
        "checkpoint": str(args.checkpoint or "bundled"),
        "episodes": len(rows),
        "between": args.between,
        "route": args.route,
        "right": right,
        "stranger_right": stranger,
        "seconds": time.perf_counter() - started,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(f"the user's own reply names the value: {right:.0%}; a stranger's: {stranger:.0%} ({len(rows)} episodes)\n")


if __name__ == "__main__":
    main()
