"""docs/results.md's section "The two engines on a real run" (``designs/engines.md``, issue 45 item 4): the default run
on gtpo's engine and on TRL's engine, per seed; the declared power; once every declared run is in, the paired test
and the verdict by the declared rule (:meth:`experiments.protocol.engines.Engines.verdict`); the curve summaries,
the per-step reward and entropy side by side, the step-time ratio."""

from __future__ import annotations

import os
import statistics

from .. import stats
from ..common import DATA, read_jsonl_gz
from ..declare import check_runs, describe
from ..engines import ENGINES
from .tables import _figure, _save, design_paragraph, fmt_half, fmt_p, pct, table

LABELS = {"gtpo": "gtpo's engine", "trl": "TRL's engine (`--engine trl`)"}
#: the committed runs of gtpo's engine with the same settings and one thread (`smol.jsonl.gz`): seeds 0-3 of this
#: design's gtpo arm are reruns of them, reported beside the design (``designs/engines.md``)
REPRO_ARM, REPRO_DATA = "gtpo_lr2e-4_40", "smol.jsonl.gz"
#: the steps at which the side-by-side curve table reads the seed means
CURVE_STEPS = (1, 5, 10, 15, 20, 25, 30, 35, 40)


def load(path: str | None = None) -> tuple[dict, dict]:
    """({arm: before record}, {arm: {seed: run record}}) of the data file (empty when it is absent)."""
    path = path or ENGINES.data
    if not os.path.isfile(path):
        return {}, {}
    recs = read_jsonl_gz(path)
    runs: dict = {}
    for r in recs:
        if r["kind"] == "run":
            runs.setdefault(r["arm"], {})[r["seed"]] = r
    return {r["arm"]: r for r in recs if r["kind"] == "before"}, runs


def paired_seeds(runs: dict) -> list[int]:
    """The declared seeds both engines finished, in order."""
    return [s for s in ENGINES.seeds if all(s in runs.get(a, {}) for a in ENGINES.arm_names())]


def _paired_test(xs: dict[int, float], ys: dict[int, float], seeds: list[int]) -> dict:
    diffs = [xs[s] - ys[s] for s in seeds]
    return {"n": len(diffs), "mean": statistics.mean(diffs) if diffs else float("nan"), "t": stats.paired_t(diffs)}


def analyse(runs: dict) -> dict:
    """Every number of the section from ``runs`` ({arm: {seed: record}}): per seed accuracy after, curve summaries,
    step times; over the paired seeds the curve comparisons and the step-time ratios; the primary test and verdict
    only when every declared run is in (the stopping rule)."""
    seeds = paired_seeds(runs)
    acc = {a: {s: r["eval_after"]["accuracy"] for s, r in runs.get(a, {}).items()} for a in ENGINES.arm_names()}
    curves = {a: {s: ENGINES.curve_summary(r["steps"]) for s, r in runs.get(a, {}).items()} for a in ENGINES.arm_names()}
    times = {a: {s: ENGINES.step_time(r) for s, r in runs.get(a, {}).items()} for a in ENGINES.arm_names()}
    res: dict = {"seeds": seeds, "acc": acc, "curves": curves, "times": times,
                 "n_done": sum(len(v) for v in runs.values()), "complete": len(seeds) == len(ENGINES.seeds)}
    if seeds:
        res["curve_tests"] = {name: _paired_test({s: curves["trl"][s][name] for s in seeds},
                                                 {s: curves["gtpo"][s][name] for s in seeds}, seeds)
                              for name in ENGINES.CURVES}
        res["wall_ratio"] = ENGINES.ratio([times["trl"][s]["wall_median_s"] for s in seeds],
                                          [times["gtpo"][s]["wall_median_s"] for s in seeds])
        cpu = [s for s in seeds if times["trl"][s]["cpu_per_step_s"] and times["gtpo"][s]["cpu_per_step_s"]]
        res["cpu_ratio"] = ENGINES.ratio([times["trl"][s]["cpu_per_step_s"] for s in cpu],
                                         [times["gtpo"][s]["cpu_per_step_s"] for s in cpu]) if cpu else None
        res["cpu_seeds"] = cpu
        res["mean_curves"] = {a: mean_curves([runs[a][s]["steps"] for s in seeds]) for a in ENGINES.arm_names()}
    if res["complete"]:
        res["primary"] = ENGINES.verdict([acc["trl"][s] - acc["gtpo"][s] for s in seeds])
    return res


def mean_curves(step_lists: list[list[dict]]) -> dict[int, dict[str, float]]:
    """{step: {"reward", "entropy"}}: the mean over runs at each step every run logged."""
    by = [{s["step"]: s for s in steps} for steps in step_lists]
    common = sorted(set.intersection(*(set(b) for b in by))) if by else []
    return {t: {k: statistics.mean(b[t][k] for b in by) for k in ("reward", "entropy")} for t in common}


