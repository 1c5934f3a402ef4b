"""docs/results.md's section on claim 1 (``experiments.protocol.claim1``): the paired one-step measurements per
(model, state, variant) and step rule, and their figure."""

from __future__ import annotations

import os
import re
import statistics

from .. import stats
from ..common import DATA, read_jsonl_gz
from .tables import _figure, _save, fmt_p, table

ONESTEP_ARMS = ("grpo", "dr_grpo", "grpo_masks", "gtpo_paper", "gtpo_official")
ONESTEP_LABELS = {"grpo": "GRPO", "dr_grpo": "Dr.GRPO", "grpo_masks": "GRPO + conflict masks",
                  "gtpo_paper": "GTPO (paper preset)", "gtpo_official": "GTPO (official preset)"}


def load_onestep() -> dict[str, list[dict]]:
    d = os.path.join(DATA, "onestep")
    out = {}
    if os.path.isdir(d):
        for name in sorted(os.listdir(d), key=lambda n: n.split(".")[0]):  # a state's seed-0 file first
            if name.endswith(".jsonl.gz"):  # `<state>-seedN` files are more groups of `<state>`
                key = re.sub(r"-seed\d+$", "", name[:-len(".jsonl.gz")])
                out.setdefault(key, []).extend(read_jsonl_gz(os.path.join(d, name)))
    return out


def onestep_arm_table(recs: list[dict], mode: str, metric: str) -> tuple[list[list[str]], dict]:
    """Per arm: groups with the metric defined, its median, share < 0, Wilcoxon vs 0, and the paired
    Wilcoxon against GRPO (same groups)."""
    var = [r for r in recs if r["varying"] and f"grpo/{mode}" in r["arms"]]
    rows, res = [], {}
    for arm in ONESTEP_ARMS:
        key = f"{arm}/{mode}"
        xs = [r["arms"][key][metric] for r in var if key in r["arms"] and r["arms"][key][metric] is not None]
        if not xs:
            continue
        w0 = stats.wilcoxon_signed_rank(xs)
        pairs = [(r["arms"][key][metric], r["arms"][f"grpo/{mode}"][metric]) for r in var
                 if key in r["arms"] and r["arms"][key][metric] is not None and r["arms"][f"grpo/{mode}"][metric] is not None]
        if arm != "grpo":
            wp = stats.wilcoxon_signed_rank([a - b for a, b in pairs])
            vs = f"{'+' if wp['z'] > 0 else '−'} z = {abs(wp['z']):.1f}, p = {fmt_p(wp['p'])} ({100 * wp['frac_positive']:.0f} % of groups higher)"
        else:
            wp, vs = None, "—"
        kl = statistics.mean(r["arms"][key]["kl"] for r in var if key in r["arms"])
        rows.append([ONESTEP_LABELS[arm], len(xs), f"{statistics.median(xs):+.2e}", f"{100 * sum(x < 0 for x in xs) / len(xs):.0f} %",
                     f"z = {w0['z']:+.1f}, p = {fmt_p(w0['p'])}", vs, f"{kl:.2e}"])
        res[arm] = {"n": len(xs), "median": statistics.median(xs), "frac_neg": sum(x < 0 for x in xs) / len(xs),
                    "w0": w0, "vs_grpo": wp, "kl": kl}
    return rows, res


