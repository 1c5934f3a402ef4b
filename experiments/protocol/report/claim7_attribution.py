"""docs/results.md's section on the claim-7 attribution design (:data:`experiments.protocol.claim7.ATTRIBUTION`) and
its continuation (:data:`experiments.protocol.claim7.CONTINUED`), with the verdict generated from the data by the
declared rule (``ATTRIBUTION.attribution``) and the tuning rule of ``CONTINUED.chosen_rate``."""

from __future__ import annotations

import os
import statistics
from collections import defaultdict

from .. import stats
from ..claim7 import ATTRIBUTION, CONTINUED
from ..common import DATA, read_jsonl_gz
from ..declare import check_runs, describe
from .tables import design_paragraph, fmt_half, fmt_p, mean_sd, pct, table

DATA_NAME = os.path.relpath(ATTRIBUTION.data, DATA)
DATA_NAME_C = os.path.relpath(CONTINUED.data, DATA)
METRICS = (("sampled", "pass@1", "sampled pass@1"), ("greedy", "pass@1", "greedy pass@1"),
           ("sampled", "pass@8", "pass@8"), ("sampled", "maj@8", "maj@8"))


def load() -> tuple[dict | None, list[dict]]:
    if not os.path.isfile(ATTRIBUTION.data):
        return None, []
    recs = read_jsonl_gz(ATTRIBUTION.data)
    return next((r for r in recs if r["kind"] == "start"), None), [r for r in recs if r["kind"] != "start"]


def load_c() -> tuple[dict | None, list[dict]]:
    """The continuation's start record and runs (``claim7c.jsonl.gz``)."""
    if not os.path.isfile(CONTINUED.data):
        return None, []
    recs = read_jsonl_gz(CONTINUED.data)
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
            if arm in ATTRIBUTION.rerun and r["lr"] == ATTRIBUTION.lr:
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
    mdd = stats.mdd_paired(t["sd"], len(shared), alpha=ATTRIBUTION.alpha) if t["sd"] == t["sd"] and t["sd"] > 0 else float("nan")
    return {"seeds": shared, "mean": statistics.mean(diffs), "wilcoxon": stats.wilcoxon_signed_rank(diffs), "t": t,
            "mdd": mdd, "higher": sum(d > 0 for d in diffs)}


def _start_line(start: dict, first: dict | None, where: str) -> tuple[str, bool]:
    ho = start["heldout"]
    line = (f"**The start model** (rebuilt by `claim7.build` {where}): validation pass@1 "
            f"{pct(start['kept_validation']['pass@1'])} % after chunk {start['kept_chunk']}; held-out pass@1 "
            f"{pct(ho['pass@1'])} %, pass@8 {pct(ho['pass@8'])} %, maj@8 {pct(ho['maj@8'])} %")
    same = bool(first) and CONTINUED.branch(start, first) == "A"
    if first:
        fh = first["heldout"]
        line += (f"; the first design's: chunk {first['kept_chunk']}, {pct(fh['pass@1'])} / {pct(fh['pass@8'])} / "
                 f"{pct(fh['maj@8'])} %. "
                 + ("The two start records are equal in every measured value, held-out per-problem scores included: "
                    "the same model" if same else "The records differ: another model; the designs are replicates, "
                    "never pooled"))
    return line + ".\n", same


def _compare(per_seed: dict, res: dict) -> list[list]:
    """The rows of the paired-comparison table (every primary comparison, every metric); fills ``res``."""
    crows = []
    for a, b in ATTRIBUTION.primary:
        for mode, metric, name in METRICS:
            c = paired(per_seed, a, b, mode, metric)
            if c is None:
                continue
            res[(a, b, mode, metric)] = c
            w = c["wilcoxon"]
            mark = " **(< 0.0071)**" if (mode, metric) == ("sampled", "pass@1") and w["p"] < ATTRIBUTION.alpha else ""
            crows.append([f"{ATTRIBUTION.labels[a]} − {ATTRIBUTION.labels[b]}", name, len(c["seeds"]), f"{100 * c['mean']:+.2f}",
                          f"{c['higher']} of {len(c['seeds'])}", f"W+ = {fmt_half(w['w_plus'])}, p = {fmt_p(w['p'])}{mark}",
                          f"t = {c['t']['t']:.2f}, p = {fmt_p(c['t']['p'])}", f"{100 * c['mdd']:.2f}"])
    return crows


