"""The ``sia`` command line: one-shot and interactive turns against an identity state kept in a file."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sia.checkpoint import DEFAULT_CACHE, load_model
from sia.identity.state import Dynamics, IdentityState, state_from_bytes, state_to_bytes
from sia.identity.turn import TurnRequest, TurnResult, stream_turns
from sia.model.config import LlamaConfig, read_json_object
from sia.model.generate import Sampling, SamplingParams
from sia.model.identity_model import IdentityModel
from sia.personas import PERSONAS, persona_prompt, persona_sampling

if TYPE_CHECKING:
    from sia.learn.natural_eval import NaturalOptions

log = logging.getLogger("sia")


def sampling_choices(args: argparse.Namespace) -> Sampling:
    """The decoding options given on the command line (``add_turn_options``); None where left to the persona."""
    return Sampling(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=tuple(args.stop),
        repetition_penalty=args.repetition_penalty,
        no_repeat_ngram=args.no_repeat_ngram,
        frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty,
        logit_bias=None if args.logit_bias is None else tuple(args.logit_bias),
        logit_bias_once=args.logit_bias_once,
        lowercase=args.lowercase,
        max_sentences=args.max_sentences,
        max_words=args.max_words,
        wind_down=args.wind_down,
        exclaim=args.exclaim,
        address=args.address,
        recall_temperature=args.recall_temperature,
    )


def _bias_pair(text: str) -> tuple[int, float]:
    token, sep, bias = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return int(token), float(bias)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TOKEN=BIAS (a token id and a number); got {text!r}") from None


def _sampling(args: argparse.Namespace, model: IdentityModel) -> SamplingParams:
    """The options given, the rest from the persona defaults of this kind of model (sia.personas)."""
    return sampling_choices(args).over(persona_sampling(model, args.persona))


def _load_state(path: Path | None, model: IdentityModel) -> IdentityState:
    if path is None or not path.exists():
        return IdentityState.fresh(model.config)
    return state_from_bytes(path.read_bytes(), model.config)


def _save_state(path: Path | None, state: IdentityState) -> None:
    if path is None:
        return
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(state_to_bytes(state))
    tmp.replace(path)  # atomic: a crash never leaves a half-written state


def _turn(model: IdentityModel, state: IdentityState, message: str, params: SamplingParams, persona: str) -> TurnResult:
    context = tuple(model.tokenizer.system_prompt(persona_prompt(model, persona)))
    request = TurnRequest(state=state, message=message, dynamics=Dynamics.from_config(model.config), context=context)
    turn = stream_turns(model, [request], params)
    for event in turn:
        sys.stdout.write(event.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return turn.result[0]


def cmd_generate(args: argparse.Namespace) -> int:
    model = load_model(args.checkpoint, cache_dir=args.cache)
    state = _load_state(args.state, model)
    result = _turn(model, state, args.prompt, _sampling(args, model), args.persona)
    log.info(
        "turn %d: shock %.3f, nll %.3f nats/token, %d reply tokens (%s)",
        result.state.turns,
        result.shock,
        result.nll,
        result.completion_tokens,
        result.finish_reason,
    )
    _save_state(args.state, result.state)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    model = load_model(args.checkpoint, cache_dir=args.cache)
    state = _load_state(args.state, model)
    params = _sampling(args, model)
    sys.stdout.write("Type a message; an empty line or Ctrl-D ends the conversation.\n")
    for line in sys.stdin:
        message = line.rstrip("\n")
        if not message:
            break
        result = _turn(model, state, message, params, args.persona)
        state = result.state
        _save_state(args.state, state)
        log.info("turn %d: shock %.3f", state.turns, result.shock)
    return 0


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The training-config fields given on the command line."""
    given = {
        "out_dir": None if args.out is None else str(args.out),
        "steps": args.steps,
        "threads": args.threads,
        "seed": args.seed,
    }
    return {name: value for name, value in given.items() if value is not None}


def cmd_train(args: argparse.Namespace) -> int:
    if "base" in read_json_object(args.config):  # an adapter config names its backbone (null: the bundled one)
        return _train_adapter(args)
    if args.device is not None:
        raise ValueError(f'--device applies to adapter training only; {args.config} has no "base" key')
    from sia.learn.native.train import TrainConfig, train

    config = replace(TrainConfig.from_file(args.config), **_overrides(args))  # replace() re-validates
    train(config, progress=not args.quiet)
    return 0


