"""docs/results.md's section on claim 2 (``experiments.protocol.claim2``, its grid): the stress models' start, the collapse
grid per arm and rate, critical learning rates with bootstrap intervals, log-rank tests, entropy, and the figure."""

from __future__ import annotations

import math
import os
import statistics

from .. import stats
from ..common import DATA
from ..claim2 import REPLICATES, collapse_step
from .tables import _figure, _save, fmt_half, fmt_p, load_start_and_runs, pct, table

#: the stress replicates (one stress model each; ``claim2.REPLICATES``) and their data files, never pooled
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
    return _first_half(lrs, fr)


def _first_half(lrs: list[float], fr: list[float | None]) -> float | None:
    """:func:`critical_lr` from the collapse fraction at each rate (None: no runs at that rate)."""
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


def _by_rate(outcomes: list[dict], arm: str, lrs: list[float]) -> list[list[bool]]:
    """An arm's collapse outcomes at each rate of ``lrs`` (the seeds a bootstrap draw resamples)."""
    return [[o["collapsed"] for o in outcomes if o["arm"] == arm and o["lr"] == f] for f in lrs]


def _boot_critical(by_rate: list[list[bool]], lrs: list[float], rng) -> float:
    """One bootstrap draw of an arm's critical rate (``by_rate``: :func:`_by_rate`): seeds resampled with
    replacement within each learning rate; +inf where the resample never reaches 1/2 (above the grid)."""
    if not all(by_rate):
        return math.inf
    c = _first_half(lrs, [sum(rng.choice(xs) for _ in xs) / len(xs) for xs in by_rate])
    return math.inf if c is None else c


def _percentiles(vals: list[float]) -> tuple[float, float]:
    vals = sorted(vals)
    return vals[int(0.025 * (len(vals) - 1))], vals[int(math.ceil(0.975 * (len(vals) - 1)))]


def critical_lr_ci(outcomes: list[dict], arm: str, lrs: list[float], n_boot: int = 2000, seed: int = 0):
    """Bootstrap over seeds within each learning rate (percentile 95 % interval; None = above the grid,
    counted as +inf)."""
    import random as _r

    rng = _r.Random(seed)
    by_rate = _by_rate(outcomes, arm, lrs)
    return _percentiles([_boot_critical(by_rate, lrs, rng) for _ in range(n_boot)])


def critical_ratio_ci(outcomes: list[dict], arm: str, ref: str, lrs: list[float], n_boot: int = 2000, seed: int = 0):
    """95 % percentile bootstrap interval of critical(arm) / critical(ref), the two arms resampled
    independently (seeds within each rate); an interval that excludes 1 says the arm moves the rate at
    which runs start to collapse. +inf where the arm's resample never reaches 1/2, 0 where only ref's does not."""
    import random as _r

    rng = _r.Random(seed)
    arm_rates, ref_rates = _by_rate(outcomes, arm, lrs), _by_rate(outcomes, ref, lrs)
    vals = []
    for _ in range(n_boot):
        a, r = _boot_critical(arm_rates, lrs, rng), _boot_critical(ref_rates, lrs, rng)
        vals.append(1.0 if a == r == math.inf else (math.inf if a == math.inf else (0.0 if r == math.inf else a / r)))
    return _percentiles(vals)


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
            row.append(f"{c}/{len(xs)}" + (f" (t {fmt_half(statistics.median(times))})" if times else ""))
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


def _stress_design(res: dict, name: str) -> str:
    d = res["design"]
    return (f"{name}: {d['n']} runs, arms {', '.join(d['arms'])}; rates {', '.join(f'x{f:g}' for f in d['lrs'])}; "
            f"seeds {', '.join(map(str, d['seeds']))}")
