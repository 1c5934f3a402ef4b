"""docs/results.md's section on claim 7's first design (``experiments.protocol.claim7.FIRST``): the start model, the
tuning, the held-out finals, paired tests against GTPO, and the figure."""

from __future__ import annotations

import statistics
from collections import defaultdict

from .. import stats
from .tables import _figure, _save, fmt_half, fmt_p, load_start_and_runs, mean_sd, pct, table

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
    n_cmp = sum(1 for ref, arm in pairs if ref in per_seed and arm in per_seed
                and len(set(per_seed[ref]) & set(per_seed[arm])) >= 3)
    alpha = 0.05 / max(1, n_cmp)  # the report's Bonferroni threshold over the pass@1 comparisons
    for ref, arm in pairs:
        if ref in per_seed and arm in per_seed:
            shared = sorted(set(per_seed[ref]) & set(per_seed[arm]))
            if len(shared) < 3:
                continue
            for metric in ("pass@1", "pass@8", "maj@8"):
                diffs = [per_seed[ref][s][metric] - per_seed[arm][s][metric] for s in shared]
                w = stats.wilcoxon_signed_rank(diffs)
                t = stats.paired_t(diffs)
                mdd = stats.mdd_paired(t["sd"], len(shared), alpha=alpha) if t["sd"] == t["sd"] else float("nan")
                comp.append([f"{C7_LABELS[ref]} − {C7_LABELS.get(arm, arm)}", metric, len(shared),
                             f"{100 * statistics.mean(diffs):+.2f}",
                             f"W+ = {fmt_half(w['w_plus'])}, p = {fmt_p(w['p'])}", f"t = {t['t']:.2f}, p = {fmt_p(t['p'])}",
                             f"{100 * mdd:.2f}"])
                res[(ref, "vs", arm, metric)] = {"diffs": diffs, "wilcoxon": w, "t": t, "mdd": mdd}
    if comp:
        out.append(table(["difference (points)", "metric", "paired seeds", "mean", "Wilcoxon signed-rank", "paired t",
                          f"MDD (80 % power, α = {alpha:.4f}, points)"], comp) + "\n")
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