def _final_rows(per_seed: dict, start: dict | None) -> list[list]:
    frows = []
    for arm in [a for a in ATTRIBUTION.arms if a in per_seed]:
        es = [per_seed[arm][s] for s in sorted(per_seed[arm])]
        sm = [e["sampled"] for e in es if e["sampled"]]
        gr = [e["greedy"] for e in es if e["greedy"]]
        own = [e for e in es if e["own"]]
        frows.append([ATTRIBUTION.labels[arm], f"{ATTRIBUTION.lr:g}", f"{len(sm)} / {len(gr)}",
                      mean_sd([100 * m["pass@1"] for m in sm]), mean_sd([100 * m["pass@1"] for m in gr]),
                      mean_sd([100 * m["pass@8"] for m in sm]), mean_sd([100 * m["maj@8"] for m in sm]),
                      mean_sd([100 * m.get("format_rate", float("nan")) for m in sm]),
                      mean_sd([statistics.mean(x["entropy/mean"] for x in e["steps"][-15:]) for e in own]),
                      mean_sd([100 * statistics.mean(x.get("gtpo/filtered_frac", 0.0) for x in e["steps"]) for e in own]),
                      mean_sd([statistics.mean(x["kl/new_old"] for x in e["steps"] if "kl/new_old" in x) for e in own])])
    if frows and start:
        ho = start["heldout"]
        frows.insert(0, ["start model", "—", "—", pct(ho["pass@1"]), "—", pct(ho["pass@8"]), pct(ho["maj@8"]),
                         pct(ho.get("format_rate", float("nan"))), "—", "—", "—"])
    return frows


FINAL_HEADER = ["arm", "learning rate", "seeds sampled / greedy", "sampled pass@1 %", "greedy pass@1 %", "pass@8 %",
                "maj@8 %", "format rate %", "token entropy, last 10 %", "filtered %", "KL(π_new‖π_old) per step"]
COMPARE_HEADER = ["difference (points)", "metric", "paired seeds", "mean", "seeds higher", "Wilcoxon signed-rank",
                  "paired t", f"MDD (80 % power, α = {ATTRIBUTION.alpha:.4f}, points)"]


def _analysis(per_seed: dict, start: dict | None, res: dict, out: list[str], own_text: str) -> None:
    """The held-out table, the paired comparisons, the entropy correlation and the verdict of ``per_seed``."""
    frows = _final_rows(per_seed, start)
    if frows:
        out.append("**Held-out** (500 problems; sampled: 8 samples at temperature 1; greedy: one completion at "
                   f"temperature 0; answers from the `<answer>` tag; entropy, filtered fraction and KL from {own_text}):\n")
        out.append(table(FINAL_HEADER, frows) + "\n")
    crows = _compare(per_seed, res)
    if crows:
        out.append(f"**Paired comparisons** (final seeds; primary: sampled pass@1, Bonferroni over the "
                   f"{len(ATTRIBUTION.primary)} primary comparisons, p < {ATTRIBUTION.alpha:.4f}):\n")
        out.append(table(COMPARE_HEADER, crows) + "\n")
    finals = [e for es in per_seed.values() for e in es.values() if e["sampled"] and e["steps"]]
    if len(finals) >= 5:
        rho = stats.spearman([statistics.mean(x["entropy/mean"] for x in e["steps"][-15:]) for e in finals],
                             [e["sampled"]["pass@1"] for e in finals])
        res["entropy_rho"] = rho
        res["n_entropy"] = len(finals)
    ent = {arm: statistics.mean(statistics.mean(x["entropy/mean"] for x in e["steps"][-15:])
                                for e in per_seed[arm].values() if e["own"] and e["steps"])
           for arm in per_seed if any(e["own"] and e["steps"] for e in per_seed[arm].values())}
    if ent:
        res["entropy_by_arm"] = ent


