"""Reply quality of the bundled model on easy questions: answered, looping, wrong-language and in-style rates per persona.

Run: ``python -m benchmarks.reply_quality --part tune|heldout [--personas sia bolt] [--limit N] [--greedy]
[--repetition-penalty R] [--no-repeat-ngram N] [--temperature T] [--max-tokens N] [--lowercase on|off] [--max-sentences N]
[--exclaim on|off] [--address TEXT] [--speaker NAME]
[--prompts FILE] [--out PATH] [--merge]``
(``--prompts``: a JSON object of persona -> system prompt tried in place of the persona's, for tuning).

Every question of ``benchmarks/data/easy_questions/<part>.jsonl`` is asked once of a fresh identity of each persona
(so the base model reading the persona's system prompt), exactly as the service builds a turn
(``sia.identity.turn.stream_turns`` with the persona's prompt as context), in batches of ``--batch`` questions (a
batched row decodes as it would alone). Two decodings: the persona's default sampling (``sia.personas``: temperature
0.4, top-p 0.9, 128 tokens; every row's generator seeded with ``--seed``, 0 by default, so a run is reproducible and
another seed is another draw of every reply) and greedy (temperature 0); with ``--greedy`` only greedy, with
``--sampled`` only the persona's. ``--repetition-penalty``, ``--no-repeat-ngram``, ``--temperature``, ``--max-tokens``,
``--lowercase``, ``--max-sentences``, ``--exclaim``, ``--address`` and ``--speaker`` override the persona's defaults.

Reported per persona and decoding (``benchmarks.reply_metrics`` defines each): answered rate, loop rate,
wrong-language rate, mean length in words, style rate, and the answered rate per question kind. The JSON (``--out``,
default ``benchmarks/results/reply_quality.json``) holds these, the setup and every reply; with ``--merge`` the personas
run replace theirs in that file and the others' figures stay. The held-out part is for
reporting only: defaults are chosen on the tune part.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.machine import machine_info
from benchmarks.reply_metrics import answered, loops, style_ok, words, wrong_language
from sia.checkpoint import DEFAULT_CACHE, DEFAULT_CHECKPOINT, load_model
from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest, stream_turns
from sia.model.generate import SamplingParams, logit_bias_pairs
from sia.model.identity_model import IdentityModel
from sia.personas import DEFAULT_PERSONA, PERSONAS, persona_prompt, persona_sampling

log = logging.getLogger("benchmarks.reply_quality")

QUESTIONS = Path(__file__).parent / "data" / "easy_questions"
DEFAULT_OUT = Path(__file__).parent / "results" / "reply_quality.json"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("tune", "heldout"), required=True, help="which question file")
    p.add_argument("--personas", nargs="+", default=None, help=f"default: all ({', '.join(PERSONAS)})")
    p.add_argument("--limit", type=int, default=None, help="the first N questions only (a smoke check)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--greedy", action="store_true", help="greedy decoding only (default: the persona's and greedy)")
    which.add_argument("--sampled", action="store_true", help="the persona's sampled decoding only")
    p.add_argument("--repetition-penalty", type=float, default=None, help="override the persona's (1: off)")
    p.add_argument("--no-repeat-ngram", type=int, default=None, help="override the persona's (0: off)")
    p.add_argument("--temperature", type=float, default=None, help="override the persona's sampled temperature")
    p.add_argument("--max-tokens", type=int, default=None, help="override the persona's reply length limit")
    p.add_argument("--lowercase", choices=("on", "off"), default=None, help="override the persona's lowercase decoding")
    p.add_argument("--exclaim", choices=("on", "off"), default=None, help="override the persona's exclamation rule")
    p.add_argument("--address", default=None, help='override the persona\'s form of address ("": off)')
    p.add_argument("--speaker", default=None, help='override the name a reply never opens by calling out ("": off)')
    p.add_argument("--max-sentences", type=int, default=None, help="override the persona's sentence limit (0: off)")
    p.add_argument("--max-words", type=int, default=None, help="override the persona's soft word limit (0: off)")
    p.add_argument("--wind-down", type=int, default=None, help="override the persona's wind-down tokens (0: off)")
    p.add_argument(
        "--logit-bias", type=json.loads, default=None, help='override the persona\'s: a JSON object {"token id": bias}'
    )
    p.add_argument(
        "--logit-bias-once", choices=("on", "off"), default=None, help="override the persona's: each bias until its token is said"
    )
    p.add_argument(
        "--prompts", type=Path, default=None, help="a JSON object of persona -> system prompt tried in place of the persona's"
    )
    p.add_argument("--seed", type=int, default=0, help="every sampled row's generator seed (another draw of each reply)")
    p.add_argument("--batch", type=int, default=8, help="questions decoded together")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--merge", action="store_true", help="keep the other personas' figures already in --out")
    args = p.parse_args(argv)
    unknown = set(args.personas or ()) - set(PERSONAS)
    if unknown:
        p.error(f"unknown personas {sorted(unknown)}; expected some of {sorted(PERSONAS)}")
    return args


def read_questions(part: str, limit: int | None = None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (QUESTIONS / f"{part}.jsonl").read_text().splitlines() if line.strip()]
    return rows[:limit] if limit is not None else rows


def ask(
    model: IdentityModel,
    persona: str,
    questions: Sequence[dict[str, Any]],
    params: SamplingParams,
    batch: int,
    prompt: str | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Each question asked of a fresh identity of ``persona`` (its system prompt, or ``prompt`` in its place): its reply
    and token ids. Sampled rows draw from generators seeded alike (``seed``): every row's draw is its own, whichever
    rows share its batch."""
    tok = model.tokenizer
    context = tuple(tok.system_prompt(persona_prompt(model, persona) if prompt is None else prompt))
    fresh = IdentityState.fresh(model.config)
    dynamics = Dynamics.from_config(model.config)
    params = params if params.greedy else replace(params, seed=seed)
    replies: list[dict[str, Any]] = []
    for start in range(0, len(questions), batch):
        chunk = questions[start : start + batch]
        requests = [TurnRequest(state=fresh, message=q["question"], dynamics=dynamics, context=context) for q in chunk]
        turns = stream_turns(model, requests, params)
        tokens: list[list[int]] = [[] for _ in chunk]
        for event in turns:
            tokens[event.row].append(event.token)
        for q, result, ids in zip(chunk, turns.result, tokens, strict=True):
            replies.append({"id": q["id"], "reply": result.reply, "tokens": ids, "finish": result.finish_reason})
    return replies


