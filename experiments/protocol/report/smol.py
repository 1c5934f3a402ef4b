"""docs/results.md's section on SmolLM2-135M on the default task (``experiments.protocol.smol``): every run, per-arm
summaries, paired tests against the default arm, the figure, and item 5's bar on the default's runs."""

from __future__ import annotations

import os
import re
import statistics
from collections import Counter, defaultdict

from .. import stats
from ..common import DATA, read_jsonl_gz
from ..smol import ARM_THREADS, ARMS, same_settings
from .tables import _figure, _save, fmt_p, pct, table

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
                          "paired t", "MDD (80 % power, α = 0.05, points)", "problems right only under one (McNemar, all seeds pooled)"],
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