def masks_qualifiers(res: dict) -> str:
    """What the masks-only gain over GRPO is, and is not, from the data (issue 45 item 3): its rate, metric and
    sampling temperature, the other metrics' tests, the arms' final entropy and the comparisons it was found among."""
    parts = [f"exploratory: found among {len(ATTRIBUTION.primary)} comparisons, at one learning rate "
             f"({ATTRIBUTION.lr:g}), on sampled pass@1 at temperature 1 only"]
    other = [(name, res[("grpo_masks", "grpo", mode, metric)]) for mode, metric, name in METRICS[1:]
             if ("grpo_masks", "grpo", mode, metric) in res]
    if other:
        parts.append(", ".join(f"{name} {100 * c['mean']:+.2f} (p = {fmt_p(c['wilcoxon']['p'])})" for name, c in other)
                     + (" show no gain" if all(c["wilcoxon"]["p"] >= ATTRIBUTION.alpha for _, c in other) else ""))
    ent = res.get("entropy_by_arm") or {}
    if "grpo_masks" in ent:
        low = min(ent, key=ent.get) == "grpo_masks"
        parts.append(f"the masks arm's final token entropy {ent['grpo_masks']:.3f} is "
                     + ("the lowest of the arms" if low else f"against GRPO's {ent.get('grpo', float('nan')):.3f}"))
    if "entropy_rho" in res:
        parts.append(f"final entropy and sampled pass@1 ρ = {res['entropy_rho']['rho']:+.2f} (p = "
                     f"{fmt_p(res['entropy_rho']['p'])}, n {res['n_entropy']}), so the gain may be sharpening that a lower "
                     "sampling temperature would give GRPO too")
    return "; ".join(parts)


def section() -> tuple[str, dict]:
    start, runs = load()
    if not runs:
        return "", {}
    res: dict = {"check": check_runs(runs, DATA_NAME)}
    out = [f"**Declared before it ran:** {describe(res['check'])}.\n"]
    first = _first_start()
    if start:
        line, res["same_start"] = _start_line(start, first, "in this session")
        out.append(line)
    out.append(blocks_run(runs) + "\n")
    cstart, cruns = load_c()
    res["branch_c"] = br = CONTINUED.branch(cstart, first) if cstart and cruns and first else None
    pooled = runs + ([r for r in cruns if r["kind"] == "final" and r["lr"] == ATTRIBUTION.lr]
                     if br == "A" and res.get("same_start") else [])
    per_seed = entries(pooled, res.get("same_start", False))
    res["final"] = per_seed
    arms = [a for a in ATTRIBUTION.arms if a in per_seed]
    cont = (" Runs of the continuation (`claim7c`, below: the same model on a second machine) are pooled by its "
            "declared rule: each (arm, seed) once." if br == "A" else "")
    out.append(f"**Runs:** every arm at learning rate {ATTRIBUTION.lr:g}; sampled metrics of "
               + " and ".join(ATTRIBUTION.labels[a] for a in ATTRIBUTION.rerun) + " from the first design's runs of the same "
               "seeds (see the amendment), greedy pass@1 from their reruns." + cont + " Seeds with each evaluation: "
               + "; ".join(f"{ATTRIBUTION.labels[a]}: sampled {_seeds(per_seed[a], 'sampled')}, greedy "
                           f"{_seeds(per_seed[a], 'greedy')}" for a in arms) + ".\n")
    _analysis(per_seed, start, res, out, "the runs of this design" + (" and its continuation" if br == "A" else ""))
    if res.get("same_start"):
        rep = reproduction(runs, res)
        if rep:
            out.append(rep + "\n")
    if "entropy_rho" in res:
        out.append(f"Across the {res['n_entropy']} runs with sampled metrics, final token entropy and sampled pass@1: "
                   f"Spearman ρ = {res['entropy_rho']['rho']:+.2f} (p = {fmt_p(res['entropy_rho']['p'])}).\n")
    if cruns:
        out.append(continuation(cstart, cruns, first, res))
    res["verdict"] = verdict(res)
    return "\n".join(out), res


