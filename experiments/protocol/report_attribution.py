"""docs/results.md's section on the claim-7 attribution design (:mod:`experiments.protocol.claim7b`), with its
verdict generated from the data by the rule declared in ``claim7b.attribution``."""

from __future__ import annotations

import os
import statistics
from collections import defaultdict

from . import claim7b, stats
from .common import DATA, read_jsonl_gz
from .declare import check_runs, describe
from .report import fmt_p, mean_sd, pct, table

DATA_NAME = os.path.relpath(claim7b.DATA_FILE, DATA)
METRICS = (("sampled", "pass@1", "sampled pass@1"), ("greedy", "pass@1", "greedy pass@1"),
           ("sampled", "pass@8", "pass@8"), ("sampled", "maj@8", "maj@8"))


def load() -> tuple[dict | None, list[dict]]:
    if not os.path.isfile(claim7b.DATA_FILE):
        return None, []
    recs = read_jsonl_gz(claim7b.DATA_FILE)
    return next((r for r in recs if r["kind"] == "start"), None), [r for r in recs if r["kind"] != "start"]


def _first_start() -> dict | None:
    path = os.path.join(DATA, "claim7.jsonl.gz")
    return next((r for r in read_jsonl_gz(path) if r["kind"] == "start"), None) if os.path.isfile(path) else None


def entries(runs: list[dict], same_start: bool) -> dict:
    """``{arm: {seed: {"sampled": metrics | None, "greedy": metrics | None, "steps": [...], "own": bool}}}``: this
    design's runs, and for the rerun arms the first design's sampled metrics of the same seed (same start model only)."""
    out: dict = defaultdict(dict)
    for r in runs:
        out[r["arm"]][r["seed"]] = {"sampled": (r.get("sampled") or {}).get("metrics"),
                                    "greedy": (r.get("greedy") or {}).get("metrics"), "steps": r["steps"], "own": True}
    if same_start and os.path.isfile(os.path.join(DATA, "claim7.jsonl.gz")):
        for r in read_jsonl_gz(os.path.join(DATA, "claim7.jsonl.gz")):
            arm = {("final", "gtpo"): "gtpo", ("samelr", "grpo"): "grpo"}.get((r["kind"], r.get("arm")))
            if arm in claim7b.RERUN and r["lr"] == claim7b.LR:
                e = out[arm].setdefault(r["seed"], {"sampled": None, "greedy": None, "steps": r["steps"], "own": False})
                e["first_design"] = r["metrics"]
                e["sampled"] = r["metrics"]  # identical to a rerun's where one ran (the reproduction check says so)
    return out


def _seeds(es: dict, mode: str) -> str:
    xs = sorted(s for s, e in es.items() if e[mode])
    return f"{xs[0]}-{xs[-1]} ({len(xs)})" if xs and xs == list(range(xs[0], xs[-1] + 1)) else (
        ", ".join(map(str, xs)) or "none")


def paired(per_seed: dict, a: str, b: str, mode: str, metric: str) -> dict | None:
    """``a`` minus ``b`` on the seeds where both have the ``mode`` evaluation: mean, Wilcoxon, paired t, MDD."""
    shared = sorted(s for s in set(per_seed.get(a, {})) & set(per_seed.get(b, {}))
                    if per_seed[a][s][mode] and per_seed[b][s][mode])
    if len(shared) < 3:
        return None
    diffs = [per_seed[a][s][mode][metric] - per_seed[b][s][mode][metric] for s in shared]
    t = stats.paired_t(diffs)
    mdd = stats.mdd_paired(t["sd"], len(shared)) if t["sd"] == t["sd"] and t["sd"] > 0 else float("nan")
    return {"seeds": shared, "mean": statistics.mean(diffs), "wilcoxon": stats.wilcoxon_signed_rank(diffs), "t": t,
            "mdd": mdd, "higher": sum(d > 0 for d in diffs)}


