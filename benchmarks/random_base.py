"""A base of a checkpoint's shapes with random weights, and a SIA checkpoint over it: for timing where the real weights
are not at hand.

Run: ``python -m benchmarks.random_base --like DIR --out DIR [--checkpoint DIR] [--seed 0]``.

``--like`` is a Hugging Face LLaMA directory whose ``config.json``, ``tokenizer.json`` and ``tokenizer_config.json``
are copied (its weights, if any, are not read: the directory may hold only those three files). Written under ``--out``:

* ``base/``: those three files and ``model.safetensors``, float32, every matrix drawn from N(0, 0.02²) (the
  initialisation of transformers' ``LlamaForCausalLM``) and every norm's weight 1, from ``--seed``;
* ``checkpoint/``: ``--checkpoint``'s ``config.json`` and ``identity.safetensors`` (default: the bundled SIA
  checkpoint) with a ``base.json`` naming ``../base`` and its digest, so ``load_model``, ``sia serve``
  (``SIA_CHECKPOINT``) and every benchmark's ``--checkpoint`` load it as they load the shipped one.

A decoding step's work depends on the shapes, not on the values: a speed figure measured on such a checkpoint is the
real model's, given the same number of tokens. What the values decide (when a reply ends, which spans a turn imprints:
under weights this random every token is surprising, so the imprint fills at once) differs, and a figure measured
this way says so.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from sia.backbones.weights import read_hf
from sia.checkpoint import BASE_FILE, CONFIG_FILE, DEFAULT_CHECKPOINT, IDENTITY_FILE, WEIGHTS_FILE, source_digest

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
STD = 0.02


def random_tensors(config: dict[str, int | bool], seed: int) -> dict[str, torch.Tensor]:
    """An HF LLaMA state dict of ``config``'s shapes: matrices N(0, STD²), norms 1."""
    g = torch.Generator().manual_seed(seed)
    d, inter, n_layer = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    head_dim, n_head, n_kv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * STD

    tensors = {"model.embed_tokens.weight": normal(config["vocab_size"], d), "model.norm.weight": torch.ones(d)}
    if not config["tie_word_embeddings"]:
        tensors["lm_head.weight"] = normal(config["vocab_size"], d)
    for i in range(n_layer):
        p = f"model.layers.{i}."
        tensors |= {
            p + "self_attn.q_proj.weight": normal(n_head * head_dim, d),
            p + "self_attn.k_proj.weight": normal(n_kv * head_dim, d),
            p + "self_attn.v_proj.weight": normal(n_kv * head_dim, d),
            p + "self_attn.o_proj.weight": normal(d, n_head * head_dim),
            p + "mlp.gate_proj.weight": normal(inter, d),
            p + "mlp.up_proj.weight": normal(inter, d),
            p + "mlp.down_proj.weight": normal(d, inter),
            p + "input_layernorm.weight": torch.ones(d),
            p + "post_attention_layernorm.weight": torch.ones(d),
        }
    return tensors


def write_random_base(like: Path, out: Path, checkpoint: Path = DEFAULT_CHECKPOINT, seed: int = 0) -> Path:
    """``out/base`` and ``out/checkpoint`` as the module says; returns the checkpoint's directory."""
    like, out = Path(like), Path(out)
    missing = [name for name in (CONFIG_FILE, *TOKENIZER_FILES) if not (like / name).is_file()]
    if missing:
        raise ValueError(f"{like} lacks {', '.join(missing)}")
    base, ckpt = out / "base", out / "checkpoint"
    base.mkdir(parents=True, exist_ok=True)
    ckpt.mkdir(parents=True, exist_ok=True)
    for name in (CONFIG_FILE, *TOKENIZER_FILES):
        shutil.copyfile(like / name, base / name)
    config = json.loads((like / CONFIG_FILE).read_text(encoding="utf-8"))
    config.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
    config.setdefault("num_key_value_heads", config["num_attention_heads"])
    config.setdefault("tie_word_embeddings", False)
    save_file(random_tensors(config, seed), str(base / WEIGHTS_FILE))
    read_hf(base)  # every tensor's name and shape as a loader checks them
    for name in (CONFIG_FILE, IDENTITY_FILE):
        shutil.copyfile(Path(checkpoint) / name, ckpt / name)
    ref = {"path": "../base", "sha256": source_digest(base)}
    (ckpt / BASE_FILE).write_text(json.dumps(ref, indent=2) + "\n")
    return ckpt


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--like", type=Path, required=True, help="an HF LLaMA directory: config.json and the tokenizer's files")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT, help="the SIA checkpoint whose identity to copy")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    sys.stdout.write(f"{write_random_base(args.like, args.out, args.checkpoint, args.seed)}\n")


if __name__ == "__main__":
    main()
