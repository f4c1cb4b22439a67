"""The evaluation report: targets with pass or fail, the markdown page."""

from __future__ import annotations

from typing import Any

from sia.model.native import SIAModel

PERPLEXITY_RATIO_TARGET = 1.05
KL_TARGET = 0.05  # nats: history must move the reply distribution at least this much
CONTROL_TOLERANCE = 1e-9  # the same history replayed must give the same distribution
RECALL_TARGET = 0.9


# ---------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------


def targets(figures: dict[str, Any]) -> list[dict[str, Any]]:
    hist, reset, rec = figures["history_dependence"], figures["reset_determinism"], figures["recall"]
    state_acc, stateless_acc = rec["model"]["state"]["accuracy"], rec["model"]["stateless"]["accuracy"]
    ceiling = rec["chance"] + 2 * rec["chance_std"]

    def check(value: Any, ok: bool | None) -> bool | None:
        return None if value is None else ok

    kl, control = hist["kl_mean"], hist["control_kl"]
    ratio = figures["perplexity"].get("ratio")
    return [
        {
            "name": "reply perplexity relative to the plain-attention twin",
            "value": ratio,
            "target": f"<= {PERPLEXITY_RATIO_TARGET}",
            "pass": check(ratio, ratio is not None and ratio <= PERPLEXITY_RATIO_TARGET),
        },
        {
            "name": "history dependence: mean KL(p_A ‖ p_B) on a common turn (nats)",
            "value": kl,
            "target": f">= {KL_TARGET}",
            "pass": check(kl, kl is not None and kl >= KL_TARGET),
        },
        {
            "name": "determinism control: KL(p_A ‖ p_A') for the same history replayed",
            "value": control,
            "target": f"<= {CONTROL_TOLERANCE:g} (exactly 0)",
            "pass": check(control, control is not None and control <= CONTROL_TOLERANCE),
        },
        {
            "name": "reset determinism: reply, state and shock equal to a fresh identity's",
            "value": reset["reply_equal"] and reset["state_equal"] and reset["shock_equal"],
            "target": "true",
            "pass": reset["reply_equal"] and reset["state_equal"] and reset["shock_equal"],
        },
        {
            "name": "recall, state carried (no transcript)",
            "value": state_acc,
            "target": f">= {RECALL_TARGET}",
            "pass": check(state_acc, state_acc is not None and state_acc >= RECALL_TARGET),
        },
        {
            "name": "recall, stateless (fresh state at the probe): at chance",
            "value": stateless_acc,
            "target": f"<= chance + 2 sd = {ceiling:.3f}",
            "pass": check(stateless_acc, stateless_acc is not None and stateless_acc <= ceiling),
        },
    ]


def fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def markdown(figures: dict[str, Any]) -> str:
    ppl, hist, rec = figures["perplexity"], figures["history_dependence"], figures["recall"]
    verdict = {True: "pass", False: "**FAIL**", None: "n/a"}
    lines = [
        "# SIA evaluation",
        "",
        f"{figures['n_episodes']} held-out episodes, {figures['n_probes']} probes, seed {figures['seed']}; "
        f"model: {figures['model']['config']['attention']} attention, {figures['model']['parameters']:,} parameters"
        + (f"; twin: {figures['twin']['parameters']:,} parameters" if figures["twin"] else "")
        + ". All figures teacher-forced.",
        "",
        "## Targets",
        "",
        "| figure | value | target | result |",
        "|---|---|---|---|",
    ]
    lines += [f"| {t['name']} | {fmt(t['value'])} | {t['target']} | {verdict[t['pass']]} |" for t in figures["targets"]]
    lines += [
        "",
        "## Perplexity of the replies",
        "",
        "| model | perplexity |",
        "|---|---|",
        f"| SIA, state carried | {fmt(ppl['model'])} |",
        f"| SIA, state reset before every turn | {fmt(ppl['model_stateless'])} |",
        f"| twin (dot attention, no state) | {fmt(ppl['twin'])} |",
        f"| ratio SIA / twin | {fmt(ppl['ratio'])} |",
        "",
        f"History dependence over {hist['pairs']} pairs ({hist.get('same_persona_pairs', 0)} of one persona): "
        f"KL median {fmt(hist.get('kl_median'))}, min {fmt(hist.get('kl_min'))}, max {fmt(hist.get('kl_max'))} nats.",
        "",
        "## Recall of stated facts",
        "",
    ]
    facts = list(rec["chance_by_fact"])
    header = ["model", "mode", "overall", *facts]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.append("| chance | | " + " | ".join(fmt(v) for v in [rec["chance"], *rec["chance_by_fact"].values()]) + " |")
    for who in ("model", "twin"):
        for mode, summary in (rec.get(who) or {}).items():
            cells = [fmt(summary["by_fact"].get(f, {}).get("accuracy")) for f in facts]
            lines.append(f"| {who} | {mode} | {fmt(summary['accuracy'])} | " + " | ".join(cells) + " |")
    lines += ["", "## Plots", ""]
    captions = {
        "attention": "Attention at a probe turn, head 0, first and last layer: fresh vs accumulated state ('self' = self slot)",
        "self_state": "Self-state trajectory over one episode",
        "trace_spectra": "Spectra of the stored trace and of the stabilised metric over the turns of one episode",
        "shocks": "Shock per turn; red crosses mark the corpus's shock turns",
    }
    for key, name in figures["plots"].items():
        lines += [f"### {captions[key]}", "", f"![{key}]({name})", ""]
    return "\n".join(lines)


def model_info(model: SIAModel) -> dict[str, Any]:
    return {"config": model.config.to_dict(), "parameters": model.num_parameters()}