def reproduction(runs: dict, smol_path: str | None = None) -> list[dict]:
    """For each finished run of gtpo's engine with a committed run of :data:`REPRO_ARM` on its seed: both accuracies
    after, and the first step whose logged reward and whose entropy differ (beyond 1e-9; None: none differs)."""
    path = smol_path or os.path.join(DATA, REPRO_DATA)
    if not os.path.isfile(path):
        return []
    old = {r["seed"]: r for r in read_jsonl_gz(path) if r["kind"] == "run" and r["arm"] == REPRO_ARM}
    out = []
    for s, r in sorted(runs.get("gtpo", {}).items()):
        if s in old:
            first = {}
            for key, legacy in (("reward", "reward/mean"), ("entropy", "entropy/mean")):
                pairs = zip(r["steps"], old[s]["steps"])
                first[key] = next((a["step"] for a, b in pairs if key in a and legacy in b
                                   and abs(a[key] - b[legacy]) > 1e-9), None)
            out.append({"seed": s, "after": r["eval_after"]["accuracy"], "committed": old[s]["eval_after"]["accuracy"],
                        "first_diff": first})
    return out


def _f(x, digits: int = 3) -> str:
    return "—" if x is None or x != x else f"{x:.{digits}g}"


def section(path: str | None = None, *, use_git: bool | None = None, smol_path: str | None = None) -> tuple[str, dict]:
    """The section's markdown and its numbers, from the data file ``path`` (default: the design's)."""
    out = [design_paragraph(ENGINES).split("\nCommands (")[0].rstrip() + "\n"]  # the commands: experiments/README.md
    pw = ENGINES.power()
    out.append("**Power** (declared; paired t at α = "
               f"{ENGINES.alpha:g}, 80 % power, {len(ENGINES.seeds)} pairs): "
               + "; ".join(f"seed SD {100 * p['seed_sd']:.2f} points → paired SD {100 * p['sd_diff']:.2f}, MDD "
                           f"{100 * p['mdd']:.1f} points (90 % interval half-width {100 * p['ci90_half']:.1f})" for p in pw)
               + ".\n")
    befores, runs = load(path)
    res: dict = {"power": pw}
    n_jobs = len(ENGINES.jobs())
    if not runs:
        res["n_done"] = 0
        out.append(f"**Running:** 0 of {n_jobs} runs (no data exported yet).\n")
        return "\n".join(out), res
    all_runs = [r for per in runs.values() for r in per.values()]
    res["check"] = check = check_runs(all_runs, os.path.basename(path or ENGINES.data), use_git=use_git)
    res.update(analyse(runs))
    out.append(f"**Declared before it ran:** {describe(check)}.\n")
    if befores:
        out.append("**Before training** (greedy, 200 held-out problems, each engine's model with its fresh LoRA "
                   "adapter): " + "; ".join(f"{LABELS[a]} {pct(b['accuracy'])} %" for a, b in befores.items()) + ".\n")
    rows = []
    for s in ENGINES.seeds:
        cells = [str(s)]
        for a in ENGINES.arm_names():
            r = runs.get(a, {}).get(s)
            cells.append(pct(res["acc"][a][s]) if r else "—")
        both = s in res["seeds"]
        cells.append(f"{100 * (res['acc']['trl'][s] - res['acc']['gtpo'][s]):+.1f}" if both else "—")
        for a in ENGINES.arm_names():
            t = res["times"][a].get(s)
            cells.append(f"{t['wall_median_s']:.1f}" if t else "—")
        for a in ENGINES.arm_names():
            t = res["times"][a].get(s)
            cells.append(_f(t["cpu_per_step_s"]) if t else "—")
        rows.append(cells)
    out.append("**Per seed** (greedy accuracy after training, %, on the 200 held-out problems; the median wall "
               "seconds of a step and the training CPU seconds per step):\n")
    out.append(table(["seed", "gtpo", "TRL", "TRL − gtpo", "step s gtpo", "step s TRL", "CPU s/step gtpo",
                      "CPU s/step TRL"], rows) + "\n")
    odd = [(a, s, r) for a in ENGINES.arm_names() for s, r in sorted(runs.get(a, {}).items())
           if r.get("resumed") or (r.get("timing") or {}).get("attempts", 1) != 1]
    if odd:
        out.append("**Interrupted runs** (an attempt ended before the run did; the next resumed from the newest "
                   "checkpoint and re-ran the steps after it, the last log of a step counting): "
                   + "; ".join(f"{LABELS[a]} seed {s} (longest step {max(x.get('step_time', 0) for x in r['steps']):.0f} s, "
                               f"median {res['times'][a][s]['wall_median_s']:.1f} s)" for a, s, r in odd)
                   + ". A step that spans a pause of the machine is that long; the median is not moved by one such "
                   "step, and their CPU seconds per step are not counted (—): the killed attempt recorded none.\n")
    rep = res["reproduction"] = reproduction(runs, smol_path)
    if rep:
        out.append(f"**Reruns of gtpo's engine** (beside the design: the same settings ran before with one thread, "
                   f"`{REPRO_DATA}` arm `{REPRO_ARM}`): "
                   + "; ".join(f"seed {x['seed']} {pct(x['after'])} % (committed {pct(x['committed'])} %; "
                               + ", ".join(f"{k} first differs at step {v}" if v else f"{k} identical at every step"
                                           for k, v in x["first_diff"].items()) + ")" for x in rep)
                   + ". A trajectory that departs from the committed one at some step is another draw of the same "
                   "settings (the code changed since the committed run), not part of the design's test.\n")
    if res["seeds"]:
        seeds = res["seeds"]
        crow = [[name, *(_f(statistics.mean(res["curves"][a][s][name] for s in seeds)) for a in ENGINES.arm_names()),
                 f"{res['curve_tests'][name]['mean']:+.3f}", fmt_p(res["curve_tests"][name]["t"]["p"])]
                for name in ENGINES.CURVES]
        out.append(f"**Curves** (per-run summaries, mean over the {len(seeds)} paired seed(s); TRL − gtpo paired, "
                   "t-test p, uncorrected: a difference to explain, not a finding):\n")
        out.append(table(["summary", "gtpo", "TRL", "TRL − gtpo", "paired t p"], crow) + "\n")
        mc = res["mean_curves"]
        steps = [t for t in CURVE_STEPS if all(t in mc[a] for a in ENGINES.arm_names())]
        out.append("**Reward and entropy per step**, side by side (mean over the paired seeds):\n")
        out.append(table(["step", "reward gtpo", "reward TRL", "entropy gtpo", "entropy TRL"],
                         [[str(t), _f(mc["gtpo"][t]["reward"]), _f(mc["trl"][t]["reward"]),
                           _f(mc["gtpo"][t]["entropy"]), _f(mc["trl"][t]["entropy"])] for t in steps]) + "\n")
        cpu = (f"; training CPU seconds per step {res['cpu_ratio']:.2f}x (seeds "
               f"{', '.join(map(str, res['cpu_seeds']))})" if res.get("cpu_ratio") else "")
        out.append(f"**Step time, TRL / gtpo** (geometric mean over the paired seeds): median wall seconds per step "
                   f"{res['wall_ratio']:.2f}x{cpu}. Both depend on what else ran on the shared 2-core machine, the CPU "
                   "seconds too (shared cores and caches): over the finished runs, CPU seconds per step "
                   + "; ".join(f"{LABELS[a]} {_f(min(v))}-{_f(max(v))}" for a in ENGINES.arm_names()
                               if (v := [t["cpu_per_step_s"] for t in res["times"][a].values() if t["cpu_per_step_s"]]))
                   + ".\n")
    if not res["complete"]:
        out.append(f"**Running:** {res['n_done']} of {n_jobs} runs; by the stopping rule no test is computed before "
                   "all have finished.\n")
        return "\n".join(out), res
    p = res["primary"]
    lo, hi = p["ci90"]
    text = (f"**Verdict (the declared rule): {p['verdict']}.** TRL's engine minus gtpo's engine, greedy held-out "
            f"accuracy after training: {100 * p['mean']:+.1f} points on {p['n']} paired seeds (paired t = "
            f"{p['t']['t']:.2f}, p = {fmt_p(p['t']['p'])}; exact Wilcoxon W+ = {fmt_half(p['wilcoxon']['w_plus'])}, "
            f"p = {fmt_p(p['wilcoxon']['p'])}; 90 % interval {100 * lo:+.1f} to {100 * hi:+.1f} points against the "
            f"margin ±{100 * ENGINES.margin:g}).\n")
    res["verdict_text"] = text
    out.append(text)
    return "\n".join(out), res


