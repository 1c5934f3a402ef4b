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
from .smol import ARM_THREADS, ARMS, DEFAULT_ARM, same_settings
from .stress import REPLICATES, collapse_step

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

SMOL_LABELS = {"gtpo_v0": "GTPO at lr 5e-4 (the default until 2026-12-01)",
               "gtpo_varying": "GTPO, gamma only on groups with reward variance",
               "gtpo_gamma0": "GTPO, gamma 0", "grpo": "GRPO (lr 5e-4)", "dr_grpo": "Dr.GRPO",
               "gtpo_fixed07": "GTPO, fixed tau 0.7 filter",
               "gtpo_nodiv": "GTPO, no division by the conflict count",
               "gtpo_nodiv_varying": "GTPO, no division by the conflict count, gamma only on varying groups",
               "gtpo_lr3e-4": "GTPO at lr 3e-4 (the default until 2026-12-02)",
               "gtpo_lr3e-4_varying": "GTPO at lr 3e-4, gamma only on varying groups",
               "grpo_lr3e-4": "GRPO at lr 3e-4", "dr_grpo_lr3e-4": "Dr.GRPO at lr 3e-4",
               "gtpo_fixed07_lr3e-4": "GTPO at lr 3e-4, fixed tau 0.7 filter",
               "gtpo_lr3e-4_2threads": "GTPO at lr 3e-4, two threads (as `scripts/demo.sh` runs it)",
               "gtpo_lr2e-4_40": "GTPO at lr 2e-4, 40 steps",
               "gtpo_lr2e-4_40_2threads": "GTPO at lr 2e-4, 40 steps, two threads (as `scripts/demo.sh` runs it)",
               "grpo_lr2e-4_40_2threads": "GRPO at lr 2e-4, 40 steps, two threads"}


#: the defaults before the present one (`smol.DEFAULT_ARM`), each compared with the arms run for as many steps
SMOL_PREVIOUS_DEFAULTS = ("gtpo_lr3e-4",)


def _arm_steps(arm: str) -> str | None:
    """The ``--max_steps`` an arm of `smol.ARMS` sets (None if it does not set one)."""
    argv = ARMS.get(arm, [])
    return argv[argv.index("--max_steps") + 1] if "--max_steps" in argv else None


#: arms whose training curves are drawn next to the default's (and its other-thread-count twins)
SMOL_CURVE_ARMS = ("grpo_lr2e-4_40_2threads", "gtpo_lr3e-4", "gtpo_lr3e-4_2threads", "grpo_lr3e-4")


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


# ------------------------------------------------------------------ claim 2: stress
def load_start_and_runs(name: str, kinds: tuple[str, ...]) -> tuple[dict | None, list[dict]]:
    """(the ``start`` record, the records of ``kinds``) of ``experiments/data/<name>``; (None, []) if absent."""
    path = os.path.join(DATA, name)
    if not os.path.isfile(path):
        return None, []
    recs = read_jsonl_gz(path)
    start = next((r for r in recs if r["kind"] == "start"), None)
    return start, [r for r in recs if r["kind"] in kinds]


#: the stress replicates (one stress model each; ``stress.REPLICATES``) and their data files, never pooled
STRESS_FILES = {k: os.path.relpath(r.data, DATA) for k, r in REPLICATES.items()}


def load_stress(replicate: str = "a"):
    return load_start_and_runs(STRESS_FILES[replicate], ("run",))


def stress_outcomes(runs: list[dict]) -> list[dict]:
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


def _boot_critical(outcomes: list[dict], arm: str, lrs: list[float], rng) -> float:
    """One bootstrap draw of an arm's critical rate: seeds resampled with replacement within each learning
    rate; +inf where the resample never reaches 1/2 (above the grid)."""
    by_lr = {f: [o for o in outcomes if o["arm"] == arm and o["lr"] == f] for f in lrs}
    if not all(by_lr.values()):
        return math.inf
    res = [o for f in lrs for o in (rng.choice(by_lr[f]) for _ in by_lr[f])]
    c = critical_lr(res, arm, lrs)
    return math.inf if c is None else c


def _percentiles(vals: list[float]) -> tuple[float, float]:
    vals = sorted(vals)
    return vals[int(0.025 * (len(vals) - 1))], vals[int(math.ceil(0.975 * (len(vals) - 1)))]


def critical_lr_ci(outcomes: list[dict], arm: str, lrs: list[float], n_boot: int = 2000, seed: int = 0):
    """Bootstrap over seeds within each learning rate (percentile 95 % interval; None = above the grid,
    counted as +inf)."""
    import random as _r

    rng = _r.Random(seed)
    return _percentiles([_boot_critical(outcomes, arm, lrs, rng) for _ in range(n_boot)])


def critical_ratio_ci(outcomes: list[dict], arm: str, ref: str, lrs: list[float], n_boot: int = 2000, seed: int = 0):
    """95 % percentile bootstrap interval of critical(arm) / critical(ref), the two arms resampled
    independently (seeds within each rate); an interval that excludes 1 says the arm moves the rate at
    which runs start to collapse. +inf where the arm's resample never reaches 1/2, 0 where only ref's does not."""
    import random as _r

    rng = _r.Random(seed)
    vals = []
    for _ in range(n_boot):
        a, r = _boot_critical(outcomes, arm, lrs, rng), _boot_critical(outcomes, ref, lrs, rng)
        vals.append(1.0 if a == r == math.inf else (math.inf if a == math.inf else (0.0 if r == math.inf else a / r)))
    return _percentiles(vals)


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


def smol_section(default_arm: str, baseline_arms=("grpo_lr2e-4_40_2threads", "gtpo_lr2e-4_40",
                                                  "gtpo_lr3e-4_2threads", "gtpo_lr3e-4", "grpo_lr3e-4",
                                                  "dr_grpo_lr3e-4", "grpo", "gtpo_v0", "dr_grpo")) -> tuple[str, dict]:
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
    order += [a for a in stats_by_arm if a not in order]
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
    # the default against every other arm; each of its other-thread-count twins against the arms of
    # SMOL_CURVE_ARMS run with that thread count; each previous default against the arms run for as many steps
    pairs = [(default_arm, arm) for arm in order if arm != default_arm]
    pairs += [(twin, arm) for twin in same_settings(default_arm) for arm in SMOL_CURVE_ARMS
              if arm != twin and ARM_THREADS.get(arm) == ARM_THREADS.get(twin)]
    pairs += [(prev, arm) for prev in SMOL_PREVIOUS_DEFAULTS if prev != default_arm for arm in order
              if arm != prev and _arm_steps(arm) == _arm_steps(prev)]
    comp = []
    for a, arm in pairs:
        row = _smol_comparison(stats_by_arm.get(a, {}), stats_by_arm.get(arm, {}))
        if row is None:
            continue
        comp.append([f"{SMOL_LABELS.get(a, a)} − {SMOL_LABELS.get(arm, arm)}", *row["cells"]])
        res[("vs", arm) if a == default_arm else ("vs", a, arm)] = row["res"]
    if comp:
        out.append(table(["difference of final accuracy (points)", "paired seeds", "mean", "Wilcoxon signed-rank",
                          "paired t", "MDD (80 % power, points)", "problems right only under one (McNemar, all seeds pooled)"],
                         comp) + "\n")
    return "\n".join(out), res


def _smol_comparison(d: dict, o: dict) -> dict | None:
    """Final accuracy of arm ``d`` minus arm ``o`` on their shared seeds (per-seed stats of `smol_run_stats`):
    Wilcoxon signed-rank, paired t, the MDD and McNemar's count over (seed, problem); None under 2 seeds."""
    shared = sorted(set(d) & set(o))
    if len(shared) < 2:
        return None
    diffs = [d[s]["after"] - o[s]["after"] for s in shared]
    w = stats.wilcoxon_signed_rank(diffs)
    t = stats.paired_t(diffs)
    bb = cc = 0  # McNemar over (seed, problem) pairs: d right / o wrong, and the reverse
    for s in shared:
        for x, y in zip(d[s]["correct"], o[s]["correct"]):
            bb += x and not y
            cc += y and not x
    mdd = stats.mdd_paired(t["sd"], len(shared)) if t["sd"] == t["sd"] and len(shared) > 2 else float("nan")
    cells = [", ".join(map(str, shared)), f"{100 * statistics.mean(diffs):+.1f}",
             f"W+ = {w['w_plus']:.0f}, p = {fmt_p(w['p'])} (exact)", f"t = {t['t']:.2f}, p = {fmt_p(t['p'])}",
             f"{100 * mdd:.0f}", f"{bb} vs {cc}, p = {fmt_p(stats.mcnemar_exact(bb, cc))}"]
    return {"cells": cells, "res": {"diffs": diffs, "wilcoxon": w, "t": t, "mdd": mdd, "mcnemar": (bb, cc)}}


STRESS_LABELS = {"grpo": "GRPO", "grpo_masks": "GRPO + conflict masks", "grpo_filter_gamma": "GRPO + filter + gamma",
                 "gtpo_paper": "GTPO (paper preset)", "gtpo_official": "GTPO (official preset)",
                 "gtpo_gamma0": "GTPO, gamma 0", "gtpo_varying": "GTPO, gamma only on varying groups",
                 "pos_only": "positive completions only (GRPO)", "neg_only": "negative completions only (GRPO)"}