def _train_adapter(args: argparse.Namespace) -> int:
    """Train the identity adapter of a pretrained backbone (sia.learn.adapter.train)."""
    from sia.learn.adapter.train import TrainConfig, train

    device = {} if args.device is None else {"device": args.device}
    config = replace(TrainConfig.from_file(args.config), **_overrides(args), **device)  # replace() re-validates
    train(config, progress=not args.quiet, cache_dir=args.cache)
    return 0


def natural_options(args: argparse.Namespace) -> NaturalOptions:
    """What ``sia eval --natural PART`` measures, from its options."""
    from sia.learn.natural_eval import NaturalOptions

    return NaturalOptions(
        part=args.natural,
        depths=tuple(args.depths),
        modes=tuple(args.modes),
        users=args.users,
        batch=args.batch,
        conversations=args.conversations,
        keep_text=not args.no_text,
    )


def cmd_eval(args: argparse.Namespace) -> int:
    if args.natural is not None:
        from sia.backbones.llama import LlamaModel
        from sia.learn.natural_eval import run_natural_eval

        model = load_model(args.checkpoint, cache_dir=args.cache)
        if not isinstance(model, LlamaModel):
            raise ValueError("the natural set measures a chat backbone; the native model reads bytes of its own corpus")
        natural = natural_options(args)
        found = run_natural_eval(model, args.out, natural)
        met = sum(t["met"] for t in found["targets"])
        log.info("report written to %s (%d targets met of %d)", args.out / "report.md", met, len(found["targets"]))
        return 0
    native = args.checkpoint is not None and (args.checkpoint / "model.safetensors").is_file()
    if not native:  # the bundled model, or any checkpoint of a pretrained backbone
        from sia.learn.adapter.evaluate import EvalOptions
        from sia.learn.adapter.evaluate import run_eval as run_memory_eval

        options = EvalOptions(
            episodes=args.episodes,
            conversations=args.conversations,
            seed=args.seed + 100,
            device=args.device,
            read_shifts=tuple(args.read_shifts),
            draws=tuple(args.draws),
        )
        figures = run_memory_eval(args.checkpoint, args.out, options, history=args.history, cache_dir=args.cache)
        log.info(
            "report written to %s (%d targets met of %d)",
            args.out / "report.md",
            sum(t["met"] for t in figures["targets"]),
            len(figures["targets"]),
        )
        return 0
    from sia.learn.native.evaluate import run_eval

    figures = run_eval(
        args.checkpoint,
        args.out,
        twin_checkpoint=args.twin,
        seed=args.seed,
        n_heldout=args.heldout,
        max_episodes=args.max_episodes,
    )
    log.info("report written to %s (%d figures)", args.out / "report.md", len(figures))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """A SIA checkpoint of a pretrained backbone rewritten for serving: slot maps factored, weights stored smaller."""
    from sia.checkpoint import export_adapter

    out = export_adapter(
        args.checkpoint, args.out, slot_rank=args.slot_rank, dtype=args.dtype, read_shift=args.read_shift, cache_dir=args.cache
    )
    c = LlamaConfig.from_file(out / "config.json")
    mb = sum(p.stat().st_size for p in out.iterdir()) / 1e6
    log.info("wrote %s (%.1f MB; slot rank %s, %s weights, read shift %g)", out, mb, c.slot_rank, c.weights_dtype, c.read_shift)
    return 0


