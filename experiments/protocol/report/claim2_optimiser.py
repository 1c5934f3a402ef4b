"""docs/results.md's section on claim 2 under the released optimiser, with its verdicts generated from the data:
the design on replicate b's model, its first run (:data:`experiments.protocol.claim2.RELEASED`: the pilot, seeds
0-5) pooled with its continuation (:data:`experiments.protocol.claim2.RELEASED_CONTINUED`, branch A: seeds 6-11); or,
where the continuation ran on another model (its branch B), that file's own section, its own verdict as the claim's, and
the test pooled by model."""

from __future__ import annotations

import math
import os
import statistics

from .. import stats
from ..claim2 import RELEASED, RELEASED_CONTINUED, same_start
from ..claim7 import ATTRIBUTION
from ..common import DATA, read_jsonl_gz
from ..declare import check_runs, describe
from .claim2 import critical_lr, critical_lr_ci, critical_ratio_ci, load_stress, stress_outcomes
from .tables import fmt_half, fmt_p, pct, table

LABELS = {"grpo": "GRPO, released optimiser", "gtpo_official": "GTPO (official), released optimiser"}
REF, ARM = "grpo", "gtpo_official"


#: the two data files of the design: the design, the model's description, how its runs ended
FILES = {
    "b": (RELEASED, "replicate b's recipe rebuilt in that session", lambda: ATTRIBUTION.ended),
    "c": (RELEASED_CONTINUED, "replicate b's recipe built on this AMD machine", lambda: RELEASED_CONTINUED.ended),
}


def load(which: str = "b") -> tuple[dict | None, list[dict]]:
    data = FILES[which][0].data
    if not os.path.isfile(data):
        return None, []
    recs = read_jsonl_gz(data)
    return next((r for r in recs if r["kind"] == "start"), None), [r for r in recs if r["kind"] == "run"]


def same_model(a: dict | None, b: dict | None) -> bool:
    """Whether two stress start records measure the same model (every key but the build's own)."""
    return same_start(a, b)


def _fx(x) -> str:
    return "> grid" if x is None or x == math.inf else f"x{x:.3g}"


def _grid_table(outc: list[dict], lrs: list[float]) -> list[list[str]]:
    rows = []
    for arm in (REF, ARM):
        row = [LABELS[arm]]
        for f in lrs:
            xs = [o for o in outc if o["arm"] == arm and o["lr"] == f]
            times = sorted(o["time"] for o in xs if o["collapsed"])
            row.append(f"{sum(o['collapsed'] for o in xs)}/{len(xs)}" + (f" (t {fmt_half(statistics.median(times))})" if times else "")
                       if xs else "—")
        rows.append(row)
    return rows


def continuation(first: dict | None) -> tuple[dict | None, list[dict]]:
    """The continuation's runs when they continue the first run on its model (its branch A: its start record equals
    ``first``, the first file's), else no runs."""
    start, runs = load("c")
    return (start, runs) if runs and same_start(start, first) else (None, [])


def _reproduction(first: list[dict], repro: list[dict]) -> str:
    """How the reproduction check's reruns compare, step by step, with the committed runs of the same job."""
    parts = []
    for r in repro:
        old = next((o for o in first if (o["phase"], o["arm"], o["lr_factor"], o["seed"]) ==
                    (r["phase"], r["arm"], r["lr_factor"], r["seed"])), None)
        if old is None:
            continue
        a, b = [m["reward/mean"] for m in old["steps"]], [m["reward/mean"] for m in r["steps"]]
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        oc, rc = stress_outcomes([old])[0], stress_outcomes([r])[0]
        how = (f"equal at all {len(a)} steps" if same is None and len(a) == len(b) else
               f"equal for {same} steps, then different (mean reward at step {same + 1}: {a[same]:.3f} there, "
               f"{b[same]:.3f} here)" if same is not None else f"{len(a)} steps there, {len(b)} here")
        parts.append(f"{LABELS[r['arm']]} x{r['lr_factor']:g} seed {r['seed']}: mean reward per step {how}; collapsed "
                     + (f"at step {oc['time']}" if oc["collapsed"] else "never") + " there, "
                     + (f"at step {rc['time']}" if rc["collapsed"] else "never") + " here")
    return "; ".join(parts)