def _logrank_row(both: list[dict], arm: str, rates: list[float], res: dict) -> list[str]:
    """One row of the arm-vs-GRPO table: collapses, the log-rank test stratified by rate over `rates`,
    and Fisher's exact test on the pooled collapse counts; the test is stored in res[("logrank", arm, rates)]."""
    lr_res = stats.logrank([o["time"] for o in both], [int(o["collapsed"]) for o in both],
                           [o["arm"] for o in both], strata=[o["lr"] for o in both])
    i = lr_res["groups"].index(arm)
    obs, exp = lr_res["observed"][i], lr_res["expected"][i]
    ca = sum(o["collapsed"] for o in both if o["arm"] == arm)
    cg = sum(o["collapsed"] for o in both if o["arm"] == "grpo")
    na = sum(1 for o in both if o["arm"] == arm)
    ng = sum(1 for o in both if o["arm"] == "grpo")
    res[("logrank", arm, tuple(rates))] = lr_res
    return [f"{STRESS_LABELS[arm]} vs GRPO", ", ".join(f"x{f:g}" for f in rates),
            f"{ca}/{na} vs {cg}/{ng}", f"{obs:.0f} observed, {exp:.1f} expected",
            f"χ² = {lr_res['chi2']:.2f}, p = {fmt_p(lr_res['p'])}",
            f"p = {fmt_p(stats.fisher_exact(ca, na - ca, cg, ng - cg))}"]


def stress_section(replicate: str = "a") -> tuple[str, dict]:
    start, runs = load_stress(replicate)
    if not runs:
        return "(no data)\n", {}
    outc = stress_outcomes(runs)
    arms = [a for a in STRESS_LABELS if any(o["arm"] == a for o in outc)]
    lrs = sorted({o["lr"] for o in outc})
    out, res = [], {"outcomes": outc}
    if start:
        out.append(f"*The stress model at the start (SFT {start['sft']['max_steps']} steps at lr {start['sft']['learning_rate']:g}; "
                   f"{start['n_prompts']} training prompts x 8 samples at temperature 1).*\n")
        out.append(table(["prompts", "share of samples %", "systematic error (\"The answer is N.\") %", "paper format ≥ 10 %",
                          "mean paper reward (0-20)", "mean token entropy"],
                         [["error prompts (third operand 7-9)", pct(start["frac_error_prompts"]),
                           pct(start["error_rate_error_prompts"]), pct(start["format_rate_error_prompts"]),
                           f"{start['reward_error_prompts']:.2f}", f"{start['entropy_error_prompts']:.3f}"],
                          ["the other prompts", pct(1 - start["frac_error_prompts"]), pct(start["error_rate_other"]),
                           pct(start["format_rate_other"]), f"{start['reward_other']:.2f}", f"{start['entropy_other']:.3f}"]])
                   + "\n")
    res["design"] = {"arms": arms, "lrs": lrs, "seeds": sorted({o["seed"] for o in outc}), "n": len(outc)}
    rows = []
    # GRPO's critical rate, the reference of the ratio column (only where GRPO ran at >= 3 rates)
    grpo_crit = critical_lr(outc, "grpo", lrs) if len({o["lr"] for o in outc if o["arm"] == "grpo"}) >= 3 else None
    for arm in arms:
        row = [STRESS_LABELS[arm]]
        for f in lrs:
            xs = [o for o in outc if o["arm"] == arm and o["lr"] == f]
            if not xs:
                row.append("—")
                continue
            c = sum(o["collapsed"] for o in xs)
            times = sorted(o["time"] for o in xs if o["collapsed"])
            row.append(f"{c}/{len(xs)}" + (f" (t {statistics.median(times):.0f})" if times else ""))
        full = [o for o in outc if o["arm"] == arm]
        if len({o["lr"] for o in full}) >= 3:
            crit = critical_lr(outc, arm, lrs)
            lo, hi = critical_lr_ci(outc, arm, lrs)
            def f_(x):
                return "> grid" if x is None or x == math.inf else f"x{x:.2g}"
            row.append(f"{f_(crit)} [{f_(lo)}, {f_(hi)}]")
            res[("crit", arm)] = (crit, lo, hi)
            if arm != "grpo" and crit is not None and grpo_crit is not None:
                ratio = crit / grpo_crit
                rlo, rhi = critical_ratio_ci(outc, arm, "grpo", lrs)
                row.append(f"{ratio:.2f} [{rlo:.2f}, {'∞' if rhi == math.inf else f'{rhi:.2f}'}]")
                res[("crit_ratio", arm)] = (ratio, rlo, rhi)
            else:
                row.append("—")
        else:
            row += ["—", "—"]
        rows.append(row)
    out.append(table(["arm"] + [f"lr x{f:g}" for f in lrs] + ["critical lr (95 % bootstrap)",
                                                              "÷ GRPO's (95 % bootstrap)"], rows) + "\n")
    # equal step size: KL per step (first 10 steps) per arm and rate
    krows = []
    for arm in arms:
        row = [STRESS_LABELS[arm]]
        for f in lrs:
            xs = [o for o in outc if o["arm"] == arm and o["lr"] == f]
            row.append(f"{statistics.median(o['kl'] for o in xs):.2e} / {statistics.median(o['norm'] for o in xs):.3f}" if xs else "—")
        krows.append(row)
    out.append("*Step size: median over seeds of the mean KL(π_new‖π_old) per step and of the mean update norm, first 10 steps.*\n")
    out.append(table(["arm"] + [f"lr x{f:g}" for f in lrs], krows) + "\n")
    # log-rank: each arm vs GRPO, stratified by learning rate (rates both ran)
    lr_rows = []
    for arm in arms:
        if arm == "grpo":
            continue
        pair = [o for o in outc if o["arm"] in ("grpo", arm)]
        common = {o["lr"] for o in pair if o["arm"] == arm} & {o["lr"] for o in pair if o["arm"] == "grpo"}
        # all shared rates (stratified), then each shared rate at which some run collapsed on its own
        rate_sets = [sorted(common)] if len(common) > 1 else []
        rate_sets += [[f] for f in sorted(common) if any(o["collapsed"] for o in pair if o["lr"] == f)]
        for rates in rate_sets:
            both = [o for o in pair if o["lr"] in rates]
            lr_rows.append(_logrank_row(both, arm, rates, res))
    out.append(table(["comparison", "rates", "collapsed", "collapses of the arm", "log-rank (stratified by rate)",
                      "Fisher (pooled)"], lr_rows) + "\n")
    # entropy: the paper's mechanism
    erows = []
    for arm in arms:
        row = [STRESS_LABELS[arm]]
        for f in lrs:
            xs = [o for o in outc if o["arm"] == arm and o["lr"] == f]
            ref = [o["entropy_ratio"] for o in outc if o["arm"] == "grpo" and o["lr"] == f]
            cell = f"{statistics.median(o['entropy_ratio'] for o in xs):.2f}" if xs else "—"
            if xs and ref and arm != "grpo":
                mw = stats.mann_whitney([o["entropy_ratio"] for o in xs], ref)
                cell += f" (p {fmt_p(mw['p'])})"
                res[("entropy_mw", arm, f)] = mw
            row.append(cell)
        erows.append(row)
    out.append("*Entropy: median over seeds of the largest 5-step mean token entropy divided by the mean of steps 1-5 "
               "(> 1: entropy rose); in brackets the two-sided Mann-Whitney p against GRPO at the same rate "
               "(uncorrected for the table's many cells).*\n")
    out.append(table(["arm"] + [f"lr x{f:g}" for f in lrs], erows) + "\n")
    return "\n".join(out), res


# ------------------------------------------------------------------ figures of the protocol
def fig_smol(res: dict, default_arm: str, arms: list[str]) -> str | None:
    if not res:
        return None
    _, runs = load_smol()
    fig, axes = _figure(3, 1, w=4.6, h=3.4)
    ax = axes[0][0]
    b = res["before"]
    for i, arm in enumerate(arms):
        sts = res["stats"].get(arm, {})
        xs = [i + (j - 2) * 0.06 for j in range(len(sts))]
        ys = [100 * s["after"] for s in sts.values()]
        ax.scatter(xs, ys, s=18, color=f"C{i}", zorder=3)
        for x, y, s in zip(xs, ys, sts):
            ax.annotate(str(s), (x, y), fontsize=6, xytext=(3, 0), textcoords="offset points")
    ax.axhline(100 * b, color="k", lw=0.8, ls="--", label="before")
    ax.axhline(100 * (b + 0.10), color="grey", lw=0.8, ls=":", label="before + 10 points")
    ax.set_xticks(range(len(arms)))
    ax.set_xticklabels(arms, fontsize=6, rotation=60, ha="right")  # arm names: the legend has the long labels
    ax.set_ylabel("accuracy after, % (200 held-out)", fontsize=8)
    ax.legend(fontsize=7)
    # the curves of every arm would be unreadable: the default, its other-thread-count twins, and the arms
    # of SMOL_CURVE_ARMS (GRPO at the default's settings, the previous default); two-thread runs dashed
    curve_arms = [a for a in dict.fromkeys((default_arm, *same_settings(default_arm), *SMOL_CURVE_ARMS)) if runs.get(a)]
    for k, (key, title) in enumerate((("reward/mean", "training reward (5-step mean, seed mean)"),
                                      ("entropy/mean", "token entropy (seed mean)")), start=1):
        ax = axes[0][k]
        for i, arm in enumerate(curve_arms):
            seeds = runs[arm]
            n = min(len(r["steps"]) for r in seeds.values())
            ys = [statistics.mean(r["steps"][t][key] for r in seeds.values()) for t in range(n)]
            if key == "reward/mean":
                ys = [statistics.mean(ys[max(0, t - 4):t + 1]) for t in range(n)]
            ax.plot(range(1, n + 1), ys, color=f"C{i}", ls="--" if ARM_THREADS.get(arm, 1) > 1 else "-",
                    label=SMOL_LABELS.get(arm, arm), lw=1.2)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
    axes[0][1].legend(fontsize=6)
    return _save(fig, "default_run.png")


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