def section() -> tuple[str, dict]:
    start, runs = load()
    if not runs:
        return "", {}
    res: dict = {"check": check_runs(runs, DATA_NAME)}
    out = [f"**Declared before it ran:** {describe(res['check'])}.\n"]
    first = _first_start()
    if start:
        ho = start["heldout"]
        line = (f"**The start model** (rebuilt by `claim7.build` in this session): validation pass@1 "
                f"{pct(start['kept_validation']['pass@1'])} % after chunk {start['kept_chunk']}; held-out pass@1 "
                f"{pct(ho['pass@1'])} %, pass@8 {pct(ho['pass@8'])} %, maj@8 {pct(ho['maj@8'])} %")
        res["same_start"] = same = bool(first) and {k: v for k, v in start.items() if "seconds" not in k} == {
            k: v for k, v in first.items() if "seconds" not in k}
        if first:
            fh = first["heldout"]
            line += (f"; the first design's: chunk {first['kept_chunk']}, {pct(fh['pass@1'])} / {pct(fh['pass@8'])} / "
                     f"{pct(fh['maj@8'])} %. "
                     + ("The two start records are equal in every measured value, held-out per-problem scores included: "
                        "the same model" if same else "The records differ: another model; the designs are replicates, "
                        "never pooled"))
        out.append(line + ".\n")
    out.append(blocks_run(runs) + "\n")
    per_seed = entries(runs, res.get("same_start", False))
    arms = [a for a in claim7b.ARMS if a in per_seed]
    out.append(f"**Runs:** every arm at learning rate {claim7b.LR:g}; sampled metrics of "
               + " and ".join(claim7b.LABELS[a] for a in claim7b.RERUN) + " from the first design's runs of the same "
               "seeds (see the amendment), greedy pass@1 from their reruns. Seeds with each evaluation: "
               + "; ".join(f"{claim7b.LABELS[a]}: sampled {_seeds(per_seed[a], 'sampled')}, greedy "
                           f"{_seeds(per_seed[a], 'greedy')}" for a in arms) + ".\n")
    frows = []
    for arm in arms:
        es = [per_seed[arm][s] for s in sorted(per_seed[arm])]
        sm = [e["sampled"] for e in es if e["sampled"]]
        gr = [e["greedy"] for e in es if e["greedy"]]
        own = [e for e in es if e["own"]]
        frows.append([claim7b.LABELS[arm], f"{claim7b.LR:g}", f"{len(sm)} / {len(gr)}",
                      mean_sd([100 * m["pass@1"] for m in sm]), mean_sd([100 * m["pass@1"] for m in gr]),
                      mean_sd([100 * m["pass@8"] for m in sm]), mean_sd([100 * m["maj@8"] for m in sm]),
                      mean_sd([100 * m.get("format_rate", float("nan")) for m in sm]),
                      mean_sd([statistics.mean(x["entropy/mean"] for x in e["steps"][-15:]) for e in own]),
                      mean_sd([100 * statistics.mean(x.get("gtpo/filtered_frac", 0.0) for x in e["steps"]) for e in own]),
                      mean_sd([statistics.mean(x["kl/new_old"] for x in e["steps"] if "kl/new_old" in x) for e in own])])
    res["final"] = per_seed
    if frows:
        if start:
            ho = start["heldout"]
            frows.insert(0, ["start model", "—", "—", pct(ho["pass@1"]), "—", pct(ho["pass@8"]), pct(ho["maj@8"]),
                             pct(ho.get("format_rate", float("nan"))), "—", "—", "—"])
        out.append("**Held-out** (500 problems; sampled: 8 samples at temperature 1; greedy: one completion at "
                   "temperature 0; answers from the `<answer>` tag; entropy, filtered fraction and KL from this design's "
                   "own runs):\n")
        out.append(table(["arm", "learning rate", "seeds sampled / greedy", "sampled pass@1 %", "greedy pass@1 %",
                          "pass@8 %", "maj@8 %", "format rate %", "token entropy, last 10 %", "filtered %",
                          "KL(π_new‖π_old) per step"], frows) + "\n")
    crows = []
    for a, b in claim7b.PRIMARY:
        for mode, metric, name in METRICS:
            c = paired(per_seed, a, b, mode, metric)
            if c is None:
                continue
            res[(a, b, mode, metric)] = c
            w = c["wilcoxon"]
            mark = " **(< 0.0071)**" if (mode, metric) == ("sampled", "pass@1") and w["p"] < claim7b.ALPHA else ""
            crows.append([f"{claim7b.LABELS[a]} − {claim7b.LABELS[b]}", name, len(c["seeds"]), f"{100 * c['mean']:+.2f}",
                          f"{c['higher']} of {len(c['seeds'])}", f"W+ = {w['w_plus']:.0f}, p = {fmt_p(w['p'])}{mark}",
                          f"t = {c['t']['t']:.2f}, p = {fmt_p(c['t']['p'])}", f"{100 * c['mdd']:.2f}"])
    if crows:
        out.append(f"**Paired comparisons** (final seeds; primary: sampled pass@1, Bonferroni over the "
                   f"{len(claim7b.PRIMARY)} primary comparisons, p < {claim7b.ALPHA:.4f}):\n")
        out.append(table(["difference (points)", "metric", "paired seeds", "mean", "seeds higher", "Wilcoxon signed-rank",
                          "paired t", "MDD (80 % power, points)"], crows) + "\n")
    if res.get("same_start"):
        out.append(reproduction(runs, res) + "\n")
    finals = [e for es in per_seed.values() for e in es.values() if e["sampled"] and e["steps"]]
    if len(finals) >= 5:
        rho = stats.spearman([statistics.mean(x["entropy/mean"] for x in e["steps"][-15:]) for e in finals],
                             [e["sampled"]["pass@1"] for e in finals])
        res["entropy_rho"] = rho
        out.append(f"Across the {len(finals)} runs with sampled metrics, final token entropy and sampled pass@1: Spearman ρ = "
                   f"{rho['rho']:+.2f} (p = {fmt_p(rho['p'])}).\n")
    res["verdict"] = verdict(res)
    return "\n".join(out), res