def continuation(cstart: dict | None, cruns: list[dict], first: dict | None, res: dict) -> str:
    """The continuation's own paragraphs: declaration, start model, blocks, reproduction, tuning (and, in branch
    B, its analysis as replicate c)."""
    res["check_c"] = check_runs(cruns, DATA_NAME_C)
    out = ["#### Continued on a second machine (`claim7c`)\n", design_paragraph(CONTINUED),
           f"**Declared before it ran:** {describe(res['check_c'])}.\n"]
    br = res.get("branch_c")
    if cstart:
        line, _ = _start_line(cstart, first, "on this machine")
        out.append(line)
    out.append(blocks_run_c(cruns, br) + "\n")
    if br == "A":
        rep = reproduction([r for r in cruns if r["kind"] == "final" and r["lr"] == ATTRIBUTION.lr], res, machine=True)
        if rep:
            out.append(rep + "\n")
        out.append(tuning(cruns, res))
    elif br == "B":
        rc: dict = {}
        per = entries([r for r in cruns if r["kind"] == "final"], False)
        _analysis(per, cstart, rc, out, "these runs")
        res["replicate_c"] = rc
    return "\n".join(out)


def blocks_run_c(cruns: list[dict], br: str | None) -> str:
    if br is None:
        return ""
    have = {(r["kind"], r["arm"], r["lr"], r["seed"]) for r in cruns}
    parts = []
    for b, jobs in CONTINUED.order(br).items():
        n = sum(j in have for j in jobs)
        parts.append(f"block {b}: {n} of {len(jobs)} runs" + (" (complete)" if n == len(jobs) else ""))
    if br == "A":  # block 8: finals at a re-tuned rate without first-design finals, from the tuning in the data
        sc = _scores(cruns, CONTINUED.retune_arms, CONTINUED.retune_lrs)
        want = CONTINUED.retuned_jobs({a: {lr: list(v.values()) for lr, v in g.items()} for a, g in sc.items()})
        n = sum(j in have for j in want)
        parts.append(f"block 8: {n} of {len(want)} runs" + (" (complete)" if n == len(want) and want else "")
                     + ("" if want else " (none due, or block 4 unfinished)"))
    return f"**Blocks run** (branch {br}): {'; '.join(parts)}. " + CONTINUED.ended


def _scores(cruns: list[dict], arms, grid) -> dict:
    """``{arm: {lr: {seed: validation pass@1}}}`` from the first design's tuning runs and this design's."""
    out = {a: {lr: {} for lr in grid} for a in arms}
    for r in read_jsonl_gz(os.path.join(DATA, "claim7.jsonl.gz")):
        if r["kind"] == "tune" and r["arm"] in out and r["lr"] in out[r["arm"]]:
            out[r["arm"]][r["lr"]][r["seed"]] = r["metrics"]["pass@1"]
    for r in cruns:
        if r["kind"] == "tune" and r["arm"] in out and r["lr"] in out[r["arm"]]:
            out[r["arm"]][r["lr"]][r["seed"]] = r["validation"]["metrics"]["pass@1"]
    return out


def _first_finals(cruns: list[dict] = ()) -> dict:
    """``{(arm, lr): {seed: held-out pass@1}}`` of the first design's final and same-rate runs and of the
    continuation's block 8 (finals at a re-tuned rate)."""
    out: dict = defaultdict(dict)
    for r in read_jsonl_gz(os.path.join(DATA, "claim7.jsonl.gz")):
        if r["kind"] in ("final", "samelr"):
            out[(r["arm"], r["lr"])][r["seed"]] = r["metrics"]["pass@1"]
    for r in cruns:
        if r["kind"] == "final" and r["lr"] != ATTRIBUTION.lr and r.get("sampled"):
            out[(r["arm"], r["lr"])][r["seed"]] = r["sampled"]["metrics"]["pass@1"]
    return out