def fig_stress(res: dict, name: str = "claim2_stress.png") -> str | None:
    outc = res.get("outcomes") if res else None
    if not outc:
        return None
    arms = [a for a in STRESS_LABELS if any(o["arm"] == a for o in outc)]
    lrs = sorted({o["lr"] for o in outc})
    top = lrs[-2:]  # survival curves at the two highest rates, where runs collapse
    fig, axes = _figure(2, 2, w=4.8, h=3.4)
    for i, arm in enumerate(arms):
        for j, f in enumerate(top):
            sel = [o for o in outc if o["arm"] == arm and o["lr"] == f]
            if not sel:
                continue
            n_steps = max(o["steps"] for o in sel)
            surv = [sum(not (o["collapsed"] and o["time"] <= t) for o in sel) / len(sel) for t in range(0, n_steps + 1)]
            axes[1][j].step(range(0, n_steps + 1), surv, where="post", color=f"C{i % 10}", lw=1,
                            label=f"{STRESS_LABELS[arm]} (n={len(sel)})")
            axes[1][j].set_title(f"lr x{f:g}: runs not yet collapsed", fontsize=8)
            axes[1][j].set_xlabel("step")
            axes[1][j].set_ylim(-0.03, 1.03)
            axes[1][j].legend(fontsize=5)
        xs, ys, ks = [], [], []
        for f in lrs:
            sel = [o for o in outc if o["arm"] == arm and o["lr"] == f]
            if sel:
                xs.append(f)
                ys.append(sum(o["collapsed"] for o in sel) / len(sel))
                ks.append(statistics.median(o["kl"] for o in sel))
        style = dict(color=f"C{i % 10}", marker="o", ms=3, lw=1, label=STRESS_LABELS[arm])
        axes[0][0].plot(xs, ys, **style)
        axes[0][1].plot(ks, ys, **style)
    axes[0][0].set_xscale("log")
    axes[0][0].set_xticks(lrs, [f"x{f:g}" for f in lrs])
    axes[0][0].minorticks_off()
    axes[0][0].set_xlabel("learning rate (multiple of the tiny runs' 1e-4)")
    axes[0][1].set_xscale("log")
    axes[0][1].set_xlabel("median KL(π_new‖π_old) per step, first 10 steps")
    for ax in axes[0]:
        ax.set_ylabel("fraction of seeds collapsed")
    axes[0][0].legend(fontsize=6)
    return _save(fig, name)


# ------------------------------------------------------------------ claim 7: accuracy with power
C7_LABELS = {"gtpo": "GTPO (official preset)", "grpo": "GRPO", "dapo": "DAPO", "gtpo_paper": "GTPO (paper preset)",
             "dr_grpo": "Dr.GRPO", "grpo@samelr": "GRPO at GTPO's rate (exploratory)"}


def load_claim7():
    return load_start_and_runs("claim7.jsonl.gz", ("tune", "final", "samelr"))


def claim7_section() -> tuple[str, dict]:
    """Start model, tuning (validation pass@1 per arm x rate), finals (paired seeds) and paired tests against GTPO."""
    start, runs = load_claim7()
    if start is None:
        return "", {}
    out, res = [], {"start": start}
    ho = start["heldout"]
    origin = {"test": "the suite's test problems", "never_seen": "operands in no training data",
              "pretrain_pool": "operands seen only in the first pretraining"}
    out.append("**The start model.** Continued pretraining, validation pass@1 / pass@8 after each chunk: " + "; ".join(
        f"{c['sft_steps']} steps {pct(c['validation']['pass@1'])} / {pct(c['validation']['pass@8'])} %"
        + (" (kept: closest to 25 %)" if c["chunk"] == start["kept_chunk"] else "") for c in start["chunks"])
        + f". On the 500 held-out problems ({', '.join(f'{n}: {origin.get(o, o)}' for o, n in start['heldout_origin'].items())}) "
        f"the kept model starts at pass@1 {pct(ho['pass@1'])} %, pass@8 {pct(ho['pass@8'])} %, maj@8 {pct(ho['maj@8'])} %.\n")
    tune = defaultdict(lambda: defaultdict(dict))
    final = defaultdict(dict)
    for r in runs:
        if r["kind"] == "tune":
            tune[r["arm"]][r["lr"]][r["seed"]] = r
        else:  # final: the arm at its chosen rate; samelr: the arm at another arm's chosen rate (exploratory)
            final[r["arm"] if r["kind"] == "final" else f"{r['arm']}@samelr"][r["seed"]] = r
    arms = [a for a in C7_LABELS if a in tune or a in final] + [a for a in tune if a not in C7_LABELS]
    arms += [a for a in final if a not in arms]
    rows, chosen = [], {}
    res["tune_means"] = {}
    for arm in [a for a in arms if a in tune]:
        means = res["tune_means"].setdefault(arm, {})
        for lr in sorted(tune[arm]):
            seeds = tune[arm][lr]
            vals = [seeds[s]["metrics"]["pass@1"] for s in sorted(seeds)]
            means[lr] = statistics.mean(vals)
            rows.append([C7_LABELS.get(arm, arm), f"{lr:g}", ", ".join(map(str, sorted(seeds))),
                         " / ".join(pct(v) for v in vals), pct(means[lr]),
                         sum(bool(seeds[s].get("stopped")) for s in seeds)])
    for arm in arms:
        if final.get(arm):
            chosen[arm] = next(iter(final[arm].values()))["lr"]
    res["chosen"] = chosen
    if rows:
        out.append("**Tuning** (validation split, 200 problems x 8 samples; the chosen rate is the highest mean "
                   "pass@1):\n")
        out.append(table(["arm", "learning rate", "tuning seeds", "validation pass@1 % per seed", "mean %",
                          "runs stopped (non-finite)"], rows) + "\n")
    frows, per_seed = [], {}
    for arm in arms:
        seeds = final.get(arm)
        if not seeds:
            continue
        per_seed[arm] = {s: seeds[s]["metrics"] for s in sorted(seeds)}
        res.setdefault("final_steps", {})[arm] = [seeds[s]["steps"] for s in sorted(seeds)]
        ms = per_seed[arm]
        frows.append([C7_LABELS.get(arm, arm), f"{chosen[arm]:g}", len(ms),
                      " / ".join(pct(m["pass@1"]) for m in ms.values()),
                      mean_sd([100 * m["pass@1"] for m in ms.values()]),
                      mean_sd([100 * m["pass@8"] for m in ms.values()]),
                      mean_sd([100 * m["maj@8"] for m in ms.values()]),
                      mean_sd([100 * m["format_rate"] for m in ms.values() if "format_rate" in m]),
                      mean_sd([statistics.mean(x["kl/new_old"] for x in seeds[s]["steps"] if "kl/new_old" in x)
                               for s in seeds]),
                      mean_sd([statistics.mean(x["entropy/mean"] for x in seeds[s]["steps"][-15:]) for s in seeds])])
    res["final"] = per_seed
    if frows:
        frows.insert(0, ["start model", "—", "—", "—", pct(ho["pass@1"]), pct(ho["pass@8"]), pct(ho["maj@8"]),
                         pct(ho["format_rate"]) if "format_rate" in ho else "—", "—", "—"])
        out.append(f"**Held-out** (500 problems x 8 samples at temperature 1; answers from the `<answer>` tag):\n")
        out.append(table(["arm", "learning rate", "seeds", "pass@1 % per seed", "pass@1 %", "pass@8 %", "maj@8 %",
                          "format rate %", "KL(π_new‖π_old) per step", "token entropy, last 10 %"], frows) + "\n")
    comp = []
    pairs = [("gtpo", a) for a in arms if a != "gtpo"]  # the official preset against every other arm
    pairs += [("gtpo_paper", a) for a in arms if not a.startswith("gtpo")]  # the paper preset against the baselines
    for ref, arm in pairs:
        if ref in per_seed and arm in per_seed:
            shared = sorted(set(per_seed[ref]) & set(per_seed[arm]))
            if len(shared) < 3:
                continue
            for metric in ("pass@1", "pass@8", "maj@8"):
                diffs = [per_seed[ref][s][metric] - per_seed[arm][s][metric] for s in shared]
                w = stats.wilcoxon_signed_rank(diffs)
                t = stats.paired_t(diffs)
                mdd = stats.mdd_paired(t["sd"], len(shared)) if t["sd"] == t["sd"] else float("nan")
                comp.append([f"{C7_LABELS[ref]} − {C7_LABELS.get(arm, arm)}", metric, len(shared),
                             f"{100 * statistics.mean(diffs):+.2f}",
                             f"W+ = {w['w_plus']:.0f}, p = {fmt_p(w['p'])}", f"t = {t['t']:.2f}, p = {fmt_p(t['p'])}",
                             f"{100 * mdd:.2f}"])
                res[(ref, "vs", arm, metric)] = {"diffs": diffs, "wilcoxon": w, "t": t, "mdd": mdd}
    if comp:
        out.append(table(["difference (points)", "metric", "paired seeds", "mean", "Wilcoxon signed-rank", "paired t",
                          "MDD (80 % power, points)"], comp) + "\n")
    cpu = [r["timing"]["cpu_s"] for r in runs if r.get("timing")]
    res["n_runs"], res["cpu_min"] = len(runs), sum(cpu) / 60
    ev_cpu = [r["eval_timing"]["cpu_s"] for r in runs if r.get("eval_timing")]
    out.append(f"{len(runs)} runs of {max(len(r['steps']) for r in runs)} steps, {sum(cpu) / 60:.0f} CPU-minutes of "
               f"training (median {statistics.median(cpu):.0f} s per run, one thread) and {sum(ev_cpu) / 60:.0f} of "
               f"evaluation in all; the start model took {start['build_cpu_seconds'] / 60:.0f} CPU-minutes.\n")
    return "\n".join(out), res


