"""The confirmation of claim 7's masks finding (``designs/claim7-confirm.md``, issue 45 item 1): its power from
the attribution's data, its progress, and once every declared run is in, the temperature choice, the tests and
the verdict by the declared rule (:meth:`experiments.protocol.claim7.Confirm.verdict`)."""

from __future__ import annotations

import os
import statistics

from .. import stats
from ..claim7 import ATTRIBUTION
from ..claim7_confirm import CONFIRM
from ..common import read_jsonl_gz
from ..declare import check_runs, describe
from .tables import design_paragraph, fmt_half, fmt_p, table

LABELS = {a: ATTRIBUTION.labels[a] for a in CONFIRM.arms}


def power(attr_res: dict) -> dict:
    """MDDs (80 % power) at the declared alphas with the design's 32 pairs, from the attribution's paired SDs of
    sampled pass@1 (``attr_res``: claim7_attribution's results)."""
    out = {}
    n = len(CONFIRM.seeds)
    for (a, b), alpha in ((CONFIRM.primary, CONFIRM.alpha), (("gtpo", "grpo"), CONFIRM.alpha_secondary)):
        c = attr_res.get((a, b, "sampled", "pass@1"))
        if c:
            sd = c["t"]["sd"]
            out[(a, b)] = {"sd": sd, "n_then": len(c["seeds"]), "alpha": alpha,
                           "mdd": stats.mdd_paired(sd, n, alpha=alpha), "observed": c["mean"]}
    return out


def _per_seed(runs: list[dict]) -> dict:
    """{arm: {seed: {(split, temperature): pass@1}}} of the finished runs."""
    out: dict = {}
    for r in runs:
        out.setdefault(r["arm"], {})[r["seed"]] = {
            e: r[CONFIRM.eval_name(*e)]["metrics"]["pass@1"] for e in CONFIRM.evals() if CONFIRM.eval_name(*e) in r}
    return out


def _paired(per: dict, a: str, b: str, ta: float, tb: float) -> dict:
    seeds = sorted(set(per[a]) & set(per[b]))
    diffs = [per[a][s][("heldout", ta)] - per[b][s][("heldout", tb)] for s in seeds]
    t = stats.paired_t(diffs)
    return {"n": len(seeds), "mean": statistics.mean(diffs), "wilcoxon": stats.wilcoxon_signed_rank(diffs), "t": t,
            "mdd": stats.mdd_paired(t["sd"], len(seeds)) if t["sd"] == t["sd"] and t["sd"] > 0 else float("nan")}


def analyse(runs: list[dict]) -> dict:
    """The declared analysis of the finished runs: chosen temperatures, primary and secondary tests, verdict."""
    per = _per_seed(runs)
    chosen = {a: CONFIRM.chosen_temperature({t: [per[a][s][("validation", t)] for s in per[a]]
                                             for t in CONFIRM.temperatures}) for a in CONFIRM.arms}
    a, b = CONFIRM.primary
    res = {"chosen": chosen, "primary": _paired(per, a, b, chosen[a], chosen[b])}
    for x, y, how in CONFIRM.secondary:
        tx, ty = (chosen[x], chosen[y]) if how == "chosen" else (float(how), float(how))
        res[(x, y, how)] = _paired(per, x, y, tx, ty)
    p, t1 = res["primary"], res[(a, b, "1.0")]
    res["verdict"] = CONFIRM.verdict(p["wilcoxon"]["p"], p["mean"], t1["wilcoxon"]["p"], t1["mean"])
    res["means"] = {arm: {e: statistics.mean(per[arm][s][e] for s in per[arm]) for e in CONFIRM.evals()}
                    for arm in CONFIRM.arms}
    return res