def blocks_run(runs: list[dict]) -> str:
    """Which declared blocks of ``claim7b.ORDER`` the data holds, whole or in part, and how the rule ended them."""
    have = {(r["arm"], r["seed"]) for r in runs}
    parts = []
    for b, jobs in claim7b.ORDER.items():
        n = sum(j in have for j in jobs)
        parts.append(f"block {b}: {n} of {len(jobs)} runs" + (" (complete)" if n == len(jobs) else ""))
    return f"**Blocks run** (of the declared order; blocks 2, 3 and 6 are the stress experiment's): {'; '.join(parts)}. " \
        + claim7b.ENDED


def reproduction(runs: list[dict], res: dict) -> str:
    """The reruns of GTPO and GRPO at 5e-5 scored sampled (seed 0) against the first design's runs of the same
    seed and rate: whether they reproduce the held-out pass@1 and every step's reward exactly."""
    first = read_jsonl_gz(os.path.join(DATA, "claim7.jsonl.gz"))
    old = {("gtpo", r["seed"]): r for r in first if r["kind"] == "final" and r["arm"] == "gtpo" and r["lr"] == claim7b.LR}
    old.update({("grpo", r["seed"]): r for r in first if r["kind"] == "samelr" and r["arm"] == "grpo"
                and r["lr"] == claim7b.LR})
    parts = []
    for r in runs:
        if r["arm"] in claim7b.RERUN and r.get("sampled") and (r["arm"], r["seed"]) in old:
            o = old[(r["arm"], r["seed"])]
            same_steps = [x.get("reward/mean") for x in r["steps"]] == [x.get("reward/mean") for x in o["steps"]]
            same = r["sampled"]["metrics"]["pass@1"] == o["metrics"]["pass@1"]
            res[("reproduced", r["arm"], r["seed"])] = same and same_steps
            parts.append(f"{claim7b.LABELS[r['arm']]} seed {r['seed']}: held-out pass@1 {pct(r['sampled']['metrics']['pass@1'])} "
                         f"% against {pct(o['metrics']['pass@1'])} %, every step's mean reward "
                         + ("equal" if same_steps else "different"))
    return ("**Reproduction check** (same start model, seed and rate, the code of this design's commit): "
            + "; ".join(parts) + ".") if parts else ""


def verdict(res: dict) -> str:
    """The attribution sentence, by claim7b's declared rule, with every number from the data; comparisons
    whose arms have not run yet are named as missing."""
    key = ("sampled", "pass@1")
    if not all(k in res for k in (("grpo_gamma", "grpo", *key), ("gtpo_gamma0", "grpo", *key))):
        return "**Not finished:** GRPO + gamma and GTPO with gamma 0 have fewer than 3 paired seeds.\n"

    def d(a, b, m=key):
        if (a, b, *m) not in res:
            return "not run yet"
        c = res[(a, b, *m)]
        return (f"{100 * c['mean']:+.2f} points on {len(c['seeds'])} seeds (p = {fmt_p(c['wilcoxon']['p'])}, "
                f"MDD {100 * c['mdd']:.1f})")

    g, r = res[("grpo_gamma", "grpo", *key)], res[("gtpo_gamma0", "grpo", *key)]
    rule = claim7b.attribution(g["wilcoxon"]["p"], g["mean"], r["wilcoxon"]["p"], r["mean"])
    tg = res[("gtpo", "grpo", *key)]
    replic = ("is significant" if tg["wilcoxon"]["p"] < claim7b.ALPHA and tg["mean"] > 0 else
              f"does not reach the threshold {claim7b.ALPHA:.4f} either")
    text = (f"**Verdict (the declared rule): {rule}.** On sampled held-out pass@1 at {claim7b.LR:g}, official GTPO "
            f"minus GRPO {d('gtpo', 'grpo')}: at this one rate the gain {replic}. GRPO + gamma minus GRPO "
            f"{d('grpo_gamma', 'grpo')}; GTPO with gamma 0 minus GRPO {d('gtpo_gamma0', 'grpo')}; GRPO + conflict masks "
            f"minus GRPO {d('grpo_masks', 'grpo')}. GTPO over GRPO + gamma {d('gtpo', 'grpo_gamma')}, over GRPO + masks "
            f"{d('gtpo', 'grpo_masks')}, over its own gamma-0 version {d('gtpo', 'gtpo_gamma0')}.")
    gk = ("greedy", "pass@1")
    if ("gtpo", "grpo", *gk) in res:
        text += (f" Greedy pass@1 (secondary): GTPO minus GRPO {d('gtpo', 'grpo', gk)}, GRPO + gamma minus GRPO "
                 f"{d('grpo_gamma', 'grpo', gk)}, GTPO gamma 0 minus GRPO {d('gtpo_gamma0', 'grpo', gk)}.")
    if "entropy_rho" in res:
        text += (f" Final entropy and sampled pass@1 across the final runs: ρ = {res['entropy_rho']['rho']:+.2f} "
                 f"(p = {fmt_p(res['entropy_rho']['p'])}).")
    text += (f" Every arm ran at one rate ({claim7b.LR:g}); the tuning that "
             "would bracket each arm's own optimum was not run, so an arm whose optimum lies elsewhere is compared off it.")
    return text + "\n"
