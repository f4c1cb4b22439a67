"""A separate process running concurrent turns on one identity (used by test_concurrency.py).

    python -m tests.server.turn_worker CHECKPOINT PERSONA USER TURNS THREADS

Reads SIA_* settings from the environment; prints one JSON line: the outcomes and the busy rejections.
"""

from __future__ import annotations

import json
import sys
import threading

from server.core.config import Settings
from server.errors import BusyError
from server.runtime.services import Services
from server.store import Store
from sia.checkpoint import load_checkpoint
from sia.model.generate import Sampling


def main() -> None:
    checkpoint, persona, user, turns, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    services = Services.over(load_checkpoint(checkpoint), Store(Settings()))
    done: list[dict[str, object]] = []
    busy: list[str] = []
    lock = threading.Lock()
    todo = iter(range(turns))

    def work() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                out = services.turns.turn(persona, user, f"message {i}", Sampling(max_tokens=4, temperature=1.0, seed=i))
            except BusyError as exc:
                with lock:
                    busy.append(str(exc))
                continue
            with lock:
                done.append({"turn": out.turn, "version": out.state_version, "reply": out.reply})

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    sys.stdout.write(json.dumps({"done": done, "busy": busy}) + "\n")


if __name__ == "__main__":
    main()
