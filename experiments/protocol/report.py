"""docs/results.md from the committed raw data (experiments/data/*.jsonl.gz): no training.

    python -m experiments.protocol.report            # rewrites docs/results.md and docs/results/protocol/*.png

Every number in the file is computed here from the data files; the verdict paragraphs are the
human reading of those numbers and live in :data:`VERDICTS` (edit them when the data change).
"""

from __future__ import annotations

import math
import os
import re
import statistics
import sys
from collections import Counter, defaultdict

from . import stats
from .common import DATA, ROOT, read_jsonl_gz

DOCS_MD = os.path.join(ROOT, "docs", "results.md")
FIG_DIR = os.path.join(ROOT, "docs", "results", "protocol")


def fmt_p(p: float) -> str:
    if p != p:
        return "n/a"
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def mean_sd(xs) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "—"
    if len(xs) == 1:
        return f"{xs[0]:.3g}"
    return f"{statistics.mean(xs):.3g} ± {statistics.stdev(xs):.2g}"


def table(header, rows) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


# ------------------------------------------------------------------ figures
def _figure(ncols: int = 1, nrows: int = 1, w: float = 5.0, h: float = 3.4):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w * ncols, h * nrows))
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def _save(fig, name: str) -> str:
    os.makedirs(FIG_DIR, exist_ok=True)
    path = os.path.join(FIG_DIR, name)
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=110)
    os.replace(path + ".tmp.png", path)
    return os.path.relpath(path, os.path.dirname(DOCS_MD))


# ------------------------------------------------------------------ SmolLM2 default task
LAST_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")

SMOL_LABELS = {"gtpo_v0": "GTPO, default at 57a59c7 (gamma on all groups)",
               "gtpo_varying": "GTPO, gamma only on groups with reward variance",
               "gtpo_gamma0": "GTPO, gamma 0", "grpo": "GRPO", "dr_grpo": "Dr.GRPO",
               "gtpo_fixed07": "GTPO, fixed tau 0.7 filter"}


def smol_run_stats(rec: dict, before: float) -> dict:
    texts = rec["eval_after"]["texts"]
    lasts = []
    for t in texts:
        nums = LAST_NUMBER.findall(t)
        lasts.append(nums[-1] if nums else None)
    mode, mode_n = Counter(lasts).most_common(1)[0]
    acc = rec["eval_after"]["accuracy"]
    steps = rec["steps"]
    last = steps[-5:] if steps else []
    return {
        "seed": rec["seed"], "after": acc, "gain": acc - before,
        "mode_answer": mode, "mode_frac": mode_n / len(texts),
        "collapsed": acc < before or mode_n / len(texts) > 0.5,
        "reward_last5": statistics.mean(s["reward/mean"] for s in last) if last else float("nan"),
        "entropy_first": steps[0]["entropy/mean"] if steps else float("nan"),
        "entropy_last5": statistics.mean(s["entropy/mean"] for s in last) if last else float("nan"),
        "length_last5": statistics.mean(s["completion_length/mean"] for s in last) if last else float("nan"),
        "trunc_last5": statistics.mean(s["truncated_frac"] for s in last) if last else float("nan"),
        "kl_mean": statistics.mean(s["kl/new_old"] for s in steps) if steps and "kl/new_old" in steps[0] else float("nan"),
        "norm_mean": statistics.mean(s["update_norm"] for s in steps) if steps and "update_norm" in steps[0] else float("nan"),
        "zero_var": statistics.mean(s["frac_zero_std_groups"] for s in steps) if steps else float("nan"),
        "filtered": statistics.mean(s.get("gtpo/filtered_frac", 0.0) for s in steps) if steps else float("nan"),
        "wall_min": rec["timing"]["wall_s"] / 60 if rec.get("timing") else float("nan"),
        "cpu_min": rec["timing"]["cpu_s"] / 60 if rec.get("timing") else float("nan"),
        "step_s": statistics.mean(s["step_time_s"] for s in steps) if steps else float("nan"),
        "correct": rec["eval_after"]["correct"],
    }


def load_smol():
    path = os.path.join(DATA, "smol.jsonl.gz")
    if not os.path.isfile(path):
        return None, {}
    recs = read_jsonl_gz(path)
    before = next(r for r in recs if r["kind"] == "before")
    runs = defaultdict(dict)
    for r in recs:
        if r["kind"] == "run":
            runs[r["arm"]][r["seed"]] = r
    return before, runs