def score(persona: str, questions: Sequence[dict[str, Any]], replies: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The rates over one persona's replies, and each reply with its verdicts."""
    rows = []
    for q, r in zip(questions, replies, strict=True):
        text, tokens = r["reply"], r["tokens"]
        rows.append(
            {
                "id": q["id"],
                "kind": q["kind"],
                "question": q["question"],
                "reply": text,
                "answered": answered(text, q["accept"]),
                "loops": loops(text, tokens),
                "wrong_language": wrong_language(text),
                "style": style_ok(persona, text, tokens),
                "words": len(words(text)),
                "cut": r["finish"] == "length",
            }
        )
    n = len(rows)

    def rate(key: str, subset: Sequence[dict[str, Any]] = rows) -> float:
        return sum(bool(x[key]) for x in subset) / len(subset) if subset else float("nan")

    kinds = sorted({x["kind"] for x in rows})
    return {
        "n": n,
        "answered": rate("answered"),
        "loops": rate("loops"),
        "wrong_language": rate("wrong_language"),
        "style": rate("style"),
        "cut": rate("cut"),
        "mean_words": statistics.fmean(x["words"] for x in rows) if rows else float("nan"),
        "answered_by_kind": {k: rate("answered", [x for x in rows if x["kind"] == k]) for k in kinds},
        "replies": rows,
    }


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = [
        "| persona | decoding | n | answered | loops | wrong language | style | cut | mean words |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for persona, modes in results.items():
        for mode, s in modes.items():
            lines.append(
                f"| {persona} | {mode} | {s['n']} | {s['answered']:.0%} | {s['loops']:.0%} | {s['wrong_language']:.0%} "
                f"| {s['style']:.0%} | {s['cut']:.0%} | {s['mean_words']:.1f} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    info = machine_info(args.threads)
    questions = read_questions(args.part, args.limit)
    personas = args.personas or sorted(PERSONAS, key=lambda n: (n != DEFAULT_PERSONA, n))
    model = load_model(args.checkpoint, cache_dir=args.cache)
    overrides: dict[str, Any] = {}
    if args.repetition_penalty is not None:
        overrides["repetition_penalty"] = args.repetition_penalty
    if args.no_repeat_ngram is not None:
        overrides["no_repeat_ngram"] = args.no_repeat_ngram
    if args.temperature is not None:
        overrides["temperature"] = args.temperature
    if args.max_tokens is not None:
        overrides["max_new_tokens"] = args.max_tokens
    if args.lowercase is not None:
        overrides["lowercase"] = args.lowercase == "on"
    if args.max_sentences is not None:
        overrides["max_sentences"] = args.max_sentences
    if args.max_words is not None:
        overrides["max_words"] = args.max_words
    if args.wind_down is not None:
        overrides["wind_down"] = args.wind_down
    if args.exclaim is not None:
        overrides["exclaim"] = args.exclaim == "on"
    if args.address is not None:
        overrides["address"] = args.address
    if args.speaker is not None:
        overrides["speaker"] = args.speaker
    if args.logit_bias is not None:
        overrides["logit_bias"] = logit_bias_pairs(args.logit_bias)
    if args.logit_bias_once is not None:
        overrides["logit_bias_once"] = args.logit_bias_once == "on"
    prompts: dict[str, str] = {}
    if args.prompts is not None:
        prompts = {str(k): str(v) for k, v in json.loads(args.prompts.read_text()).items()}
    results: dict[str, dict[str, dict[str, Any]]] = {}
    setup: dict[str, Any] = {
        "part": args.part,
        "questions": len(questions),
        "limit": args.limit,
        "seed": args.seed,
        "checkpoint": str(args.checkpoint),
        "overrides": overrides,
        "prompts": {p: prompts.get(p, persona_prompt(model, p)) for p in personas},
        "decodings": {},
    }
    began = time.perf_counter()
    for persona in personas:
        sampled = replace(persona_sampling(model, persona), **overrides)
        modes = {"default": sampled, "greedy": replace(sampled, temperature=0.0)}
        if args.greedy or args.sampled:
            modes = {k: v for k, v in modes.items() if (k == "greedy") == args.greedy}
        results[persona] = {}
        for mode, params in modes.items():
            log.info("%s, %s: %d questions", persona, mode, len(questions))
            replies = ask(model, persona, questions, params, args.batch, prompts.get(persona), args.seed)
            results[persona][mode] = score(persona, questions, replies)
            setup["decodings"].setdefault(persona, {})[mode] = {
                k: v for k, v in asdict(params).items() if k not in ("seed", "stop", "top_logprobs")
            }
    setup["seconds"] = round(time.perf_counter() - began, 1)
    info["loadavg_end"] = os.getloadavg()
    text = table(results)
    sys.stdout.write(text + "\n")
    report = {"machine": info, "setup": setup, "results": results}
    if args.merge and args.out.exists():  # the other personas' figures kept from the file's earlier run
        report = merged(json.loads(args.out.read_text()), report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


def merged(earlier: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """``run``'s personas over ``earlier``'s report of the same part and questions: the personas run replace theirs,
    the others keep their figures, prompts and decodings; each persona's machine and date are kept beside it."""
    same = ("part", "questions", "limit", "checkpoint", "overrides")
    if any(earlier["setup"].get(k) != run["setup"].get(k) for k in same):
        raise SystemExit(f"--merge: {', '.join(same)} must match the earlier run's")
    if earlier["setup"].get("seed", 0) != run["setup"].get("seed", 0):  # a report from before --seed drew with 0
        raise SystemExit("--merge: the sampled replies' seed must match the earlier run's")
    out = {**earlier, "machine": run["machine"], "results": {**earlier["results"], **run["results"]}}
    setup = dict(earlier["setup"])
    decodings = earlier["setup"].get("decodings", {})
    if set(decodings) <= {"default", "greedy"}:  # a report from before decodings were kept per persona: one for all
        decodings = {p: decodings for p in earlier["results"]}
    setup["prompts"] = {**earlier["setup"].get("prompts", {}), **run["setup"]["prompts"]}
    setup["decodings"] = {**decodings, **run["setup"]["decodings"]}
    ran = {p: {"machine": run["machine"], "seconds": run["setup"]["seconds"]} for p in run["results"]}
    setup["runs"] = {**earlier["setup"].get("runs", {}), **ran}
    out["setup"] = setup
    return out


if __name__ == "__main__":
    main()