def tuning(cruns: list[dict], res: dict) -> str:
    """Blocks 4 and 6: each arm's validation scores per rate, the rate chosen by the declared rule where the grid
    is complete, whether it is bracketed; at GTPO's and GRPO's re-tuned rates the first design's primary test."""
    need = {**{a: (CONTINUED.retune_lrs, 6) for a in CONTINUED.retune_arms},
            **{a: (CONTINUED.component_lrs, 3) for a in CONTINUED.components}}
    sc = {**_scores(cruns, CONTINUED.retune_arms, CONTINUED.retune_lrs),
          **_scores(cruns, CONTINUED.components, CONTINUED.component_lrs)}
    rows, chosen = [], {}
    for arm, (grid, n) in need.items():
        if not any(r["kind"] == "tune" and r["arm"] == arm for r in cruns):
            continue  # nothing of this design's tuning for the arm yet
        if arm in CONTINUED.components and not all(len(sc[arm][lr]) >= 6 for lr in grid):
            # block 7 unfinished: the rule reads seeds 100-102 only (the declaration)
            sc[arm] = {lr: {k: v for k, v in sc[arm][lr].items() if k in CONTINUED.old_tune_seeds} for lr in grid}
        complete = all(len(sc[arm][lr]) >= n for lr in grid)
        if complete:
            chosen[arm] = CONTINUED.chosen_rate({lr: list(sc[arm][lr].values()) for lr in grid})
        for lr in grid:
            v = sc[arm][lr]
            rows.append([ATTRIBUTION.labels[arm], f"{lr:g}", ", ".join(map(str, sorted(v))) or "—",
                         " / ".join(pct(v[s]) for s in sorted(v)) or "—",
                         pct(statistics.mean(v.values())) if v else "—",
                         ("**chosen**" + ("" if chosen[arm][1] else " (grid edge: not bracketed)"))
                         if complete and chosen[arm][0] == lr else ("grid incomplete" if not complete else "")])
    res["tuned"] = chosen
    if not rows:
        return ""
    out = ["**Re-tuning** (validation split, 200 problems x 8 samples at temperature 1; the first design's tuning "
           "seeds 100-102 and this design's 103-105, for the component arms 100-102 unless block 7 finished; the rate "
           "is the grid's highest mean, ties to the smaller):\n",
           table(["arm", "learning rate", "tuning seeds", "validation pass@1 % per seed", "mean %", "rule"], rows) + "\n"]
    if "gtpo" in chosen and "grpo" in chosen:
        fin = _first_finals(cruns)
        a, b = fin.get(("gtpo", chosen["gtpo"][0]), {}), fin.get(("grpo", chosen["grpo"][0]), {})
        shared = sorted(set(a) & set(b))
        if len(shared) >= 3:
            diffs = [a[s] - b[s] for s in shared]
            t = stats.paired_t(diffs)
            res["tuned_cmp"] = c = {"mean": statistics.mean(diffs), "wilcoxon": stats.wilcoxon_signed_rank(diffs),
                                    "n": len(shared), "mdd": stats.mdd_paired(t["sd"], len(shared), alpha=ATTRIBUTION.alpha)}
            out.append(f"At the re-tuned rates (GTPO {chosen['gtpo'][0]:g}, GRPO {chosen['grpo'][0]:g}), from the first "
                       f"design's held-out finals: official GTPO minus GRPO {100 * c['mean']:+.2f} points of sampled "
                       f"pass@1 on {c['n']} paired seeds (Wilcoxon W+ = {fmt_half(c['wilcoxon']['w_plus'])}, "
                       f"p = {fmt_p(c['wilcoxon']['p'])}; MDD {100 * c['mdd']:.1f}).\n")
        else:
            res["tuned_cmp"] = None
            out.append(f"No finals exist at the re-tuned rates (GTPO {chosen['gtpo'][0]:g}, GRPO {chosen['grpo'][0]:g}); "
                       "the comparison at them was not run.\n")
    return "\n".join(out)


def blocks_run(runs: list[dict]) -> str:
    """Which declared blocks of ``ATTRIBUTION.order`` the data holds, whole or in part, and how the rule ended them."""
    have = {(r["arm"], r["seed"]) for r in runs}
    parts = []
    for b, jobs in ATTRIBUTION.order.items():
        n = sum(j in have for j in jobs)
        parts.append(f"block {b}: {n} of {len(jobs)} runs" + (" (complete)" if n == len(jobs) else ""))
    return f"**Blocks run** (of the declared order; blocks 2, 3 and 6 are the stress experiment's): {'; '.join(parts)}. " \
        + ATTRIBUTION.ended


