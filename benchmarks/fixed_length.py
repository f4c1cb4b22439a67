"""Replies of exactly the length asked for: a benchmark times N tokens, so no decoder may stop early.

* ``without_end`` (the native model, ``SIAModel``): its tied output layer (an ``nn.Linear``) gets a bias of
  END_BIAS on the end token, one add of a (V,) vector per forward.
* ``endless`` (a pretrained backbone's ``ChatTokenizer``): a copy of the tokenizer that ends no reply and bans the
  end tokens instead, so ``stream``, ``DecodeBatch`` and the runtime's turns never sample them, with the model's
  weights left exactly as shipped (the tied head gets no bias).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.model.native import SIAModel
from sia.model.tokenizer import ByteTokenizer

END_BIAS = -1e4


def without_end(model: SIAModel, tokenizer: ByteTokenizer) -> SIAModel:
    """A copy of ``model`` that never picks <|end|>: its tied output layer gets a bias of END_BIAS on that logit."""
    twin = copy.deepcopy(model)
    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.end_id] = END_BIAS
    twin.lm_head.bias = nn.Parameter(bias, requires_grad=False)
    return twin.eval()


def endless(tokenizer: ChatTokenizer) -> ChatTokenizer:
    """A copy of ``tokenizer`` whose end tokens end nothing and are never sampled (``banned_ids``)."""
    twin = copy.copy(tokenizer)
    twin.end_ids = frozenset()
    twin.banned_ids = tuple(sorted(set(tokenizer.banned_ids) | tokenizer.end_ids))
    return twin