def onestep_section(data: dict[str, list[dict]]) -> tuple[str, dict]:
    """Tables of the one-step measurements: per (model, state, variant) and step rule."""
    out, results = [], {}
    metrics = (("conflict_pos", "Δ log p, conflict-run tokens of positive completions (mean per token)"),
               ("seq_pos", "Δ log p of whole positive completions (sum over tokens; < 0 = likelihood displacement)"))
    for name, recs in data.items():
        var = [r for r in recs if r["varying"]]
        zero = [r for r in recs if not r["varying"]]
        if not var:
            continue
        model, state, variant = name.split("-", 2)
        lengths_pos, lengths_neg = [], []
        for r in var:
            m = sum(r["rewards"]) / len(r["rewards"])
            lengths_pos += [l for l, x in zip(r["lengths"], r["rewards"]) if x > m]
            lengths_neg += [l for l, x in zip(r["lengths"], r["rewards"]) if x < m]
        out.append(f"#### {model}, state `{state}`, variant `{variant}`\n")
        out.append(f"{len(var)} groups with reward variance (of {len(recs)} sampled; {len(zero)} zero-variance); "
                   f"mean length of positive completions {statistics.mean(lengths_pos):.1f} tokens, of negative "
                   f"ones {statistics.mean(lengths_neg):.1f}; mean token entropy {statistics.mean(r['entropy'] for r in recs):.3f}.\n")
        for mode, mode_title in (("unit", "equal step size (plain gradient step of one norm for every arm: direction only)"),
                                 ("adam", "equal learning rate (the trainer's AdamW step from the saved moments)")):
            for metric, title in metrics:
                rows, res = onestep_arm_table(recs, mode, metric)
                if not rows:
                    continue
                results[(name, mode, metric)] = res
                out.append(f"*{title}; {mode_title}.*\n")
                out.append(table(["arm", "groups", "median", "share < 0", "Wilcoxon vs 0", "paired vs GRPO",
                                  "KL(π_new‖π_old), mean"], rows) + "\n")
        if zero:
            zrows = []
            for arm in ONESTEP_ARMS:
                key = f"{arm}/adam"
                xs = [r["arms"][key]["seq_all"] for r in zero if key in r["arms"]]
                if not xs:
                    continue
                w = stats.wilcoxon_signed_rank(xs)
                if arm == "grpo":
                    vs = "— (no gradient: AdamW momentum only)"
                else:
                    wp = stats.wilcoxon_signed_rank([r["arms"][key]["seq_all"] - r["arms"]["grpo/adam"]["seq_all"]
                                                     for r in zero if key in r["arms"]])
                    vs = f"z = {wp['z']:+.1f}, p = {fmt_p(wp['p'])}"
                    results[(name, "zero", arm)] = {"n": len(xs), "median": statistics.median(xs), "w0": w, "vs_grpo": wp}
                zrows.append([ONESTEP_LABELS[arm], len(xs), f"{statistics.median(xs):+.2e}",
                              f"z = {w['z']:+.1f}, p = {fmt_p(w['p'])}", vs])
            out.append("*Zero-variance groups (every reward equal), AdamW step: GRPO has no gradient there (what moves "
                       "is the optimiser's momentum, the same for every arm); the GTPO arms add the gamma shift.*\n")
            out.append(table(["arm", "groups", "median Δ log p per completion (sum over tokens)", "Wilcoxon vs 0",
                              "paired vs GRPO (the momentum-only step)"], zrows) + "\n")
    return "\n".join(out), results


def fig_onestep(data: dict[str, list[dict]]) -> str | None:
    names = [n for n in data if any(r["varying"] for r in data[n])]
    if not names:
        return None
    ncols = min(4, len(names))
    nrows = -(-len(names) // ncols)
    fig, axes = _figure(ncols, nrows, w=3.3, h=3.4)
    for k in range(len(names), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    for k, name in enumerate(names):
        ax = axes[k // ncols][k % ncols]
        var = [r for r in data[name] if r["varying"]]
        vals = [[r["arms"][f"{a}/unit"]["conflict_pos"] for r in var
                 if f"{a}/unit" in r["arms"] and r["arms"][f"{a}/unit"]["conflict_pos"] is not None] for a in ONESTEP_ARMS]
        ax.boxplot(vals, showfliers=False)
        ax.axhline(0, color="k", lw=0.7)
        ax.set_xticks(range(1, len(ONESTEP_ARMS) + 1))
        ax.set_xticklabels(["GRPO", "Dr.GRPO", "GRPO\n+masks", "GTPO\npaper", "GTPO\nofficial"], fontsize=6)
        ax.set_title(name.replace("-", " "), fontsize=8)
    for row in axes:
        row[0].set_ylabel("Δ log p, conflict tokens of positives\n(unit step, per token)", fontsize=7)
    fig.tight_layout()
    return _save(fig, "claim1_onestep.png")