def fig_claim7(res: dict) -> str | None:
    """Tuning curves (validation pass@1 vs learning rate), and the final runs' mean training accuracy and
    entropy per step, per arm."""
    if not res or not res.get("tune_means"):
        return None
    fig, axes = _figure(3, 1, w=4.2, h=3.3)
    color = {a: f"C{i}" for i, a in enumerate(C7_LABELS)}
    for arm, means in res["tune_means"].items():
        lrs = sorted(means)
        axes[0][0].plot(lrs, [100 * means[lr] for lr in lrs], marker="o", ms=3, lw=1, color=color.get(arm, "k"),
                        label=C7_LABELS.get(arm, arm))
    for arm, runs in res.get("final_steps", {}).items():
        n = min(len(r) for r in runs)
        for ax, key, scale in ((axes[0][1], "reward/paper_accuracy/mean", 100.0), (axes[0][2], "entropy/mean", 1.0)):
            ys = [scale * statistics.mean(r[t].get(key, float("nan")) for r in runs) for t in range(n)]
            k = 10  # moving mean over 10 steps
            sm = [statistics.mean(ys[max(0, t - k + 1):t + 1]) for t in range(n)]
            ax.plot([r["step"] for r in runs[0][:n]], sm, color=color.get(arm, "k"), lw=1,
                    ls="--" if arm.endswith("@samelr") else "-",
                    label=f"{C7_LABELS.get(arm, arm)} (lr {res['chosen'][arm]:g}, n={len(runs)})")
    axes[0][0].set_xscale("log")
    all_lrs = sorted({lr for m in res["tune_means"].values() for lr in m})
    axes[0][0].set_xticks(all_lrs)
    axes[0][0].set_xticklabels([f"{lr:g}" for lr in all_lrs], fontsize=6)
    axes[0][0].minorticks_off()
    axes[0][0].set_xlabel("learning rate")
    axes[0][0].set_ylabel("validation pass@1 % (tuning mean)")
    axes[0][0].legend(fontsize=6)
    axes[0][1].set_xlabel("step")
    axes[0][1].set_ylabel("training accuracy % (10-step mean)")
    axes[0][2].set_xlabel("step")
    axes[0][2].set_ylabel("token entropy (10-step mean)")
    axes[0][1].legend(fontsize=6)
    return _save(fig, "claim7_accuracy.png")