def section(which: str = "b") -> tuple[str, dict]:
    """The tables of one data file (``which``: "b" or "c", see :data:`FILES`) and its own verdict. The first
    file's section pools the continuation's seeds (:func:`continuation`); the second file then has no section
    of its own."""
    design, model_text, ended = FILES[which]
    start, runs = load(which)
    _, c_runs = continuation(start if which == "b" else load("b")[0])
    if not runs or (which == "c" and c_runs):
        return "", {}
    res: dict = {"check": check_runs(runs, os.path.relpath(design.data, DATA)), "which": which}
    out = [f"**Declared before it ran:** {describe(res['check'])}.\n"]
    repro = []
    if which == "b" and c_runs:
        res["check_c"] = check_runs(c_runs, os.path.relpath(RELEASED_CONTINUED.data, DATA))
        repro = [r for r in c_runs if r["seed"] == RELEASED_CONTINUED.repro_seed]
        cont = [r for r in c_runs if r["seed"] in RELEASED_CONTINUED.continuation_seeds]
        out.append(f"**The continuation** (`stress_opt_c`, branch A, on a model built on another machine whose start "
                   f"record equals this file's) **declared before it ran:** {describe(res['check_c'])}.\n")
        res["reproduction"] = _reproduction(runs, repro)
        runs = runs + cont
    b_start, _ = load_stress("b")
    res["same_as_b"] = same = same_model(start, b_start)
    if start:
        line = (f"**The stress model** ({model_text}): sampled at temperature 1 it "
                f"writes the systematic error on {pct(start['error_rate_error_prompts'])} % of the error-prompt samples "
                f"and {pct(start['error_rate_other'])} % of the others, mean token entropy {start['entropy_other']:.3f} "
                "on the others")
        if b_start:
            line += (f"; replicate b's: {pct(b_start['error_rate_error_prompts'])} %, {pct(b_start['error_rate_other'])} %, "
                     f"{b_start['entropy_other']:.3f}. "
                     + ("Every measured value of the two start records is equal: this is **replicate b's model**, and "
                        "replicate b's default-optimiser grid is a same-model reference" if same else
                        "The records differ: this is **a new replicate (c)**, and comparisons with replicate b are across "
                        "models, descriptive only"))
        res["start"] = start
        out.append(line + ".\n")
    pilot = stress_outcomes([r for r in runs if r["phase"] == "pilot"])
    main = stress_outcomes([r for r in runs if r["phase"] == "main"])
    res["pilot"], res["main"] = pilot, main
    if pilot:
        plrs = sorted({o["lr"] for o in pilot})
        out.append("*Pilot (seeds " + ", ".join(map(str, RELEASED.pilot_seeds)) + "): runs collapsed per rate (median "
                   "step of collapse).*\n")
        out.append(table(["arm"] + [f"lr x{f:g}" for f in plrs], _grid_table(pilot, plrs)) + "\n")
        by_f: dict = {}
        for o in pilot:
            by_f.setdefault(o["lr"], []).append(o["collapsed"])
        full = len(RELEASED.arms) * len(RELEASED.pilot_seeds)
        if all(len(v) == full for v in by_f.values()) and RELEASED.pilot_factors(by_f) == sorted(by_f):
            try:
                res["main_grid"] = RELEASED.main_grid(by_f)
                out.append("Main grid by the declared rule (`stress_opt.main_grid`): "
                           + ", ".join(f"x{f:g}" for f in res["main_grid"]) + ".\n")
            except ValueError as err:
                out.append(f"No main grid: {err}.\n")
    if main:
        lrs = sorted({o["lr"] for o in main})
        seeds_run = sorted({o["seed"] for o in main})
        out.append(f"**Seeds run:** the main grid ran seeds {seeds_run[0]}-{seeds_run[-1]} of the declared "
                   f"{RELEASED.main_seeds[0]}-{RELEASED.main_seeds[-1]}. "
                   + (f"Seeds 0-5 ran in the first session: {ended()} Seeds {RELEASED_CONTINUED.continuation_seeds[0]}-"
                      f"{RELEASED_CONTINUED.continuation_seeds[-1]} are the continuation's: {RELEASED_CONTINUED.ended}"
                      if res.get("check_c") else ended()) + "\n")
        if res.get("reproduction"):
            out.append(f"**Reproduction check** (the continuation's reruns, descriptive, not pooled): "
                       f"{res['reproduction']}.\n")
        rows = _grid_table(main, lrs)
        for row, arm in zip(rows, (REF, ARM)):
            crit = critical_lr(main, arm, lrs)
            lo, hi = critical_lr_ci(main, arm, lrs)
            res[("crit", arm)] = (crit, lo, hi)
            row.append(f"{_fx(crit)} [{_fx(lo)}, {_fx(hi)}]")
        if res[("crit", REF)][0] is not None and res[("crit", ARM)][0] is not None:
            ratio = res[("crit", ARM)][0] / res[("crit", REF)][0]
            rlo, rhi = critical_ratio_ci(main, ARM, REF, lrs)
            res["ratio"] = (ratio, rlo, rhi)
            rows[1].append(f"{ratio:.2f} [{rlo:.2f}, {'∞' if rhi == math.inf else f'{rhi:.2f}'}]")
        else:
            rows[1].append("—")
        rows[0].append("—")
        out.append("*Main grid (seeds " + ", ".join(map(str, sorted({o['seed'] for o in main}))) + "): runs collapsed "
                   "(median step of collapse), critical rate (95 % bootstrap) and GTPO's divided by GRPO's.*\n")
        out.append(table(["arm"] + [f"lr x{f:g}" for f in lrs] + ["critical lr", "÷ GRPO's"], rows) + "\n")
        both = [o for o in main if o["arm"] in (REF, ARM)]
        lr_res = stats.logrank([o["time"] for o in both], [int(o["collapsed"]) for o in both], [o["arm"] for o in both],
                               strata=[o["lr"] for o in both])
        res["logrank"] = lr_res
        prow = []
        for f in lrs:
            ca = sum(o["collapsed"] for o in both if o["arm"] == ARM and o["lr"] == f)
            cg = sum(o["collapsed"] for o in both if o["arm"] == REF and o["lr"] == f)
            na = sum(1 for o in both if o["arm"] == ARM and o["lr"] == f)
            ng = sum(1 for o in both if o["arm"] == REF and o["lr"] == f)
            fisher = stats.fisher_exact(ca, na - ca, cg, ng - cg)
            ea = [o["entropy_ratio"] for o in both if o["arm"] == ARM and o["lr"] == f]
            eg = [o["entropy_ratio"] for o in both if o["arm"] == REF and o["lr"] == f]
            mw = stats.mann_whitney(ea, eg) if ea and eg else None
            res[("rate", f)] = {"fisher": fisher, "collapsed": (ca, na, cg, ng), "mw": mw,
                                "entropy": (statistics.median(ea), statistics.median(eg))}
            prow.append([f"x{f:g}", f"{ca}/{na} vs {cg}/{ng}", f"p = {fmt_p(fisher)}",
                         f"{statistics.median(ea):.2f} vs {statistics.median(eg):.2f}" + (f" (p {fmt_p(mw['p'])})" if mw else ""),
                         f"{statistics.median(o['kl'] for o in both if o['arm'] == ARM and o['lr'] == f):.2e} vs "
                         f"{statistics.median(o['kl'] for o in both if o['arm'] == REF and o['lr'] == f):.2e}"])
        out.append(f"*GTPO vs GRPO: log-rank stratified by rate (primary) χ² = {lr_res['chi2']:.2f}, p = "
                   f"{fmt_p(lr_res['p'])}; per rate: collapses (Fisher), median entropy rise (Mann-Whitney), median "
                   "KL(π_new‖π_old) per step over steps 1-10.*\n")
        out.append(table(["rate", "collapsed, GTPO vs GRPO", "Fisher", "entropy rise", "KL per step"], prow) + "\n")
    res["verdict"] = verdict(res)
    return "\n".join(out), res


