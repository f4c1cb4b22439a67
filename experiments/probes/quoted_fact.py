"""Whether a question about one fact of a listed kind is better answered by quoting the user's newest clause the
kind tagger labelled with it ("What's my trade again?" -> "You've told me: “I'm an electrician”.") than by the
read's reply ("You told me you work as a phone operator.").

``sia eval --natural`` as shipped, with ``IdentityModel._recollecting`` extended: where a message asks one fact (the
ask head's likeliest kind, p(none) < ½) of a kind in ``--kinds`` and the row's imprint keeps the text of a clause
labelled with that kind, the reply is the recollection's of the newest such clause. Writes ``sia eval``'s figures to
``--out``.

    PYTHONPATH=. python -m experiments.probes.quoted_fact --kinds job hobby pet --out DIR [--part tune] [--depth 4]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace

from server.cli import main as sia_main
from sia.identity.imprint import Imprint
from sia.model.conditioning import Conditioning
from sia.model.identity_model import IdentityModel


def quoting(kinds: set[str]) -> object:
    """``IdentityModel._recollecting`` that also quotes one asked fact of ``kinds``."""
    plain = IdentityModel._recollecting

    def recollecting(
        self: IdentityModel, cond: Conditioning, imprints: Sequence[Imprint | None], texts: Sequence[str] | None
    ) -> Conditioning:
        cond = plain(self, cond, imprints, texts)
        if texts is None:
            return cond
        told = list(cond.recollection or ("",) * len(texts))
        for row, (imprint, text) in enumerate(zip(imprints, texts, strict=True)):
            if told[row] or imprint is None or not imprint.used:
                continue
            asked = self._kinds_asked([text])
            if len(asked) == 1 and asked <= kinds:
                clauses = imprint.recollection(self.tokenizer.decode, asked)
                told[row] = clauses[-1] if clauses else ""
        return replace(cond, recollection=tuple(told)) if any(told) else cond

    return recollecting


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", nargs="+", required=True)
    parser.add_argument("--part", default="tune")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    IdentityModel._recollecting = quoting(set(args.kinds))  # type: ignore[method-assign,assignment]
    cli = ["eval", "--natural", args.part, "--depths", str(args.depth), "--modes", "state", "--conversations", "0"]
    return int(sia_main([*cli, "--out", args.out]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