def cmd_recipe(args: argparse.Namespace) -> int:
    """Train and export every stage of a recipe in order (sia.learn.adapter.recipe)."""
    from sia.learn.adapter.recipe import Recipe, run_recipe

    given = {"steps": args.steps, "threads": args.threads, "device": args.device, "base": args.base}
    recipe = Recipe.from_file(args.recipe).with_overrides({k: v for k, v in given.items() if v is not None})
    final = run_recipe(recipe, args.out, progress=not args.quiet, cache_dir=args.cache)
    log.info("recipe done: %s (measure it with: sia eval --checkpoint %s)", final, final)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sia", description="SIA, the stateful identity-attention runtime.")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)

    def add_turn_options(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--checkpoint",
            type=Path,
            default=None,
            help="checkpoint directory, GGUF file or HF directory (default: the bundled model)",
        )
        p.add_argument(
            "--cache", type=Path, default=DEFAULT_CACHE, help=f"where a GGUF base is dequantised once (default {DEFAULT_CACHE})"
        )
        p.add_argument("--persona", default="sia", help=f"persona whose prompt opens each turn ({', '.join(sorted(PERSONAS))})")
        p.add_argument(
            "--state", type=Path, default=None, help="identity state file (safetensors); read if present, written after each turn"
        )
        p.add_argument("--max-tokens", type=int, default=None, help="default: the persona's (64, or 128 for a chat backbone)")
        p.add_argument("--temperature", type=float, default=None, help="0 is greedy; default 0.8, or 0.4 for a chat backbone")
        p.add_argument("--top-k", type=int, default=None)
        p.add_argument("--top-p", type=float, default=None, help="default: 0.95, or 0.9 for a chat backbone")
        p.add_argument("--seed", type=int, default=None)
        p.add_argument(
            "--repetition-penalty", type=float, default=None, help="> 1 discourages tokens the reply already holds (1: off)"
        )
        p.add_argument("--no-repeat-ngram", type=int, default=None, help="ban repeating an n-gram of the reply (0: off)")
        p.add_argument("--frequency-penalty", type=float, default=None, help="OpenAI's, in [-2, 2] (0: off)")
        p.add_argument("--presence-penalty", type=float, default=None, help="OpenAI's, in [-2, 2] (0: off)")
        p.add_argument(
            "--logit-bias",
            type=_bias_pair,
            action="append",
            default=None,
            metavar="TOKEN=BIAS",
            help="add BIAS (in [-100, 100]) to token id TOKEN's logit (repeatable)",
        )
        p.add_argument(
            "--logit-bias-once",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="each --logit-bias holds only until the reply holds its token",
        )
        p.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=None, help="write the reply in lower case")
        p.add_argument("--max-sentences", type=int, default=None, help="end the reply after this many sentences (0: off)")
        p.add_argument(
            "--max-words", type=int, default=None, help="end the reply soon after this many words, at a point of its own (0: off)"
        )
        p.add_argument(
            "--wind-down",
            type=int,
            default=None,
            help="in the reply's last N tokens before --max-tokens, pull its end nearer so it ends at a sentence (0: off)",
        )
        p.add_argument(
            "--exclaim",
            action=argparse.BooleanOptionalAction,
            default=None,
            help='write a full stop right after a word as "!" until the reply holds one',
        )
        p.add_argument(
            "--address", default=None, help='a form of address (", sir") written before the first sentence end ("": off)'
        )
        p.add_argument(
            "--recall-temperature",
            type=float,
            default=None,
            help="the most a reply to a question about the user's facts is decoded at (0: greedy)",
        )
        p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")

    gen = sub.add_parser("generate", help="one turn: reply to PROMPT and update the identity state")
    gen.add_argument("prompt")
    add_turn_options(gen)
    gen.set_defaults(func=cmd_generate)

    chat = sub.add_parser("chat", help="an interactive conversation in the terminal")
    add_turn_options(chat)
    chat.set_defaults(func=cmd_chat)

    tr = sub.add_parser(
        "train",
        help='train a native model, or the identity adapter of a pretrained backbone (a config with a "base" key); resumes',
    )
    tr.add_argument("--config", type=Path, default=Path("configs/default.json"), help="training config (JSON)")
    tr.add_argument("--out", type=Path, default=None, help="output directory (overrides the config's out_dir)")
    tr.add_argument("--steps", type=int, default=None, help="override the number of steps")
    tr.add_argument("--threads", type=int, default=None, help="torch threads")
    tr.add_argument("--seed", type=int, default=None, help="override the seed (initialisation and every batch)")
    tr.add_argument("--device", default=None, help="adapter training only: the torch device to train on (e.g. cuda)")
    tr.add_argument(
        "--cache",
        type=Path,
        default=DEFAULT_CACHE,
        help=f"adapter training: where the base is dequantised (default {DEFAULT_CACHE})",
    )
    tr.add_argument("--quiet", action="store_true", help="no progress bar")
    tr.set_defaults(func=cmd_train)

    ev = sub.add_parser("eval", help="measure what the identity state does; writes a markdown/JSON/PNG report")
    ev.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="model to evaluate (default: the bundled model); a native one gets its own report",
    )
    ev.add_argument("--twin", type=Path, default=None, help="plain-attention twin checkpoint for the perplexity comparison")
    ev.add_argument("--out", type=Path, default=Path("reports/eval"), help="report directory")
    ev.add_argument("--seed", type=int, default=0, help="corpus seed (the training run's, for its held-out split)")
    ev.add_argument("--heldout", type=int, default=300, help="held-out episodes to generate")
    ev.add_argument("--max-episodes", type=int, default=None, help="evaluate on at most this many episodes")
    ev.add_argument("--episodes", type=int, default=24, help="pretrained backbone: held-out episodes per depth")
    ev.add_argument(
        "--conversations", type=int, default=60, help="pretrained backbone: held-out dialogue conversations (--natural: 0, none)"
    )
    ev.add_argument("--device", default="cpu", help="pretrained backbone: the torch device to evaluate on (e.g. cuda)")
    ev.add_argument(
        "--read-shifts",
        type=float,
        nargs="*",
        default=[],
        help="pretrained backbone: recall and perplexity with every slot logit lowered by each of these in place of the"
        " checkpoint's own read shift (e.g. 0 0.5 1)",
    )
    ev.add_argument(
        "--draws",
        type=int,
        nargs="*",
        default=[],
        help="pretrained backbone: held-out draws (eval seeds, --seed + 100 is the first figure's) of --episodes each at"
        " the target depth, pooled into the figure the targets are judged on (the shipped adapter's: 100 200 ... 1000,"
        " --episodes 32)",
    )
    ev.add_argument("--history", type=Path, default=None, help="pretrained backbone: the training run's history.jsonl to plot")
    ev.add_argument(
        "--natural",
        choices=("tune", "heldout"),
        default=None,
        help="measure the hand-written natural-conversation set's part instead (sia/learn/data/natural)",
    )
    ev.add_argument("--depths", type=int, nargs="+", default=[0, 1, 2, 4, 8, 16], help="--natural: unrelated turns before asking")
    ev.add_argument(
        "--modes",
        nargs="+",
        default=["state", "fresh", "transcript", "oracle"],
        choices=["state", "fresh", "transcript", "oracle"],
    )
    ev.add_argument("--users", type=int, default=None, help="--natural: the first this many users (default: all)")
    ev.add_argument("--batch", type=int, default=8, help="--natural: turns decoded together")
    ev.add_argument(
        "--no-text",
        action="store_true",
        help="--natural: play the turns as privacy mode does (SIA_STORE_TURN_TEXT=false): the imprint keeps no token ids",
    )
    ev.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help=f"where a GGUF base is dequantised (default {DEFAULT_CACHE})"
    )
    ev.set_defaults(func=cmd_eval)

    ex = sub.add_parser("export", help="rewrite a trained adapter for serving: low-rank slot maps, half-precision weights")
    ex.add_argument(
        "--checkpoint", type=Path, required=True, help="a SIA checkpoint of a pretrained backbone (e.g. runs/smollm2/last)"
    )
    ex.add_argument("--out", type=Path, required=True, help="the directory to write (e.g. sia/checkpoints/smollm2)")
    ex.add_argument("--slot-rank", type=int, default=None, help="factor every slot map to this rank (truncated SVD)")
    ex.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None, help="storage dtype of the weights")
    ex.add_argument(
        "--read-shift",
        type=float,
        default=None,
        help="the read's strength the adapter serves at: every slot's logit lowered by this (default: the checkpoint's own)",
    )
    ex.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help=f"where a GGUF base is dequantised (default {DEFAULT_CACHE})"
    )
    ex.set_defaults(func=cmd_export)

    rc = sub.add_parser("recipe", help="train and export every stage of a recipe in order (e.g. recipes/smollm2.json)")
    rc.add_argument("recipe", type=Path, help="the recipe file (JSON: shared training settings, then the stages)")
    rc.add_argument("--out", type=Path, required=True, help="where each stage trains; OUT/final is the last export")
    rc.add_argument("--steps", type=int, default=None, help="every stage trains this many steps (a smoke run of the chain)")
    rc.add_argument("--threads", type=int, default=None, help="torch threads")
    rc.add_argument("--device", default=None, help="the torch device to train on (e.g. cuda)")
    rc.add_argument("--base", default=None, help="another backbone than the recipe's (a GGUF file or HF directory)")
    rc.add_argument("--quiet", action="store_true", help="no progress bar")
    rc.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help=f"where a GGUF base is dequantised (default {DEFAULT_CACHE})"
    )
    rc.set_defaults(func=cmd_recipe)
    return parser


def main(argv: Sequence[str] | None = None, *, parser: argparse.ArgumentParser | None = None) -> int:
    """Run one command; ``parser`` lets a front end (the service's ``sia``) add its own commands."""
    parser = parser or build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(args.func(args))
    except ValueError as exc:
        log.error("%s", exc)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