def reproduction(runs: list[dict], res: dict, machine: bool = False) -> str:
    """The reruns of GTPO and GRPO at 5e-5 scored sampled (seed 0) against the first design's runs of the same
    seed and rate: whether they reproduce the held-out pass@1 and every step's reward exactly (``machine``:
    the continuation's, on another machine; where the rewards differ, the first step that differs)."""
    first = read_jsonl_gz(os.path.join(DATA, "claim7.jsonl.gz"))
    old = {("gtpo", r["seed"]): r for r in first if r["kind"] == "final" and r["arm"] == "gtpo" and r["lr"] == ATTRIBUTION.lr}
    old.update({("grpo", r["seed"]): r for r in first if r["kind"] == "samelr" and r["arm"] == "grpo"
                and r["lr"] == ATTRIBUTION.lr})
    parts = []
    for r in runs:
        if r["arm"] in ATTRIBUTION.rerun and r.get("sampled") and (r["arm"], r["seed"]) in old:
            o = old[(r["arm"], r["seed"])]
            same_steps = [x.get("reward/mean") for x in r["steps"]] == [x.get("reward/mean") for x in o["steps"]]
            same = r["sampled"]["metrics"]["pass@1"] == o["metrics"]["pass@1"]
            res[("reproduced_machine" if machine else "reproduced", r["arm"], r["seed"])] = same and same_steps
            fork = next((x.get("step") for x, y in zip(r["steps"], o["steps"]) if x.get("reward/mean") != y.get("reward/mean")),
                        None)
            parts.append(f"{ATTRIBUTION.labels[r['arm']]} seed {r['seed']}: held-out pass@1 {pct(r['sampled']['metrics']['pass@1'])} "
                         f"% against {pct(o['metrics']['pass@1'])} %, every step's mean reward "
                         + ("equal" if same_steps else f"not: the first to differ is step {fork}"))
    where = ("on this second machine against the first design's run" if machine else
             "the code of this design's commit")
    return (f"**Reproduction check** (same start model, seed and rate, {where}): " + "; ".join(parts) + ".") if parts else ""


def verdict(res: dict) -> str:
    """The attribution sentence, by the attribution's declared rule, with every number from the data; comparisons
    whose arms have not run yet are named as missing."""
    key = ("sampled", "pass@1")
    if not all(k in res for k in (("grpo_gamma", "grpo", *key), ("gtpo_gamma0", "grpo", *key))):
        return "**Not finished:** GRPO + gamma and GTPO with gamma 0 have fewer than 3 paired seeds.\n"

    def d(a, b, m=key):
        if (a, b, *m) not in res:
            return "not run yet"
        c = res[(a, b, *m)]
        return (f"{100 * c['mean']:+.2f} points on {len(c['seeds'])} seeds (p = {fmt_p(c['wilcoxon']['p'])}, "
                f"MDD {100 * c['mdd']:.1f} at α = {ATTRIBUTION.alpha:.4f})")

    g, r = res[("grpo_gamma", "grpo", *key)], res[("gtpo_gamma0", "grpo", *key)]
    rule = ATTRIBUTION.attribution(g["wilcoxon"]["p"], g["mean"], r["wilcoxon"]["p"], r["mean"])
    tg = res[("gtpo", "grpo", *key)]
    replic = ("is significant" if tg["wilcoxon"]["p"] < ATTRIBUTION.alpha and tg["mean"] > 0 else
              f"does not reach the threshold {ATTRIBUTION.alpha:.4f} either")
    m = res.get(("grpo_masks", "grpo", *key))
    if m is not None and m["wilcoxon"]["p"] < ATTRIBUTION.alpha and m["mean"] > 0:
        none = [name for mode, metric, name in METRICS[1:] if ("grpo_masks", "grpo", mode, metric) in res
                and res[("grpo_masks", "grpo", mode, metric)]["wilcoxon"]["p"] >= ATTRIBUTION.alpha]
        rule += (" between the gamma shift and the rest of GTPO; the conflict masks alone give a sampled-pass@1 gain "
                 f"over GRPO at {ATTRIBUTION.lr:g} and temperature 1 (exploratory, one of {len(ATTRIBUTION.primary)} "
                 "comparisons" + (f"; no gain shown in {', '.join(none)}" if none else "") + ")")
    text = (f"**Verdict (the declared rule): {rule}.** On sampled held-out pass@1 at {ATTRIBUTION.lr:g}, official GTPO "
            f"minus GRPO {d('gtpo', 'grpo')}: at this one rate the gain {replic}. GRPO + gamma minus GRPO "
            f"{d('grpo_gamma', 'grpo')}; GTPO with gamma 0 minus GRPO {d('gtpo_gamma0', 'grpo')}; GRPO + conflict masks "
            f"minus GRPO {d('grpo_masks', 'grpo')}. GTPO over GRPO + gamma {d('gtpo', 'grpo_gamma')}, over GRPO + masks "
            f"{d('gtpo', 'grpo_masks')}, over its own gamma-0 version {d('gtpo', 'gtpo_gamma0')}.")
    text += " " + significant_sentence(res)
    gk = ("greedy", "pass@1")
    if ("gtpo", "grpo", *gk) in res:
        text += (f" Greedy pass@1 (secondary): GTPO minus GRPO {d('gtpo', 'grpo', gk)}, GRPO + gamma minus GRPO "
                 f"{d('grpo_gamma', 'grpo', gk)}, GTPO gamma 0 minus GRPO {d('gtpo_gamma0', 'grpo', gk)}.")
    if "entropy_rho" in res:
        text += (f" Final entropy and sampled pass@1 across the final runs: ρ = {res['entropy_rho']['rho']:+.2f} "
                 f"(p = {fmt_p(res['entropy_rho']['p'])}).")
    text += " " + tuned_sentence(res)
    return text + "\n"