def verdict(res: dict) -> str:
    if "logrank" not in res:
        return "**Not finished:** the main grid has no runs yet.\n"
    lr = res["logrank"]
    gi = lr["groups"].index(ARM)
    later = lr["observed"][gi] < lr["expected"][gi]
    sig = lr["p"] < 0.05
    crit_g, crit_t = res[("crit", REF)], res[("crit", ARM)]
    events = sum(lr["observed"])
    power = stats.logrank_power(events, 0.5)
    res["power_halved"] = power
    head = ("official GTPO collapses later than GRPO" if sig and later else
            "official GTPO collapses earlier than GRPO" if sig else
            f"no shift detected in time to collapse (only official GTPO and GRPO ran, no component arms; the test's "
            f"power to detect a halved hazard is {100 * power:.0f} %)")
    text = (f"**Verdict: {head}** under the released optimiser (log-rank stratified by rate, p = {fmt_p(lr['p'])}; "
            f"GTPO {lr['observed'][gi]:.0f} collapses observed against {lr['expected'][gi]:.1f} expected; {events:.0f} "
            f"collapses in all, so {100 * power:.0f} % power at α = 0.05 to detect a hazard ratio of 0.5, Schoenfeld's "
            "approximation). Critical rates: "
            f"GRPO {_fx(crit_g[0])} [{_fx(crit_g[1])}, {_fx(crit_g[2])}], official GTPO {_fx(crit_t[0])} "
            f"[{_fx(crit_t[1])}, {_fx(crit_t[2])}]")
    if "ratio" in res:
        r, lo, hi = res["ratio"]
        text += (f"; GTPO's divided by GRPO's {r:.2f} [95 % bootstrap {lo:.2f}, {'∞' if hi == math.inf else f'{hi:.2f}'}]"
                 + (", an interval that excludes 1" if lo > 1 or hi < 1 else ", an interval that contains 1"))
    _, b_runs = load_stress("b")
    if b_runs:
        bo = stress_outcomes(b_runs)
        blrs = sorted({o["lr"] for o in bo})
        bg, bt = critical_lr(bo, "grpo", blrs), critical_lr(bo, "gtpo_official", blrs)
        text += ((". On the same model" if res.get("same_as_b") else ". For scale (another model, descriptive)")
                 + f" with the protocol's AdamW (0.9, 0.999), clip 1.0 and a constant rate, replicate b's critical "
                 f"rates were GRPO {_fx(bg)} and official GTPO {_fx(bt)}")
        main = res.get("main", [])
        for f in sorted({o["lr"] for o in main} & set(blrs)):
            def frac(outc, arm):
                xs = [o["collapsed"] for o in outc if o["arm"] == arm and o["lr"] == f]
                return f"{sum(xs)}/{len(xs)}"
            text += (f"; at x{f:g}, the rate both grids share, GRPO collapsed on {frac(bo, 'grpo')} seeds with that "
                     f"optimiser and {frac(main, REF)} with the released one, official GTPO on {frac(bo, 'gtpo_official')} "
                     f"and {frac(main, ARM)} (the cosine schedule's mean rate is half its peak)")
        if crit_g[0] is not None and bg:
            text += (f": the released optimiser moves GRPO's critical rate by a factor {crit_g[0] / bg:.3g}"
                     + (" (a cosine schedule averages half the peak rate, and with β1 ≈ 1 the update is the running "
                        "mean of all past gradients, far smaller than a sign-like Adam step)" if crit_g[0] / bg > 1.5 else ""))
    protective = sig and later
    text += (". **The `official` preset** sets GTPO's loss, filter and sampling fields, not the optimiser; the released "
             "optimiser settings are set by the paper configs (`configs/paper/*.yaml`). "
             + ("Under them GTPO collapses later than GRPO here, so the released code's stability depends on settings the "
                "preset does not carry: use them with the preset when reproducing the released code."
                if protective else
                "Under them GTPO collapses earlier than GRPO here, so these runs give no reason to move the optimiser "
                "into the preset; the paper configs keep carrying it." if sig else
                "Under them GTPO and GRPO are not shown to differ here either, so these runs give no reason to move the "
                "optimiser into the preset; the paper configs keep carrying it."))
    return text + "\n"