# ------------------------------------------------------------------ claim 1: one-step updates
ONESTEP_ARMS = ("grpo", "dr_grpo", "grpo_masks", "gtpo_paper", "gtpo_official")
ONESTEP_LABELS = {"grpo": "GRPO", "dr_grpo": "Dr.GRPO", "grpo_masks": "GRPO + conflict masks",
                  "gtpo_paper": "GTPO (paper preset)", "gtpo_official": "GTPO (official preset)"}


def load_onestep() -> dict[str, list[dict]]:
    d = os.path.join(DATA, "onestep")
    out = {}
    if os.path.isdir(d):
        for name in sorted(os.listdir(d)):
            if name.endswith(".jsonl.gz"):
                out[name[:-len(".jsonl.gz")]] = read_jsonl_gz(os.path.join(d, name))
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


# ------------------------------------------------------------------ claim 2: stress
def load_stress():
    path = os.path.join(DATA, "stress.jsonl.gz")
    if not os.path.isfile(path):
        return None, []
    recs = read_jsonl_gz(path)
    start = next((r for r in recs if r["kind"] == "start"), None)
    return start, [r for r in recs if r["kind"] == "run"]


def stress_outcomes(runs: list[dict]) -> list[dict]:
    from .stress import collapse_step

    out = []
    for r in runs:
        rewards = [s["reward/mean"] for s in r["steps"]]
        ent = [s["entropy/mean"] for s in r["steps"]]
        t = collapse_step(rewards)
        stopped = bool(r["summary"].get("stopped"))
        n = len(rewards)
        if stopped and t is None:  # a run stopped by non-finite updates counts as collapsed where it stopped
            t = n
        e0 = statistics.mean(ent[:5]) if len(ent) >= 5 else float("nan")
        emax = max(statistics.mean(ent[i:i + 5]) for i in range(0, max(1, n - 4))) if n >= 5 else float("nan")
        out.append({"arm": r["arm"], "lr": r["lr_factor"], "seed": r["seed"], "collapsed": t is not None,
                    "time": t if t is not None else n, "steps": n,
                    "entropy_ratio": emax / e0 if e0 else float("nan"),
                    "kl": statistics.mean(s.get("kl/new_old", float("nan")) for s in r["steps"][:10]),
                    "norm": statistics.mean(s.get("update_norm", float("nan")) for s in r["steps"][:10]),
                    "reward_last": statistics.mean(rewards[-5:]), "reward_first": statistics.mean(rewards[:5])})
    return out


def critical_lr(outcomes: list[dict], arm: str, lrs: list[float]) -> float | None:
    """Where the collapse fraction first reaches 1/2, log-linearly interpolated between grid rates;
    below the grid: the lowest rate (a bound), never: None (above the grid)."""
    fr = []
    for f in lrs:
        xs = [o["collapsed"] for o in outcomes if o["arm"] == arm and o["lr"] == f]
        fr.append(sum(xs) / len(xs) if xs else None)
    prev = None
    for f, q in zip(lrs, fr):
        if q is None:
            continue
        if q >= 0.5:
            if prev is None:
                return f
            f0, q0 = prev
            w = (0.5 - q0) / (q - q0) if q != q0 else 0.0
            return math.exp(math.log(f0) + w * (math.log(f) - math.log(f0)))
        prev = (f, q)
    return None


def critical_lr_ci(outcomes: list[dict], arm: str, lrs: list[float], n_boot: int = 2000, seed: int = 0):
    """Bootstrap over seeds within each learning rate (percentile 95 % interval; None = above the grid,
    counted as +inf)."""
    import random as _r

    rng = _r.Random(seed)
    by_lr = {f: [o for o in outcomes if o["arm"] == arm and o["lr"] == f] for f in lrs}
    vals = []
    for _ in range(n_boot):
        res = [o for f in lrs for o in (rng.choice(by_lr[f]) for _ in by_lr[f])] if all(by_lr.values()) else []
        c = critical_lr(res, arm, lrs) if res else None
        vals.append(math.inf if c is None else c)
    vals.sort()
    return vals[int(0.025 * (len(vals) - 1))], vals[int(math.ceil(0.975 * (len(vals) - 1)))]


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
                cp = [r["arms"][key]["common_prefix"] for r in zero if key in r["arms"] and r["arms"][key]["common_prefix"] is not None]
                if xs and any(x != 0 for x in xs):
                    w = stats.wilcoxon_signed_rank(xs)
                    zrows.append([ONESTEP_LABELS[arm], len(xs), f"{statistics.median(xs):+.2e}",
                                  f"z = {w['z']:+.1f}, p = {fmt_p(w['p'])}",
                                  f"{statistics.median(cp):+.2e} ({len(cp)} groups)" if cp else "—"])
                    results[(name, "zero", arm)] = {"n": len(xs), "median": statistics.median(xs), "w0": w}
            if zrows:
                out.append("*Zero-variance groups (every reward equal), AdamW step: only the gamma shift acts.*\n")
                out.append(table(["arm", "groups", "median Δ log p per completion (sum)", "Wilcoxon vs 0",
                                  "median Δ on the tokens all G completions share"], zrows) + "\n")
    return "\n".join(out), results