# ------------------------------------------------------------------ the document
#: the human reading of the numbers (edit when the data change); the tables above them are computed
VERDICTS: dict[str, str] = {
    "claim1_design": (
        "**Design.** From one saved state (weights and AdamW moments) and one sampled group of G = 8, every arm "
        "takes exactly one update through the trainer's own code; the state is restored between arms, so the "
        "arms are paired on the same group. Measured: the change Δ log p of the group's own tokens: on the "
        "conflict-run tokens (the shared opening and ending runs, `gtpo.conflict.conflict_runs`) of the positive "
        "completions, and summed over whole positive completions (< 0: likelihood displacement). Two step rules: "
        "*equal step size* (a plain gradient step of the same parameter norm for every arm, a tenth of GRPO's "
        "Adam step: only the direction differs) and *equal learning rate* (the trainer's AdamW step). Arms: GRPO, "
        "Dr.GRPO, GRPO + conflict masks only (`conflict_masks: true`, nothing else of GTPO), the paper preset and "
        "the official preset. States of the tiny model: its pretrained start and after 50 and 150 GRPO steps "
        "(`grpo150b`: the checkpoint run, whose directory was not kept, rerun in a later session to measure more "
        "groups after 150 steps; its groups sample differently from the first one on, so it is a second state, "
        "reported apart, never pooled with `grpo150`); and "
        "SmolLM2-135M-Instruct at its start on the default run's task (LoRA, temperature 0.7, lr 3e-4; 403 groups "
        "sampled in two independent streams, `--seed 0` and `--seed 1`, one process each at about 0.7 CPU-minutes "
        "per group, stopped when 200 had reward variance; prompts are drawn with replacement, and groups 3-4 of "
        "seed 0 are fresh samples of the prompts of its groups 1-2 because a resumed run restarted the prompt "
        "sequence, a bug since fixed). "
        "Variants: `natural` (the sampled groups: correct and wrong completions of about the same length) and "
        "`short_neg` (each wrong completion replaced by a correct one of the group cut after a random number of "
        "tokens and ended with EOS: wrong completions are a shared prefix then EOS, about half as long, so GRPO's "
        "1/|o| weighting gives the shared prefix a net push Σ A_i/|o_i| < 0). Test: Wilcoxon signed-rank over "
        "groups (normal approximation with tie and zero corrections), against 0 and paired against GRPO. Power: "
        "with 250 groups the test detects a location shift of 0.18 standard deviations at 80 % power "
        "(two-sided α = 0.05; 2.80/√n, Wilcoxon's efficiency 0.955), with SmolLM2's 200 groups 0.20; with the 86 groups that had reward "
        "variance after 150 GRPO steps (of 260 sampled), 0.31 (the rerun `grpo150b`: 200 of 411, 0.20).\n"),
    "claim1": (
        "**The induced premise on the tiny model.** When wrong completions are "
        "shorter than correct ones (`short_neg`), GRPO pushes the shared tokens of the correct completions "
        "down: at the pretrained state in 92 % of groups (equal step size; median −8.5e−3 nats per token, "
        "Wilcoxon p = 1.4e−37) and 95 % at equal learning rate (p = 2.3e−39); after 150 GRPO steps in 85 % "
        "(p = 2.5e−30). Whole correct completions then *lose* likelihood under GRPO (median −0.156 nats per "
        "completion at equal learning rate, 63 % of groups, p = 3.4e−10): likelihood displacement. The conflict "
        "masks alone reverse both: shared tokens of correct completions rise in 91-97 % of groups (p ≤ 3e−33) "
        "and whole correct completions gain (+0.80 nats; paired against GRPO p ≈ 1e−42). Dr.GRPO, which drops "
        "the 1/|o| weighting, roughly halves GRPO's push but keeps it negative (66-79 % of groups; p ≤ 2e−6): the "
        "remaining push comes from the negative completions' own probability mass on the shared prefix. The "
        "paper preset behaves exactly like GRPO + masks on these tokens; the official preset (raw advantages, "
        "division by the conflict count) protects less (shared tokens up in 62-82 % of groups) but always more "
        "than GRPO (paired p ≤ 1e−21 in the `short_neg` states).\n\n"
        "**At SmolLM2's start the premise is reversed, so there is nothing to protect.** On the default task its "
        "correct completions are *shorter* than its wrong ones (28.2 against 34.4 tokens), so GRPO's 1/|o| "
        "weighting pushes the shared tokens of correct completions *up* (equal step size: median +1.7e−2 nats per "
        "token, lowered in only 16 % of the 194 groups with a shared run, p = 1.5e−19; equal learning rate "
        "p = 3.5e−14) and whole correct completions gain likelihood under every arm in 87-100 % of the 200 groups "
        "(p ≤ 5e−25 each): no likelihood displacement to prevent. The conflict masks still raise the shared tokens "
        "further (masks only and the paper preset: higher than GRPO in 96-100 % of groups, p ≤ 3e−28); the "
        "official preset raises them about as much as GRPO (equal step size: higher in 61 % of groups, p = 0.0023; "
        "equal learning rate: p = 0.90) and raises whole correct completions *less* (median +0.48 against +1.00 "
        "nats at equal step size, higher than GRPO in 16 % of groups, p = 1e−24; the paper preset +0.88, "
        "p = 2e−28): its division by the conflict count and raw advantages spend the step elsewhere. "
        "In the 203 zero-variance groups the γ shift is the only gradient; from the fresh optimiser of a run's "
        "start the first AdamW step moves every LoRA weight by about the learning rate, so those groups alone lower "
        "each completion by 4.0 (official) to 5.4 (paper) nats (median; p ≤ 1.4e−34; an upper bound: in a real "
        "step they are averaged with the groups that have signal).\n\n"
        "**At SmolLM2's start with the premise forced (`short_neg`), the mechanism reproduces on the shared tokens, "
        "not as likelihood displacement.** 200 groups with reward variance (210 sampled in two independent "
        "streams). With the wrong completions cut to a shared prefix plus EOS (13.5 against 27.2 tokens), GRPO "
        "lowers the shared tokens of correct completions in 79 % of groups (equal step size: median −1.8e−2 nats "
        "per token, p = 4.0e−21; equal learning rate: 86 %, p = 1.1e−25), and every arm with conflict masks "
        "raises them instead (higher than GRPO in 98-100 % of groups, p ≤ 4e−34). Whole correct completions do "
        "not lose likelihood under GRPO here (equal step size: median +0.06 nats, lower in 42 % of groups, "
        "p = 0.0025 for a gain; equal learning rate: +0.05, p = 0.48), so the displacement seen on the tiny model "
        "is not reproduced at this model; the mask arms raise them by +0.74 to +1.26 nats at equal step size "
        "(p ≤ 9e−30 against GRPO). Unlike on the tiny model, Dr.GRPO removes the push altogether (median "
        "+2.7e−3 nats per token, p = 0.74): at this model it is the 1/|o| weighting alone.\n\n"
        "In the `natural` groups of the tiny task (correct 39.1 tokens, wrong 35.9-38.1) GRPO's net push on the "
        "shared tokens is close to zero (equal step size: median −2e−5, p = 0.37 at the start; −2.2e−4, "
        "p = 0.002 after 50 steps; p = 0.98 after 150; in the rerun `grpo150b` +4.7e−5, p = 0.0037, a slight push "
        "up): the length asymmetry that creates it is absent, which is "
        "why the earlier suite saw nothing to protect. The masks still raise those tokens (p ≤ 2e−12 in every "
        "state), and whole correct completions gain more under every GTPO arm than under GRPO (paired "
        "p ≤ 0.0033 in every state and step rule, except the official preset at the start: p = 0.18 and "
        "0.28, and in `grpo150b` at equal step size: p = 0.08). The step sizes are comparable: at equal parameter norm the KL(π_new‖π_old) on the group's "
        "tokens differs by at most 1.2x between GRPO and the GTPO arms in the natural groups (3.2x in "
        "`short_neg`, where GRPO's update partly cancels itself).\n\n"
        "**The candidate mechanism against GTPO is real.** In zero-variance groups (every reward equal; 67 % "
        "and 51 % of the groups after 150 GRPO steps in the two checkpoint runs) GRPO has no gradient, while "
        "GTPO's γ shift −γ·H_i < 0 lowers every completion: median Δ log p per completion −1.2e−2 to −2.0e−2 "
        "nats under the paper preset and −7.5e−2 to −8.4e−2 under the official preset (raw advantages, so γ·H "
        "is large against 0-1 rewards), against −2e−3 to −1.1e−2 for the momentum-only step every other arm "
        "takes (paired p ≤ 3e−30), on exactly the tokens the "
        "group shares. `gamma_groups: varying` (the shift only in groups with reward variance) removes it; on "
        "SmolLM2 (below) it did not prevent a collapse at lr 5e-4 (1 of 5 seeds) and at lr 3e-4 it was not "
        "needed (0 of 5 collapsed with the shift on every group), so the default keeps the paper's rule.\n"),
    "claim2": (
        "The grid ran on two stress models made by the same build in two sessions (they measure differently, so "
        "they are reported side by side, never pooled).\n\n"
        "**Design (replicate a).** The stress model (`experiments/protocol/stress.py`): the tiny model fine-tuned (600 SFT "
        "steps) so that on prompts whose third operand is 7-9 it ends with \"The answer is N.\" instead of the "
        "answer block (paper reward ≤ 1 instead of 10-20): sampled at temperature 1 it does so on 85.1 % of "
        "those samples (38.5 % of all samples) and on 7.6 % of the others (table below), so on error prompts the "
        "negative completions are the model's most probable ones, the situation the paper's collapse "
        "mechanism needs. 40 GRPO/GTPO steps per run; learning rates x2-x15 of the tiny runs' 1e-4. Collapse "
        "criterion, declared in `stress.collapse_step` before any run: the first step at which the 5-step "
        "moving mean reward falls below half its mean over steps 1-5. A pilot (GRPO and official GTPO, x2-x10, "
        "seeds 0-3) found collapses only at x10, so x15 was added and the seeds went where runs collapse: GRPO "
        "and official GTPO 12 seeds at x10 and x15, 6 below; the other arms 6 seeds at x10 and x15 (γ-on-varying "
        "and the positive-only / negative-only controls at x15 only). 162 runs of 40 steps (about 1 CPU-minute each); update norm and "
        "KL(π_new‖π_old) logged every step.\n\n"
        "**Replicate a: GTPO delays the collapse at x15; it does not prevent it, and no arm moves the rate at "
        "which it starts by a detectable amount.** Collapses look like the paper's: the reward drops to 0 and the "
        "replies degenerate (GRPO x15 seed 0 ends writing \"+ + + = = = ...\"; official GTPO x15 seed 0 "
        "\"-7 -7 -7 ...\") while the token entropy rises 2-3x. No arm collapsed at x2-x6.5 (GRPO and official "
        "GTPO 0/6 each). At x10, where GRPO starts failing, GRPO 6/12 and official GTPO 5/12 collapsed (log-rank "
        "p = 0.62) at the same step size (KL per step in steps 1-10: 0.145 vs 0.142; update norm 0.52 vs "
        "0.51). At x15 GRPO collapsed on 12/12 seeds (median step 10) and official GTPO on 9/12 (median step "
        "18): log-rank χ² = 9.23, p = 0.0024, the one test of the table that survives a Bonferroni correction "
        "for its 18 rows (0.05 / 18 = 0.0028); the counts alone do not differ (Fisher p = 0.22; 12 seeds per "
        "arm detect 12/12 against ≤ 7/12). Stratified over every rate (the pre-declared comparison; x15 added "
        "after the pilot) p = 0.0091. The critical rate moves from x10 [95 % bootstrap x8.7, x11] for GRPO to "
        "x11 [x9, x15] for official GTPO: the intervals overlap. The other arms ran at x10 and x15 only (where "
        "the pilot put the collapses), so their critical rate is not bracketed from below on this replicate "
        "(2-3 of 6 collapsed at x10); the model of these runs could not be rebuilt (a rebuild samples the error "
        "on 11.2 % of the other prompts, not 7.6 %), so the whole grid ran again on the rebuild: replicate b, "
        "below. Every protective arm collapses later than GRPO "
        "at x15 (paper preset p = 0.012, γ = 0 p = 0.039, masks only p = 0.13, filter + γ p = 0.11, γ on varying "
        "groups p = 0.067; 6 seeds each, 5/6 collapsed in each), none of them on fewer seeds detectably. The "
        "controls point at the paper's mechanism: updating on the negative completions only collapses like GRPO "
        "(6/6, median step 10, entropy up 1.90x), on the positive completions only collapses latest (4/6, "
        "log-rank p = 0.0067, entropy up 1.44x); GRPO's entropy rose most (2.38x at x15; GTPO arms 1.37-1.75x). "
        "Caveat on step size at x15: at equal update norm (0.76 vs 0.78) official GTPO's first 10 steps move the "
        "policy less in KL (0.196 vs 0.347), partly because GRPO's first 10 steps already include its collapse "
        "(median step 10).\n"),
    "claim2_b": (
        "**Design (declared in `experiments/protocol/stress.py` before its first run).** The same build (600 SFT steps, "
        "same seeds) rerun in a later session gave a model that writes the systematic error on 85.1 % "
        "of the error-prompt samples, like replicate a, but on 11.2 % of the others (a: 7.6 %). Every arm at "
        "x4.5, x6.5, x10 and x15 with seeds 0-11; x3 (all arms, seeds 0-11) was added while the grid ran, before any x4.5 "
        "result, when this model collapsed at x6.5 already (GRPO 2 of 6 then); 540 runs of 40 steps (median 18 "
        "s wall each, 2.7 CPU-hours in all; two single-thread processes on the 2 cores), same collapse "
        "criterion and analysis.\n\n"
        "**Reading: nothing protective moves the collapse.** At x3 two of the 108 runs collapsed (paper preset "
        "and positive-only, one seed each; GRPO 0 of 12). Critical rates: GRPO x10 [95 % bootstrap x6.5, x11], "
        "official preset x9.4 [x8.4, x11], paper preset x10 [x8.7, x12], masks only x10 [x5.8, x12], filter + γ "
        "x11 [x6.5, x12], γ = 0 x10 [x7.7, x11], γ on varying groups x10 [x8.3, x12]; divided by GRPO's, every "
        "95 % interval contains 1 (official preset 0.94 [0.76, 1.46]; the upper end moves with the bootstrap's "
        "seed, see the verdict above). At x15 every arm collapses on 10-12 of 12 "
        "seeds (GRPO and official GTPO 12/12, median step 10 both; log-rank p = 0.92), so replicate a's delay at "
        "x15 (p = 0.0024) does not replicate. Stratified over all rates no arm differs from GRPO (log-rank p = "
        "0.21-1) except the negative-only control, which collapses earlier (p = 0.021; not significant after "
        "a Bonferroni correction over the 8 stratified comparisons, 0.0063). The closest to a protective effect: "
        "at x6.5 the paper and official presets collapsed on 0 of 12 seeds against GRPO's 3 of 12 (log-rank p = "
        "0.07 each, Fisher p = 0.22), and at x10 both collapse like GRPO (6-7 of 12). At equal learning rate the "
        "update norms are equal (x10: 0.517 vs 0.519) and official GTPO moves the policy further in KL in its "
        "first 10 steps (0.185 vs 0.128). Unlike replicate a, positive-only updates collapse earliest (critical "
        "x6.5, ratio 0.65 [0.45, 1.03]; negative-only x7.5, 0.75 [0.57, 1.15]), so the controls do not single "
        "out the negative updates on both models. What does replicate is the entropy: in all 25 (arm, rate) "
        "cells of the five arms with conflict masks the median entropy rise is below GRPO's (14 of them with "
        "Mann-Whitney p < 0.05, uncorrected; x15: masks only 1.41x, paper 1.23x, official 1.68x, γ = 0 1.30x "
        "against GRPO's 1.98x, p = 0.046, 0.0029, 0.046, 0.0061); the arm with filter + γ and no masks is below "
        "GRPO in 2 of 5 cells (x15: 1.67x, p = 0.67). "
        "What would decide the paper's claim (GRPO collapses where GTPO stays stable) is the paper's scale: see "
        "\"What would need a GPU\".\n"),
    "claim7": (
        "**Design** (`experiments/protocol/claim7.py`, fixed before the final runs; not checkable from git: the "
        "design's commit, 7cfc36e, is 46 minutes older than the results' commit, 23f8683, for about 58 minutes of runs, "
        "and the runs recorded no start times). The tiny task's model starts "
        "too low (sampled accuracy ~3 %), so its pretraining was continued in chunks of 250 steps on the same noisy "
        "targets and the chunk whose validation pass@1 was closest to 25 % was kept. Splits with disjoint operands: "
        "500 held-out problems (200 of the suite's test split, 238 whose operands appear in no training data, 62 "
        "seen only in the first pretraining pool), 200 validation problems for tuning, the suite's 2,000 RL prompts. "
        "Arms: the official and the paper GTPO presets, GRPO and DAPO; Dr.GRPO was added in a later session, after "
        "the other arms' results were known, with the same design, seeds, splits and rate-choice rule, all fixed "
        "before its first run. 150 steps of 2 prompts x 8 completions, everything else from `experiments/configs/tiny.yaml`. "
        "Same tuning budget per arm: 5 learning rates (2.5e-5 to 4e-4) x 3 tuning seeds, scored on the validation "
        "split; then 16 paired final seeds at the arm's best rate, each scored on the 500 held-out problems x 8 "
        "samples. Primary test: GTPO (official preset) minus GRPO in pass@1, paired over seeds (Wilcoxon "
        "signed-rank, exact; paired t); the minimum detectable difference (MDD) is computed from the observed paired "
        "spread. A pilot (60 steps, 3 rates) put the best rate at the grid's edge and showed that a run costs ~20 s, "
        "not the minutes estimated, so the grid, the steps and the seeds were enlarged for every arm before any final "
        "run was read. After GRPO's and GTPO's rates were known, GRPO was also run at GTPO's rate (5e-5) on the same 16 "
        "seeds (exploratory: not declared in advance) to separate the method from the rate.\n\n"
        "**Reading (first design).** At their tuned rates GTPO raises held-out "
        "pass@1 from 26.3 % to 39.5 ± 2.4 % (official preset) and 40.5 ± 3.3 % (paper preset), GRPO to 36.6 ± 1.6 % "
        "DAPO to 37.4 ± 2.9 % and Dr.GRPO to 37.8 ± 2.4 %. Official GTPO minus GRPO: +2.85 points, higher on 12 of the 16 seeds "
        "(Wilcoxon W+ = 111, p = 0.002; t = 4.01, p = 0.0011; MDD 2.1 points), which survives a Bonferroni "
        "correction over the nine pass@1 comparisons of the table (0.05 / 9 = 0.0056); the paper preset minus GRPO "
        "+3.83 (p = 0.00058). Against DAPO the official preset is +2.05 (p = 0.10: no difference shown) and the paper preset "
        "+3.02 (p = 0.0079); against Dr.GRPO the official preset is +1.67 (p = 0.074: no difference shown, MDD 2.5) "
        "and the paper preset +2.64 (p = 0.018, not significant after the correction). At the same rate (5e-5) the official preset's gain "
        "over GRPO shrinks to +1.93 (Wilcoxon p = 0.034), which does not survive that correction; the paper preset's "
        "+2.90 (p = 0.0027) does. There the format rates are equal (94.8-95.1 %), "
        "so the differences are in the answers, not the tags (at GRPO's own rate 2.5e-5 its format rate is 91.0 %, "
        "which accounts for part of the +2.85). pass@8 does not move between arms (GTPO minus GRPO −0.48 points, "
        "p = 0.43, MDD 1.9; every arm 88.5-89.7 % from 80.8 %): the earlier suite's \"GTPO has the lowest pass@8\" is "
        "not seen with power, although GTPO ends with the lowest token entropy (0.058-0.062 against GRPO's "
        "0.067-0.076; Dr.GRPO 0.068). One cost is visible in the tuning table: at 2e-4 "
        "GTPO's accuracy falls much further than GRPO's or DAPO's (official 5.7 %, paper 10.9 %, GRPO 18.2 %, DAPO "
        "17.8 %, Dr.GRPO 13.3 %; 3 seeds each), the opposite of claim 2's direction at the top of this grid. At the same learning "
        "rate the official preset moves the policy as far per step as GRPO (KL 1.7e−4 per step for both at 5e-5), "
        "so the comparison at equal rate is also one at equal step size. Scale caveat: a 1M-parameter model, a "
        "two-step arithmetic task, 150 steps; the paper's models, benchmarks and pass@k at k up to 64 need a GPU "
        "(below).\n"),
    "smol": (
        "Every run that finished, every seed shown (`gtpo train --demo` with the arm's overrides, which name "
        "its learning rate and number of steps: 30, or 40 for the arms `*_lr2e-4_40*`; seeds 0-4). Collapsed: "
        "accuracy after < before, or one final number in more than half of the held-out answers. Runs were made "
        "by `python -m experiments.protocol.smol run ARM SEED` with one thread each, two at a time on the 2 cores, "
        "except the arms ending in `_2threads`: two threads (torch's default here, what `scripts/demo.sh` gets), "
        "one run at a time (wall / CPU minutes in the table).\n\n"
        "**The default run (item 5): GTPO at learning rate 2e-4 over 40 steps (since 2026-12-02).** The previous "
        "default (3e-4 over 30 steps, below) gained only 8 points on seed 0 as `scripts/demo.sh` runs it. The "
        "candidates and the rule were declared before any run (closing note of 2026-12-02): lr 2e-4 over 40 "
        "steps, then lr 3e-4 with `max_grad_norm` 0.5, each on seeds 0-4 with two and with one thread; take "
        "the first whose ten trajectories all gain ≥ 10 points. The first passed, so the second was not run. As the demo runs it (two threads): "
        "**40.0 / 44.0 / 37.5 / 43.5 / 36.0 % on seeds 0-4, gains +31.0 / +35.0 / +28.5 / +34.5 / +27.0 "
        "points, none collapsed** (mean 40.2 %, sd of the gain 3.5 points against 8.9 for the previous default "
        "with two threads), 6-11 min per run. With one thread: 40.0 / 44.0 / 32.5 / 43.5 / 36.0 % (gains ≥ 23.5 points, none "
        "collapsed). Only seed 2 followed another trajectory with one thread (its samples differ from step 5 "
        "on); in seeds 0, 1, 3 and 4 the floating-point differences of the thread count flipped no sampled "
        "token at this step size, so the ten runs are six distinct trajectories (at 3e-4, four of five seeds "
        "had diverged, from steps 2-14). Four of the five end in bare equations "
        "(~10 tokens, '2 + 5 = 7'), seed 1 in a short sentence frame (~30 tokens); each run gets 1-2 of the 43 held-out "
        "subtractions with a negative result right ('6 - 9 = -3'; mostly '49 - 85 = 2' or '= -1'), and 45-55 % of the other 157. Against the previous default as the demo ran it: +7.8 points, paired "
        "by seed, Wilcoxon p = 0.12 (MDD 15 points): what changed is the worst seed (+27.0 against +8.0), "
        "not a mean shown higher at five seeds. **GRPO at the same settings** (two threads: 45.0 / 40.5 / "
        "34.0 / 41.5 / 42.0 %, none collapsed, every gain ≥ 25 points, mean 40.6 %): GTPO minus GRPO −0.4 "
        "points, exact Wilcoxon W+ = 6, p = 0.75, paired t p = 0.86, MDD 8 points at 80 % power: **no "
        "difference shown**; a small enough step gives GRPO the same stability here, and GTPO's protections "
        "move the final accuracy by less than ~8 points if at all. GRPO's runs end in bare equations too (10-12 "
        "tokens) except seeds 1 and 3 (25-31 tokens).\n\n"
        "**The previous default: GTPO at learning rate 3e-4 over 30 steps (2026-12-01 to 12-02).** At the earlier default rate 5e-4, GTPO "
        "collapsed on seed 2 (2.0 %: \"The answer is N.\" with a guessed N to all 200 problems, replies of ~7 tokens, reward ~0 "
        "from step 22; the same seed had collapsed at commit 31fa962 too) and the best-looking variant (no "
        "division by the conflict count, γ only on varying groups) on seed 1 (6.0 %: bare numbers, KL(π_new‖π_old) "
        "0.11 per step against 0.002-0.035 in the runs that did not collapse). Both collapses follow the same "
        "path: the replies shorten to a bare answer with no working, which this model gets wrong. The first "
        "trials had already shown higher rates collapsing earlier (seed 0: 5e-4 → 37 %, 7e-4 → 24 %, "
        "1e-3 → 10.5 %). Two candidates at 3e-4 were first run on the two seeds that had collapsed (1 and 2): "
        "GTPO unchanged (γ on every group) and GTPO with γ only on varying groups; both passed (35.0 / 30.0 % "
        "and 37.5 / 31.0 %), and the unchanged method was taken (one change, the paper's rule) and run on "
        "seeds 0, 3, 4: **41.0 / 35.0 / 30.0 / 45.0 / 25.5 % on seeds 0-4, gains +32.0 / +26.0 / +21.0 / +36.0 / "
        "+16.5 points, none collapsed** (mean 35.3 %, sd of the gain 7.9 points, against 16.7 at 5e-4). The "
        "mean KL(π_new‖π_old) per step is smaller than at 5e-4 on 4 of the 5 seeds (0.002-0.016 against "
        "0.007-0.035), and the entropy still falls (0.73-0.83 → 0.09-0.27 nats).\n\n"
        "**The same settings with two threads, as `scripts/demo.sh` runs them** (arm `gtpo_lr3e-4_2threads`, "
        "added 2026-12-02 after a fresh-clone `scripts/demo.sh`, which leaves torch at one thread per core, "
        "ended at 17.0 % on seed 0): 17.0 / 35.0 / 38.0 / 38.5 / 33.5 % on seeds 0-4 (gains +8.0 / +26.0 / "
        "+29.0 / +29.5 / +24.5 points), none collapsed, 7-9 min per run with the 2 cores to itself. Seed 0 "
        "ends in bare equations (9.4 tokens; a quarter of its answers are '-1'), the path of the 5e-4 "
        "collapses without the collapse. The thread count changes floating-point sums, so these are five more "
        "trajectories of the same settings, not another method (one thread minus two, paired by seed: +2.9 "
        "points, exact Wilcoxon p = 1). Over the ten trajectories none collapsed and 9 of 10 gained ≥ 10 "
        "points: item 5's bar holds on the one-thread runs and misses by 2 points on one two-thread run, so "
        "these settings were not robust to the trajectory noise a user meets, and were replaced (above).\n\n"
        "**Against GRPO at the previous default's settings (item 4).** At the same rate, 3e-4, GRPO (seeds 0-4: 38.0 / 30.5 / 40.0 / 43.0 / 41.5 %, "
        "none collapsed, every gain ≥ 21.5 points) also meets item 5's bar, and ends higher on average: GTPO "
        "minus GRPO at 3e-4, paired by seed, −3.3 points (+3.0, +4.5, −10.0, +2.0, −16.0), exact Wilcoxon "
        "W+ = 6, p = 0.81, paired t p = 0.47; five seeds at this spread detect a 15-point difference at 80 % "
        "power: **no difference shown; the direction favours GRPO.** On this task GTPO's protections buy no "
        "stability that a lower rate does not already give GRPO. GRPO at 5e-4 (31.5 / 35.0 / 36.5 / 16.0 / "
        "28.5 %) never collapsed but missed the bar on seed 3 (+7.0); GTPO at 3e-4 minus it: +5.8 points, "
        "p = 0.62. GRPO's replies end shorter (bare equations, 9.6-12.1 tokens in every seed) than GTPO's "
        "(bare in seeds 0, 1, 3; a sentence frame of ~30 tokens in seeds 2 and 4, the two lowest), consistent "
        "with the conflict masks protecting the shared sentence frame, which here costs tokens without helping "
        "the arithmetic. (The McNemar column pools the 5 x 200 (seed, problem) pairs as if independent; it "
        "measures evaluation noise only and ignores the seed-to-seed variation, so its p-values are not "
        "evidence of a difference between methods.) The new default against the old one (5e-4): +8.5 points, "
        "Wilcoxon p = 0.19: the lower rate removed the collapse; its accuracy gain is not significant at 5 "
        "seeds. \n\n"
        "**Dr.GRPO and the fixed-τ filter (item 4).** Dr.GRPO at 3e-4 (seeds 0-4: 45.0 / 34.5 / 35.5 / 23.0 / 42.5 %, "
        "none collapsed, every gain ≥ 14 points, mean 36.1 %): GTPO minus Dr.GRPO −0.8 points, Wilcoxon p = 0.81, "
        "paired t p = 0.91 (MDD 24 points). The released code's fixed filter τ = 0.7 at the default's rate and "
        "temperature 0.7 *acts*: it drops 10.5-20.9 % of the completions per step on average, per seed (the default's "
        "⟨H⟩_ini rule: 0 %); seeds 0-4: 38.0 / 38.5 / 42.0 / 16.0 / 44.0 %, none collapsed, but seed 3 gains only "
        "+7.0 points (below item 5's bar; it filtered the most, 20.9 %); the default minus it −0.4 points, p = 0.81 "
        "(MDD 31 points). At five seeds and this spread (sd of the gain 7.9-11.3 points) the four arms at lr 3e-4 "
        "(GTPO, GRPO, Dr.GRPO, GTPO with the fixed filter; means 35.3 / 38.6 / 36.1 / 35.7 %) are indistinguishable: "
        "on this task neither the conflict masks, the γ shift nor a filter that fires changes the outcome "
        "detectably; the learning rate does (at 5e-4 GTPO collapsed on 1 of 5 seeds and GRPO missed the bar on one).\n"),
    "gpu": (
        "**The paper-scale pair, ready to run** (issue 32, item 5): Qwen2.5-3B-Instruct on GSM8K, GTPO against GRPO, "
        "3 seeds, with the paper configs (`configs/paper/qwen2.5-3b-gsm8k-{gtpo,grpo}.yaml`: 7,500 steps of 1 prompt x "
        "8 completions of up to 1,500 tokens, QLoRA r = 128 on a 4-bit NF4 base, learning rate 1e-6 with the "
        "released optimiser settings: Adam β1 = β2 = 0.999999, weight decay 0.1, `max_grad_norm` 0.1, cosine "
        "schedule with warm-up 0.005, and the released code's optimizer, bitsandbytes' paged 8-bit AdamW "
        "(`optim: paged_adamw_8bit`), in bf16 (`bf16: true`)), then each adapter and the base model on "
        "the paper's benchmarks at n = 64:\n\n"
        "```bash\n"
        "for s in 0 1 2; do for m in gtpo grpo; do\n"
        "  gtpo train configs/paper/qwen2.5-3b-gsm8k-$m.yaml --seed $s --use_vllm true \\\n"
        "    --output_dir runs/qwen3b-gsm8k-$m-s$s\n"
        "done; done\n"
        "for a in runs/qwen3b-gsm8k-*-s? ''; do for d in gsm8k math500 aime24 aime25 amc23; do  # '': the base model\n"
        "  gtpo eval --model Qwen/Qwen2.5-3B-Instruct ${a:+--adapter $a} --dataset $d --n 64 --k 1,8,16,32,64 \\\n"
        "    --maj-k 4,8,16,32,64 --temperature 1.0 --max-new-tokens 1500 --answer-from tag --backend vllm \\\n"
        "    --out ${a:-runs/qwen3b-base}/eval-$d.json\n"
        "done; done\n"
        "```\n\n"
        "**Expected cost: an estimate, not a measurement** (no GPU was lent to this project's sessions so far; "
        "`python bench/gpu_check.py` measures our trainer's step time on one and should replace this estimate). From "
        "FLOP counts and assumed throughputs on one H100-class GPU: a step generates 8 completions (GSM8K answers "
        "in the paper's format run ~200-400 tokens, the cap 1,500) with colocated vLLM, ~3-15 s depending on the "
        "longest completion at ~100 tokens/s per sequence; forward and backward of the 3B model on ~8 x 600 tokens "
        "with QLoRA and gradient checkpointing, ~1.2e14 FLOP, ~1-2 s at an effective 60-100 TFLOP/s; the LoRA merge "
        "and weight sync to vLLM, ~1-2 s. So ~5-20 s a step, **~10-40 GPU-hours per 7,500-step run, ~60-250 for the "
        "six runs**; the evaluation, ~6,400 samples of up to 1,500 tokens for AIME 24/25 and AMC 23 and ~116,000 "
        "shorter ones for GSM8K test and MATH-500 at n = 64 (~50M tokens at ~10k tokens/s batched), ~1.5 GPU-hours per "
        "model, ~10 for the six adapters and the base model. The Llama-3.1-8B and MATH configs of `configs/paper/` "
        "cost about 2-3x more per step. There are no `-dapo` paper configs; DAPO runs with `loss_type: dapo` on the "
        "GRPO config.\n"),
}