def fig_engines(path: str | None = None) -> str | None:
    """Reward (5-step running mean) and entropy per step of every run, the two engines side by side."""
    _, runs = load(path)
    if not runs:
        return None
    fig, axes = _figure(2, 1, w=4.8, h=3.3)
    for k, (key, title) in enumerate((("reward", "training reward (5-step running mean)"),
                                      ("entropy", "token entropy (nats)"))):
        ax = axes[0][k]
        for i, a in enumerate(ENGINES.arm_names()):
            for j, (s, r) in enumerate(sorted(runs.get(a, {}).items())):
                xs = [st["step"] for st in r["steps"]]
                ys = [st[key] for st in r["steps"]]
                if key == "reward":
                    ys = [statistics.mean(ys[max(0, t - 4):t + 1]) for t in range(len(ys))]
                ax.plot(xs, ys, color=f"C{i}", lw=1.0, alpha=0.8, label=LABELS[a] if j == 0 else None)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
    axes[0][0].legend(fontsize=7)
    return _save(fig, "engines.png")


def status_row(res: dict) -> list[str]:
    return ["the two engines on a real run (issue 45 item 4; declared, checked)",
            f"{res.get('n_done', 0)} of {len(ENGINES.jobs())} runs"
            + (f". {describe(res['check'])}" if res.get("check") else ""),
            f"`experiments/data/{os.path.basename(ENGINES.data)}`"]