def smol_section(default_arm: str, baseline_arms=("grpo", "dr_grpo")) -> tuple[str, dict]:
    before, runs = load_smol()
    if before is None:
        return "(no data)\n", {}
    b = before["accuracy"]
    out, res = [], {}
    stats_by_arm = {arm: {s: smol_run_stats(r, b) for s, r in sorted(seeds.items())} for arm, seeds in runs.items()}
    res["before"] = b
    res["stats"] = stats_by_arm
    # every run, every seed
    rows = []
    order = [default_arm, *baseline_arms] + [a for a in SMOL_LABELS if a not in (default_arm, *baseline_arms)]
    for arm in order:
        for seed, st in stats_by_arm.get(arm, {}).items():
            rows.append([SMOL_LABELS.get(arm, arm) + (" **(default)**" if arm == default_arm else ""), seed,
                         pct(b), pct(st["after"]), f"{100 * st['gain']:+.1f}",
                         "yes" if st["collapsed"] else "no", f"{100 * st['mode_frac']:.0f} % ('{st['mode_answer']}')",
                         f"{st['length_last5']:.1f}", f"{st['entropy_first']:.2f} → {st['entropy_last5']:.2f}",
                         f"{st['kl_mean']:.3f}", f"{st['wall_min']:.0f} / {st['cpu_min']:.0f}"])
    out.append(table(["arm", "seed", "before %", "after %", "gain (points)", "collapsed", "most common final number",
                      "length, last 5 steps", "entropy, step 1 → last 5", "KL(π_new‖π_old) per step", "wall / CPU min"],
                     rows) + "\n")
    # per-arm summary and tests against the default on shared seeds
    srows = []
    for arm in order:
        sts = stats_by_arm.get(arm)
        if not sts:
            continue
        gains = [s["gain"] for s in sts.values()]
        srows.append([SMOL_LABELS.get(arm, arm), len(sts), f"{100 * statistics.mean(s['after'] for s in sts.values()):.1f}",
                      f"{100 * statistics.stdev(gains):.1f}" if len(gains) > 1 else "—",
                      f"{100 * min(gains):+.1f}", sum(s["collapsed"] for s in sts.values()),
                      sum(g >= 0.10 for g in gains)])
    out.append(table(["arm", "seeds", "mean after %", "sd of gain", "worst gain", "collapsed", "seeds gaining ≥ 10 points"],
                     srows) + "\n")
    comp = []
    d = stats_by_arm.get(default_arm, {})
    for arm in order:
        if arm == default_arm or arm not in stats_by_arm:
            continue
        shared = sorted(set(d) & set(stats_by_arm[arm]))
        if len(shared) < 2:
            continue
        diffs = [d[s]["after"] - stats_by_arm[arm][s]["after"] for s in shared]
        w = stats.wilcoxon_signed_rank(diffs)
        t = stats.paired_t(diffs)
        bb = cc = 0  # McNemar over (seed, problem) pairs: default right / other wrong, and the reverse
        for s in shared:
            for x, y in zip(d[s]["correct"], stats_by_arm[arm][s]["correct"]):
                bb += x and not y
                cc += y and not x
        mdd = stats.mdd_paired(t["sd"], len(shared)) if t["sd"] == t["sd"] and len(shared) > 2 else float("nan")
        comp.append([f"{SMOL_LABELS.get(default_arm)} − {SMOL_LABELS.get(arm, arm)}", ", ".join(map(str, shared)),
                     f"{100 * statistics.mean(diffs):+.1f}", f"W+ = {w['w_plus']:.0f}, p = {fmt_p(w['p'])} (exact)",
                     f"t = {t['t']:.2f}, p = {fmt_p(t['p'])}", f"{100 * mdd:.0f}",
                     f"{bb} vs {cc}, p = {fmt_p(stats.mcnemar_exact(bb, cc))}"])
        res[("vs", arm)] = {"diffs": diffs, "wilcoxon": w, "t": t, "mdd": mdd, "mcnemar": (bb, cc)}
    if comp:
        out.append(table(["difference of final accuracy (points)", "paired seeds", "mean", "Wilcoxon signed-rank",
                          "paired t", "MDD (80 % power, points)", "problems right only under one (McNemar, all seeds pooled)"],
                         comp) + "\n")
    return "\n".join(out), res