def significant_sentence(res: dict) -> str:
    """Which of the 7 primary comparisons pass the threshold (sampled pass@1, in the gain's direction) and, for the
    masks-only arm (outside the declared rule's two arms), what it says."""
    key = ("sampled", "pass@1")
    sig = [(a, b) for a, b in ATTRIBUTION.primary if (a, b, *key) in res
           and res[(a, b, *key)]["wilcoxon"]["p"] < ATTRIBUTION.alpha and res[(a, b, *key)]["mean"] > 0]
    if not sig:
        return f"No primary comparison passes the threshold {ATTRIBUTION.alpha:.4f}."
    text = ("Primary comparisons passing the threshold: "
            + "; ".join(f"{ATTRIBUTION.labels[a]} − {ATTRIBUTION.labels[b]}" for a, b in sig) + ".")
    over = res.get(("gtpo", "grpo_masks", *key))
    if ("grpo_masks", "grpo") in sig and over is not None and not (over["wilcoxon"]["p"] < ATTRIBUTION.alpha and over["mean"] > 0):
        text += (" The conflict masks alone, in GRPO's reduction and without the gamma shift or the filter, give a gain "
                 "over GRPO at this rate, and official GTPO shows none over them: of GTPO's parts, the masks are the "
                 "one with a shown effect here (the declared rule, written for the gamma arm and the gamma-0 arm, "
                 "does not name it). Qualifiers: " + masks_qualifiers(res) + ".")
    return text


def tuned_sentence(res: dict) -> str:
    """What the re-tuning (the continuation's blocks 4 and 6) says of the one-rate comparison, from the data."""
    tuned = res.get("tuned") or {}
    lr = f"{ATTRIBUTION.lr:g}"
    if not tuned:
        return (f"Every arm ran at one rate ({lr}); the tuning that would bracket each arm's own optimum was not run, "
                "so an arm whose optimum lies elsewhere is compared off it.")
    parts = []
    for arm, (best, bracketed) in tuned.items():
        where = "bracketed" if bracketed else "at its grid's edge, not bracketed"
        parts.append(f"{ATTRIBUTION.labels[arm]} {best:g} ({where})")
    text = "Re-tuned rates (the declared rule, validation split): " + "; ".join(parts) + "."
    off = [ATTRIBUTION.labels[a] for a, (best, _) in tuned.items() if best != ATTRIBUTION.lr]
    text += (f" Compared off their own optimum at {lr}: {', '.join(off)}." if off else
             f" {lr} is the chosen rate of every re-tuned arm.")
    missing = [ATTRIBUTION.labels[a] for a in (*CONTINUED.retune_arms, *CONTINUED.components) if a not in tuned]
    if missing:
        text += f" Not re-tuned (grid not finished): {', '.join(missing)}."
    c = res.get("tuned_cmp")
    if c:
        text += (f" At GTPO's and GRPO's re-tuned rates, official GTPO minus GRPO {100 * c['mean']:+.2f} points of sampled "
                 f"pass@1 on {c['n']} seeds (p = {fmt_p(c['wilcoxon']['p'])}, MDD {100 * c['mdd']:.1f}).")
    return text