def _docstring_design(module) -> str:
    """The **Design** paragraph of an experiment module's docstring, as markdown (the declaration itself)."""
    doc = module.__doc__
    body = doc[doc.index("**Design"):].split("\n\n    python")[0]
    return body.replace(":data:", "").replace(":func:", "").replace(":mod:", "").replace("``", "`") + "\n"


def claim7b_design() -> str:
    from . import claim7b

    return _docstring_design(claim7b)


def stress_opt_design(which: str = "b") -> str:
    from . import stress_opt, stress_opt_c

    return _docstring_design(stress_opt if which == "b" else stress_opt_c)


def _item5_state(smol_res: dict, default_arm: str) -> str:
    """Item 5's bar on the default's runs: >= 5 seeds, none collapsed, every gain >= 10 points; judged on
    the default arm and on every arm with the same settings under another thread count (`smol.same_settings`)."""
    parts, all_met = [], True
    for arm in (default_arm, *same_settings(default_arm)):
        sts = (smol_res.get("stats") or {}).get(arm, {})
        if not sts:
            if arm == default_arm:
                return "no runs of the default arm"
            continue
        n, coll = len(sts), sum(s["collapsed"] for s in sts.values())
        ok = sum(s["gain"] >= 0.10 for s in sts.values())
        all_met &= n >= 5 and coll == 0 and ok == n
        parts.append(f"`{arm}` ({SMOL_LABELS.get(arm, arm)}) on seeds {', '.join(map(str, sorted(sts)))}: "
                     f"{coll} collapsed, {ok} of {n} gained ≥ 10 points "
                     f"(worst {100 * min(s['gain'] for s in sts.values()):+.1f})")
    return f"{'met' if all_met else 'not met'}: " + "; ".join(parts)


