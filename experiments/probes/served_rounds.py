"""Where a batched server's time goes when many users talk at once: the service's turns (``TurnRunner`` over a fresh
SQLite store, the model as ``sia serve`` loads it) submitted from one thread per user to a ``Batcher``, as the HTTP
layer submits them, and the batcher's parts timed where they run:

- on the batcher's thread: the decoding steps (``DecodeBatch.sample`` + ``advance``) and each finished row's
  conclusion (``conclude_turns``: the summary, the shock, the state's advance);
- on the prefill thread (or the batcher's, when nothing decodes): each group's conditioning (``condition_states``),
  its padded prefill (``DecodeBatch.prefill``) and each turn's imprint write (``imprint_message``);
- in the users' threads: holding the identity and building the turn (``begin_turn``) and the commit.

    PYTHONPATH=. python -m experiments.probes.served_rounds [--users 8] [--turns 3] [--tokens 32] [--inexact-rows]
        [--out FILE]

Replies are greedy and run to exactly ``--tokens`` tokens (the end tokens banned), as ``benchmarks.served_batching``'s
do. Seconds are summed per part over the run; parts on different threads overlap, so the wall time is given beside.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.fixed_length import endless
from benchmarks.machine import machine_info
from benchmarks.served_turn import sqlite_services
from server.core.config import Settings
from server.runtime import batcher as batcher_module
from server.runtime.batcher import Batcher, available_cores
from server.runtime.services import served_model
from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.identity.turn import TurnResult
from sia.model import batching
from sia.model.generate import Sampling

MESSAGES = (
    "Hi! I'm Ana, I live in Lisbon and I work as a nurse.",
    "What would you cook on a cold evening?",
    "Tell me something about the sea.",
)

spent: dict[str, float] = defaultdict(float)
calls: dict[str, int] = defaultdict(int)
_lock = threading.Lock()


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its wall time added to ``spent[name]``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            with _lock:
                spent[name] += time.perf_counter() - start
                calls[name] += 1

    return wrapper


def instrument(model: Any) -> None:
    """Timers around the parts named in the module's docstring (the classes' and modules' own names replaced)."""
    batching.DecodeBatch.sample = timed("step: sample", batching.DecodeBatch.sample)  # type: ignore[method-assign]
    batching.DecodeBatch.advance = timed("step: forward", batching.DecodeBatch.advance)  # type: ignore[method-assign]
    batching.DecodeBatch.prefill = timed("prefill: forward", batching.DecodeBatch.prefill)  # type: ignore[method-assign]
    batcher_module.conclude_turns = timed("step: conclude", batcher_module.conclude_turns)  # type: ignore[attr-defined]
    batcher_module.imprint_message = timed("prefill: imprint write", batcher_module.imprint_message)  # type: ignore[attr-defined]
    model.condition_states = timed("prefill: condition", model.condition_states)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--inexact-rows",
        action="store_true",
        help="batched rows attend together under a padding mask even where the model would attend them one by one"
        " (exact_rows, set by bfloat16 packing): what the exactness of a batched row against its solo run costs",
    )
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), database_url=f"sqlite:///{Path(tmp) / 'probe.db'}")
        model = served_model(settings)
        if not isinstance(model, LlamaModel) or not isinstance(model.tokenizer, ChatTokenizer):
            raise ValueError("the probe serves the bundled chat backbone")
        model.tokenizer = endless(model.tokenizer)  # every reply runs to --tokens
        exact = model.exact_rows
        if args.inexact_rows:
            model.exact_rows = False
        instrument(model)
        with sqlite_services(model, Path(tmp)) as services:
            turns = services.turns
            runner = Batcher(model, max_batch=16, max_queue=64, threads=available_cores()).start()
            sampling = Sampling(max_tokens=args.tokens, temperature=0.0, max_sentences=0)
            begin, commit = timed("user: begin", turns.begin_turn), "user: commit"

            def user(u: int) -> None:
                for t in range(args.turns):
                    held = begin("sia", f"user{u}", MESSAGES[t % len(MESSAGES)], sampling)
                    inbox: queue.Queue[Any] = queue.Queue()
                    runner.submit(held.request, held.params, inbox.put)
                    while not isinstance(got := inbox.get(), TurnResult | BaseException):
                        pass
                    if isinstance(got, BaseException):
                        raise got
                    timed(commit, held.commit)(got, 0.0)

            warm = threading.Thread(target=user, args=(args.users,))  # one turn first: the first-call costs out of the way
            warm.start()
            warm.join()
            spent.clear()
            calls.clear()
            threads = [threading.Thread(target=user, args=(u,)) for u in range(args.users)]
            start = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            wall = time.perf_counter() - start
            runner.close()
    tokens = args.users * args.turns * args.tokens
    result = {
        "machine": machine_info(available_cores()),
        "exact_rows": exact and not args.inexact_rows,
        "users": args.users,
        "turns": args.turns,
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "parts": {k: {"seconds": spent[k], "calls": calls[k]} for k in sorted(spent)},
    }
    lines = [f"{args.users} users x {args.turns} turns x {args.tokens} tokens: {wall:.1f} s, {tokens / wall:.1f} tokens/s"]
    lines += [f"  {k:24s} {v['seconds']:7.2f} s  {v['calls']:5d} calls" for k, v in result["parts"].items()]
    sys.stdout.write("\n".join(lines) + "\n")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