#: the declared descriptive measures (design: "Greedy, pass@8 and maj@8 differences, and the final token entropy per
#: arm, are reported descriptively"): (label, eval name or None for the entropy, metric)
DESCRIPTIVE = (("held-out pass@1, greedy", "heldout_t0", "pass@1"),
               ("held-out pass@8, T=1", "heldout_t1", "pass@8"), ("held-out pass@8, T=0.6", "heldout_t0.6", "pass@8"),
               ("held-out maj@8, T=1", "heldout_t1", "maj@8"), ("held-out maj@8, T=0.6", "heldout_t0.6", "maj@8"),
               ("token entropy, last 10 % of steps", None, "entropy/mean"))


def _measure(run: dict, name: str | None, metric: str) -> float:
    if name is None:  # the mean token entropy of the last 10 % of the steps (as in the attribution's tables)
        steps = run["steps"]
        return statistics.mean(s[metric] for s in steps[-max(1, len(steps) // 10):])
    return run[name]["metrics"][metric]


def descriptive(runs: list[dict]) -> list[dict]:
    """Per declared descriptive measure: each arm's mean over its seeds, and GRPO + masks and GTPO each minus GRPO
    paired over the seeds (mean, Wilcoxon p; uncorrected, not tests of the design)."""
    by = {(r["arm"], r["seed"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    out = []
    for lab, name, metric in DESCRIPTIVE:
        val = {a: {s: _measure(by[(a, s)], name, metric) for s in seeds if (a, s) in by} for a in CONFIRM.arms}
        row = {"label": lab, "means": {a: statistics.mean(v.values()) for a, v in val.items()}}
        for a in ("grpo_masks", "gtpo"):
            d = [val[a][s] - val["grpo"][s] for s in seeds if s in val[a] and s in val["grpo"]]
            row[a] = {"mean": statistics.mean(d), "p": stats.wilcoxon_signed_rank(d)["p"]}
        out.append(row)
    return out


def _cmp(c: dict, alpha: float) -> str:
    return (f"{100 * c['mean']:+.2f} points on {c['n']} seeds (Wilcoxon W+ = {fmt_half(c['wilcoxon']['w_plus'])}, "
            f"p = {fmt_p(c['wilcoxon']['p'])}; paired t p = {fmt_p(c['t']['p'])}; MDD {100 * c['mdd']:.2f} at α = {alpha:g})")


def section(attr_res: dict) -> tuple[str, dict]:
    out = [design_paragraph(CONFIRM)]
    pw = power(attr_res)
    if pw:
        out.append("**Power** (declared, recomputed from the attribution's paired spread of sampled pass@1, "
                   f"{len(CONFIRM.seeds)} pairs, 80 % power): "
                   + "; ".join(f"{LABELS[a]} − {LABELS[b]}: paired SD {100 * v['sd']:.2f} points (n {v['n_then']}), "
                               f"MDD {100 * v['mdd']:.2f} points at α = {v['alpha']:g}" for (a, b), v in pw.items())
                   + ".\n")
    res: dict = {"power": pw}
    if not os.path.isfile(CONFIRM.data):
        res["n_done"] = 0
        out.append(f"**Running:** 0 of {len(CONFIRM.jobs())} runs (no data exported yet).\n")
        return "\n".join(out), res
    recs = read_jsonl_gz(CONFIRM.data)
    runs = [r for r in recs if r["kind"] == "final"]
    start = next((r for r in recs if r["kind"] == "start"), None)
    res["check"] = check = check_runs(runs, os.path.basename(CONFIRM.data))
    digests = {r.get("start_sha256") for r in runs}
    if start and runs and digests != {start["archive_sha256"]}:
        raise SystemExit(f"{CONFIRM.data}: runs started from another start model than the archive's "
                         f"({sorted(map(str, digests))} against {start['archive_sha256']})")
    res["n_done"] = n = len(runs)
    out.append(f"**Declared before it ran:** {describe(check)}. Start model: the committed archive (sha256 "
               f"`{start['archive_sha256'][:16]}`), held-out pass@1 {100 * start['heldout']['pass@1']:.1f} % at "
               "temperature 1.\n" if start else f"**Declared before it ran:** {describe(check)}.\n")
    if n < len(CONFIRM.jobs()):
        out.append(f"**Running:** {n} of {len(CONFIRM.jobs())} runs; by the stopping rule no test is computed before "
                   "all have finished.\n")
        return "\n".join(out), res
    res.update(analyse(runs))
    rows = [[LABELS[arm]] + [f"{100 * res['means'][arm][e]:.1f}" for e in CONFIRM.evals()]
            + [f"{res['chosen'][arm]:g}"] for arm in CONFIRM.arms]
    out.append("**Mean pass@1 % per evaluation** (32 seeds; temperature 0 = greedy):\n")
    out.append(table(["arm"] + [f"{s} T={t:g}" for s, t in CONFIRM.evals()] + ["chosen T (tuning split)"], rows) + "\n")
    a, b = CONFIRM.primary
    pr, t1 = res["primary"], res[(a, b, "1.0")]
    temps = " and ".join(sorted({"greedy" if res["chosen"][x] == 0 else f"T={res['chosen'][x]:g}" for x in (a, b)}))
    short = (f"{res['verdict']}: on {pr['n']} fresh seeds (tiny model, lr {ATTRIBUTION.lr:g}) {LABELS[a]} − {LABELS[b]} "
             f"{100 * pr['mean']:+.2f} points of held-out pass@1 with each arm at its tuning-split temperature "
             f"({temps}; Wilcoxon p = {fmt_p(pr['wilcoxon']['p'])}), {100 * t1['mean']:+.2f} at temperature 1 "
             f"(p = {fmt_p(t1['wilcoxon']['p'])})")
    text = (f"**Verdict (the declared rule): {short}.** Primary, {LABELS[a]} − {LABELS[b]} on held-out "
            f"pass@1, each at its chosen temperature ({res['chosen'][a]:g} and {res['chosen'][b]:g}): "
            + _cmp(res["primary"], CONFIRM.alpha) + ". Secondary (α = "
            f"{CONFIRM.alpha_secondary:g} each): the same at temperature 1.0 " + _cmp(res[(a, b, "1.0")], CONFIRM.alpha_secondary)
            + f"; {LABELS['gtpo']} − {LABELS['grpo']} at their chosen temperatures "
            + _cmp(res[("gtpo", "grpo", "chosen")], CONFIRM.alpha_secondary) + ".\n")
    res["verdict_text"] = text
    out.append(text)
    res["descriptive"] = desc = descriptive(runs)
    out.append("**Descriptive** (declared as such: paired over the seeds, Wilcoxon p uncorrected, not tests of the "
               "design; pass@8 and maj@8 from the 8 samples per problem; entropy: mean token entropy of the last 15 "
               "of the 150 training steps, nats):\n")
    scale = {lab: (1.0 if name is None else 100.0) for lab, name, _ in DESCRIPTIVE}
    fmt = {lab: ("{:.3f}" if name is None else "{:.1f}") for lab, name, _ in DESCRIPTIVE}
    out.append(table(["measure", *(LABELS[x] for x in CONFIRM.arms), f"{LABELS[a]} − {LABELS[b]} (p)",
                      f"{LABELS['gtpo']} − {LABELS['grpo']} (p)"],
                     [[r["label"], *(fmt[r["label"]].format(scale[r["label"]] * r["means"][x]) for x in CONFIRM.arms),
                       *(f"{scale[r['label']] * r[x]['mean']:+.{3 if scale[r['label']] == 1 else 2}f} "
                         f"({fmt_p(r[x]['p'])})" for x in ("grpo_masks", "gtpo"))] for r in desc]) + "\n")
    return "\n".join(out), res


def status_row(res: dict) -> list[str]:
    return ["claim 7 confirmation (issue 45 item 1; declared, checked)",
            f"{res.get('n_done', 0)} of {len(CONFIRM.jobs())} runs"
            + (f". {describe(res['check'])}" if res.get("check") else ""),
            f"`experiments/data/{os.path.basename(CONFIRM.data)}`"]