def _stress_design(res: dict, name: str) -> str:
    d = res["design"]
    return (f"{name}: {d['n']} runs, arms {', '.join(d['arms'])}; rates {', '.join(f'x{f:g}' for f in d['lrs'])}; "
            f"seeds {', '.join(map(str, d['seeds']))}")


def _status_rows(onestep: dict, smol_res: dict, stress_res: dict, stress_b_res: dict, c7_res: dict,
                 default_arm: str) -> list[list[str]]:
    n_one = {k: sum(r["varying"] for r in v) for k, v in onestep.items()}
    smol_seeds = {arm: sorted(s) for arm, s in (smol_res.get("stats") or {}).items()}
    return [
        ["1. claim 1, paired one-step updates (≥ 200 groups per state)",
         "; ".join(f"`{k}`: {n} groups with reward variance" for k, n in n_one.items() if k.startswith("tiny-"))
         or "not run", "`experiments/data/onestep/tiny-*.jsonl.gz`"],
        ["1. claim 1 at SmolLM2's start",
         "; ".join(f"`{k}`: {n} groups with reward variance" for k, n in n_one.items() if k.startswith("smol-"))
         or "not run", "`experiments/data/onestep/smol-*.jsonl.gz`" if any(k.startswith("smol-") for k in n_one) else "—"],
        ["2. claim 2, stress model and learning-rate grid",
         "; ".join(_stress_design(r, n) for r, n in ((stress_res, "replicate a"), (stress_b_res, "replicate b")) if r)
         or "not run",
         ", ".join(f"`experiments/data/{STRESS_FILES[k]}`" for k, r in (("a", stress_res), ("b", stress_b_res)) if r)
         or "—"],
        ["3. claim 7, accuracy with power (≥ 8 paired seeds, 500 x 8 samples)",
         (lambda f: "; ".join(f"{C7_LABELS.get(a, a)}: {len(ms)} seeds" for a, ms in f.items()) or "tuning only")(
             c7_res.get("final", {})) if c7_res else "not run",
         "`experiments/data/claim7.jsonl.gz`" if c7_res else "—"],
        ["4. SmolLM2 on the default task, ≥ 5 seeds per arm (GTPO, GRPO, Dr.GRPO, fixed-τ arm)",
         "; ".join(f"{SMOL_LABELS.get(a, a)}: seeds {', '.join(map(str, s))}" for a, s in smol_seeds.items()) or "not run",
         "`experiments/data/smol.jsonl.gz`" if smol_seeds else "—"],
        ["5. the default run chosen from this evidence (5 seeds, none collapsing, each ≥ 10 points)",
         _item5_state(smol_res, default_arm), "`experiments/data/smol.jsonl.gz`" if smol_seeds else "—"],
    ]