def pooled(res_b: dict, res_c: dict) -> dict | None:
    """The declared secondary test of the continuation's design: the log-rank test over both
    data files' main grids, stratified by (model, rate), so each run is compared only within its own model
    and rate. None unless both files have main-grid runs."""
    if not (res_b.get("main") and res_c.get("main")):
        return None
    both = [(w, o) for w, res in (("b", res_b), ("c", res_c)) for o in res["main"] if o["arm"] in (REF, ARM)]
    out = stats.logrank([o["time"] for _, o in both], [int(o["collapsed"]) for _, o in both], [o["arm"] for _, o in both],
                        strata=[(w, o["lr"]) for w, o in both])
    out["seeds"] = {w: len({o["seed"] for o in res["main"]}) for w, res in (("b", res_b), ("c", res_c))}
    return out


def claim_verdict(res_b: dict, res_c: dict) -> str:
    """The verdict of claim 2 under the released optimiser: replicate c's primary test (the design run in
    full) where it has run, with the pooled test; replicate b's first run otherwise."""
    if "logrank" not in res_c:
        return res_b.get("verdict", "")
    text = res_c["verdict"].rstrip("\n")
    pl = res_c.get("pooled")
    if pl:
        gi = pl["groups"].index(ARM)
        text += (f" Pooled with the first run on replicate b's model ({pl['seeds']['b']} seeds there, "
                 f"{pl['seeds']['c']} here), stratified by model and rate (the declared secondary test): p = "
                 f"{fmt_p(pl['p'])}, GTPO {pl['observed'][gi]:.0f} collapses observed against {pl['expected'][gi]:.1f} "
                 f"expected ({sum(pl['observed']):.0f} collapses: {100 * stats.logrank_power(sum(pl['observed']), 0.5):.0f} % "
                 "power to detect a halved hazard).")
    return text + "\n"