def _new_design_rows(c7b_res: dict, opt_res: dict, opt_c_res: dict) -> list[list[str]]:
    """Status rows of the designs declared before their runs (issue 32 items 1 and 2)."""
    from . import claim7b, stress_opt, stress_opt_c
    from .declare import describe

    rows = []
    if c7b_res:
        per = c7b_res["final"]
        rows.append(["claim 7 attribution (issue 32 item 1; declared, checked)",
                     "; ".join(f"{claim7b.LABELS[a]}: {sum(1 for e in per[a].values() if e['own'])} run(s)"
                               for a in claim7b.ARMS if a in per) + f". {describe(c7b_res['check'])}",
                     f"`experiments/data/{os.path.relpath(claim7b.DATA_FILE, DATA)}`"])
    if c7b_res.get("check_c"):
        from . import claim7c

        runs = [e for es in c7b_res["final"].values() for e in es.values() if e["own"]]
        rows.append(["claim 7 attribution continued (issue 32 item 1; declared, checked)",
                     f"branch {c7b_res.get('branch_c')}; {c7b_res['check_c']['n']} runs ({len(runs)} final runs of both "
                     f"designs pooled). {describe(c7b_res['check_c'])}",
                     f"`experiments/data/{os.path.relpath(claim7c.DATA_FILE, DATA)}`"])
    if opt_res:
        n_p, n_m = len(opt_res.get("pilot", [])), len(opt_res.get("main", []))
        rows.append(["claim 2 under the released optimiser (issue 32 item 2; declared, checked)",
                     f"pilot {n_p} runs, main grid {n_m} of {len(stress_opt.ARMS) * stress_opt.N_MAIN * len(stress_opt.MAIN_SEEDS)} "
                     f"runs. {describe(opt_res['check'])}", f"`experiments/data/{os.path.relpath(stress_opt.DATA_FILE, DATA)}`"])
    if opt_res.get("check_c"):
        rows.append(["claim 2 under the released optimiser continued: seeds 6-11 (issue 32 item 2; declared, checked)",
                     f"{opt_res['check_c']['n']} runs (2 of them the reproduction check), pooled above. "
                     f"{describe(opt_res['check_c'])}", f"`experiments/data/{os.path.relpath(stress_opt_c.DATA_FILE, DATA)}`"])
    if opt_c_res:
        n_p, n_m = len(opt_c_res.get("pilot", [])), len(opt_c_res.get("main", []))
        rows.append(["claim 2 under the released optimiser, replicate c (issue 32 item 2; declared, checked)",
                     f"pilot {n_p} runs, main grid {n_m} of {len(stress_opt.ARMS) * stress_opt.N_MAIN * len(stress_opt.MAIN_SEEDS)} "
                     f"runs. {describe(opt_c_res['check'])}",
                     f"`experiments/data/{os.path.relpath(stress_opt_c.DATA_FILE, DATA)}`"])
    return rows


def write_results(default_arm: str = DEFAULT_ARM) -> str:
    onestep = load_onestep()
    one_txt, one_res = onestep_section(onestep)
    smol_txt, smol_res = smol_section(default_arm)
    stress_txt, stress_res = stress_section("a")
    stress_b_txt, stress_b_res = stress_section("b")
    c7_txt, c7_res = claim7_section()
    from . import claim7, report_attribution, report_optimiser, verdicts

    verdicts.check_hand_written()
    c7b_txt, c7b_res = report_attribution.section()
    opt_txt, opt_res = report_optimiser.section("b")
    opt_c_txt, opt_c_res = report_optimiser.section("c")
    if opt_c_res:
        opt_c_res["pooled"] = report_optimiser.pooled(opt_res, opt_c_res)
    v1 = verdicts.claim1(one_res)
    v2 = verdicts.claim2(stress_res, stress_b_res, STRESS_LABELS)
    v7 = verdicts.claim7_first(c7_res, claim7.TUNE_LRS, c7b_res)
    v7b = c7b_res.get("verdict", "")
    v2opt = report_optimiser.claim_verdict(opt_res, opt_c_res)
    status = verdicts.status([("Claim 1", v1), ("Claim 2", v2), ("Claim 2 under the released optimiser", v2opt),
                              ("Claim 7, first design", v7), ("Claim 7, attribution", v7b)],
                             _item5_state(smol_res, default_arm))
    figs = {"onestep": fig_onestep(onestep), "stress": fig_stress(stress_res),
            "stress_b": fig_stress(stress_b_res, "claim2_stress_b.png"), "claim7": fig_claim7(c7_res)}
    if smol_res:
        figs["smol"] = fig_smol(smol_res, default_arm, list(smol_res["stats"]))
    parts = [
        "# Results: the science protocol (issue 16)\n",
        "Generated by `python -m experiments.protocol.report` from the committed raw data in `experiments/data/` "
        "(compressed jsonl: every group's per-arm measurements, every run's per-step metrics and evaluation); "
        "nothing here needs training to regenerate. The earlier suite's results, which could not decide most "
        "claims (see issue 16), are kept in [results-suite.md](results-suite.md).\n",
        "## Where the protocol stands\n",
        table(["protocol item", "state", "raw data"], _status_rows(onestep, smol_res, stress_res, stress_b_res, c7_res, default_arm)
              + _new_design_rows(c7b_res, opt_res, opt_c_res)) + "\n",
        status,
        "## Claim 1: GRPO pushes down tokens shared by positive and negative completions; GTPO protects them\n",
        v1,
        VERDICTS.get("claim1_design", ""),
        VERDICTS.get("claim1", ""),
    ]
    if figs.get("onestep"):
        parts.append(f"![claim 1, one-step updates]({figs['onestep']})\n")
    parts += ["### Tables\n", one_txt,
              "## Claim 2: GRPO collapses where GTPO stays stable\n", v2, VERDICTS.get("claim2", ""),
              stress_txt if stress_res else "",
              f"![claim 2, stress grid]({figs['stress']})\n" if figs.get("stress") else "",
              "### Replicate b: the whole grid on a second stress model\n" if stress_b_res else "",
              VERDICTS.get("claim2_b", "") if stress_b_res else "", stress_b_txt if stress_b_res else "",
              f"![claim 2, stress grid, replicate b]({figs['stress_b']})\n" if figs.get("stress_b") else "",
              "### Under the released optimiser\n" if opt_res else "",
              v2opt if opt_c_res else "",
              "#### The first run: replicate b's model, 6 of 12 seeds\n" if opt_c_res and opt_res else "",
              "\n".join((stress_opt_design("b"), opt_res.get("verdict", ""), opt_txt)) if opt_res else "",
              "#### The continuation's declaration (seeds 6-11)\n" if opt_res.get("check_c") else "",
              stress_opt_design("c") if opt_res.get("check_c") else "",
              "#### The design in full: replicate c\n" if opt_c_res else "",
              "\n".join((stress_opt_design("c"), opt_c_res.get("verdict", ""), opt_c_txt)) if opt_c_res else "",
              "## Claim 7: GTPO reaches higher accuracy\n", v7, VERDICTS.get("claim7", ""), c7_txt,
              f"![claim 7, accuracy]({figs['claim7']})\n" if figs.get("claim7") else "",
              "### Attribution: which part of GTPO carries the gain\n" if c7b_res else "",
              "\n".join((claim7b_design(), v7b, c7b_txt)) if c7b_res else "",
              "## SmolLM2-135M on the default task\n", VERDICTS.get("smol", ""), smol_txt if smol_res else "(no runs yet)\n"]
    if figs.get("smol"):
        parts.append(f"![default task]({figs['smol']})\n")
    parts += ["## What would need a GPU\n", VERDICTS.get("gpu", "")]
    text = "\n".join(p for p in parts if p)
    tmp = DOCS_MD + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, DOCS_MD)
    return DOCS_MD


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--default-arm", default=DEFAULT_ARM, help="the SmolLM2 arm that is `gtpo train --demo`'s default")
    args = p.parse_args(argv)
    print(write_results(args.default_arm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
