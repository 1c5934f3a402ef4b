"""Claims 3-6 (issue 45 item 2): the entropy filter's thresholds, gamma without the filter, OnlyNeg, and GRPO + filter
+ gamma, decided from the committed data where it can decide them.

The committed runs log, per step, ``gtpo/filtered_frac`` (the share of the step's completions the entropy filter
dropped: mean token entropy ``<H>_i`` above tau) wherever the filter is on, and ``entropy/mean`` (the step's mean
token entropy, every completion's tokens pooled). What that shows about the filter:

* a step with ``filtered_frac`` 0 under a filter at tau had no completion above tau, so every threshold >= tau and
  the OnlyNeg scope (it drops a subset of what the full filter drops) give that step the same update; a run whose
  steps all have 0 is, step for step, the same run at tau 0.7, 1.05, 2.0, with OnlyNeg and without the filter;
* a step whose ``entropy/mean`` exceeds x had at least one completion above x (a token-weighted mean of the
  completions' means is at most their largest), so such steps bound from below where thresholds x could act.

This module counts both per data file and filter-on arm (:func:`activity`), and writes the claims' verdicts from the
counts, the claim-2 collapse tests of the GRPO + filter + gamma arm and the claim-7 attribution's comparisons.
"""

from __future__ import annotations

import functools
import math
import os
import statistics

import yaml

from gtpo.config.presets import preset_values

from .. import stats
from ..claim4 import HORIZON
from ..claim5 import ONLYNEG
from ..claim7 import ATTRIBUTION
from ..declare import check_runs, describe
from ..common import DATA, ROOT, read_jsonl_gz
from .claim2 import STRESS_LABELS, stress_outcomes
from .tables import design_paragraph, fmt_p, table

LN2 = math.log(2.0)
#: the thresholds of the paper's ablation (claim 3), and ln 2 (the claim's drift target)
TAUS = (LN2, 1.05, 2.0)
#: the committed data files, by the scale their runs ran at
FILES = {
    "tiny": ("claim7.jsonl.gz", "claim7b.jsonl.gz", "claim7c.jsonl.gz", "claim7-confirm.jsonl.gz"),
    "stress": ("stress.jsonl.gz", "stress-b.jsonl.gz", "stress-released-optimiser.jsonl.gz",
               "stress-released-optimiser-c.jsonl.gz"),
    "smol": ("smol.jsonl.gz",),
}
SCALES = {"tiny": "tiny model, claim-7 start model (150 steps at tuned rates)",
          "stress": "tiny stress model, collapse study (40 steps at x3-x15 the tiny rate)",
          "smol": "SmolLM2-135M, default task (30-40 steps)"}
#: the config a run's argv starts from: a YAML path first, or ``--demo`` (the default run)
DEMO_YAML = os.path.join(ROOT, "src", "gtpo", "configs", "default.yaml")
#: the SmolLM2 pair where the filter acts in one arm only: the fixed tau 0.7 filter against the <H>_ini rule,
#: which leaves the filter off when the start entropy is above ln 2 (same rate, steps and seeds)
SMOL_FILTER_PAIR = ("gtpo_fixed07_lr3e-4", "gtpo_lr3e-4")
#: claim 6 on the stress grid: the arm and what it is compared with (claim 2's replicates, stratified log-rank)
C6_ARM, C6_REFS = "grpo_filter_gamma", ("grpo", "gtpo_official")
HAZARD_RATIO = 0.5
ALPHA = 0.05
POWER = 0.8


# ------------------------------------------------------------------ what a run's argv sets
def overrides(argv: list[str]) -> tuple[str | None, dict[str, str]]:
    """``(base, {field: value})`` of a ``gtpo train`` argv: ``base`` the YAML it starts from (its first argument,
    or the default run's YAML under ``--demo``; None if neither), then every ``--field value`` pair (the last
    one of a field wins, as on the command line; flags without a value are skipped)."""
    base = argv[0] if argv and argv[0].endswith((".yaml", ".yml")) else (DEMO_YAML if "--demo" in argv else None)
    out: dict[str, str] = {}
    i = 1 if base and argv and argv[0] == base else 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[a[2:]] = argv[i + 1]
            i += 2
        else:
            i += 1
    return base, out


def _yaml(path: str | None) -> dict:
    """The mapping of a run's YAML config (a shallow copy; {} for none)."""
    if not path:
        return {}
    full = path if os.path.isabs(path) else os.path.join(ROOT, path)
    return dict(_parsed_yaml(full, os.stat(full).st_mtime_ns))


@functools.lru_cache(maxsize=None)
def _parsed_yaml(full: str, mtime_ns: int) -> dict:
    """A YAML file parsed once per report (thousands of runs share a few configs: parsing each run's took most of
    the report's time), with libyaml's loader where PyYAML has it."""
    with open(full, encoding="utf-8") as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}


def run_settings(argv: list[str]) -> dict:
    """The entropy-control settings and batch of a run from its argv: the preset's values, under the YAML's, under
    the overrides (gtpo's order). ``filter`` (bool: on, by ``entropy_filter`` or, unset, the loss type being
    gtpo), ``tau``, ``rule``, ``scope``, ``gamma`` (unset: 0.1 for gtpo, 0 otherwise) and ``completions`` (group
    size x prompts per step)."""
    base, ov = overrides(argv)
    merged = {**(preset_values(ov["preset"]) if "preset" in ov else {}), **_yaml(base), **ov}
    loss = str(merged.get("loss_type", "gtpo"))
    filt = merged.get("entropy_filter")
    on = loss == "gtpo" if filt is None else str(filt).lower() == "true"
    gamma = merged.get("gamma")
    return {"filter": on, "tau": float(merged.get("entropy_threshold", 0.7)),
            "rule": str(merged.get("entropy_rule", "fixed")), "scope": str(merged.get("entropy_filter_scope", "all")),
            "gamma": float(gamma) if gamma is not None else (0.1 if loss == "gtpo" else 0.0), "loss": loss,
            "completions": int(merged.get("group_size", 8)) * int(merged.get("prompts_per_step", 1))}


# ------------------------------------------------------------------ what the filter did
def _runs(name: str) -> tuple[dict, ...]:
    """The runs (records with steps and an argv) of ``experiments/data/<name>``; () if absent. Read once per
    process (:func:`functools.lru_cache`): the records are not to be changed."""
    return _read(os.path.join(DATA, name))


@functools.lru_cache(maxsize=None)
def _read(path: str) -> tuple[dict, ...]:
    if not os.path.isfile(path):
        return ()
    return tuple(r for r in read_jsonl_gz(path) if r.get("steps") and r.get("argv"))


def _fingerprint(run: dict) -> tuple:
    return (run["arm"], tuple(tuple(sorted(s.items())) for s in run["steps"]))


def scale_runs(scale: str) -> list[tuple[str, dict]]:
    """``(file, run)`` of every run of ``scale``'s files, a run copied into a later file (the same arm and the same
    per-step metrics: claim7c.jsonl.gz carries the first design's final GRPO and GTPO runs) counted once, in the
    first file that has it."""
    seen, out = set(), []
    for name in FILES[scale]:
        for r in _runs(name):
            fp = _fingerprint(r)
            if fp not in seen:
                seen.add(fp)
                out.append((name, r))
    return out


def entropy_trend(scale: str = "tiny", window: int = 10) -> dict:
    """Runs of ``scale`` with the gamma shift on: ``n``, the median over runs of the ratio of the mean token entropy
    of the last ``window`` steps to that of the first ``window``, how many runs rose (ratio > 1) and the largest
    ratio."""
    ratios = []
    for _, r in scale_runs(scale):
        if run_settings(r["argv"])["gamma"] > 0 and len(r["steps"]) >= 2 * window:
            e = [s["entropy/mean"] for s in r["steps"]]
            ratios.append(statistics.mean(e[-window:]) / statistics.mean(e[:window]))
    return {"n": len(ratios), "median": statistics.median(ratios) if ratios else float("nan"),
            "rose": sum(1 for x in ratios if x > 1), "max": max(ratios, default=float("nan")), "window": window}


def run_activity(run: dict, collapse: int | None = None) -> dict:
    """One run: ``steps``, ``completions`` (steps x batch), ``dropped`` (completions the filter dropped:
    filtered_frac x batch, rounded, summed over steps), ``steps_dropping``, ``dropped_before`` (those of the steps
    before ``collapse``, the run's collapse step; all when None), ``max_entropy`` (largest step mean token entropy)
    and ``above`` ({x: steps whose mean token entropy exceeds x} for x in :data:`TAUS`)."""
    st = run_settings(run["argv"])
    b = st["completions"]
    ents = [s["entropy/mean"] for s in run["steps"] if isinstance(s.get("entropy/mean"), (int, float))
            and math.isfinite(s["entropy/mean"])]
    drops = [(int(s.get("step", i + 1)), round(s.get("gtpo/filtered_frac", 0.0) * b)) for i, s in enumerate(run["steps"])]
    return {"steps": len(run["steps"]), "completions": b * len(run["steps"]), "dropped": sum(d for _, d in drops),
            "steps_dropping": sum(1 for _, d in drops if d > 0),
            "dropped_before": sum(d for t, d in drops if collapse is None or t < collapse),
            "max_entropy": max(ents) if ents else float("nan"),
            "above": {x: sum(1 for e in ents if e > x) for x in TAUS},
            "above_before": {x: sum(1 for i, s in enumerate(run["steps"]) if isinstance(s.get("entropy/mean"), float)
                                    and s["entropy/mean"] > x and (collapse is None or int(s.get("step", i + 1)) < collapse))
                             for x in TAUS}}


def activity(scale: str) -> list[dict]:
    """Per (data file, arm) of ``scale`` whose runs have the filter on: its settings, runs, and the sums of
    :func:`run_activity` (``runs_dropping``: runs with a drop; ``runs_dropping_before``: with a drop before the
    run's collapse, where the claim-2 criterion applies, i.e. the stress runs)."""
    rows = []
    kept = scale_runs(scale)
    for name in FILES[scale]:
        runs = [r for f, r in kept if f == name]
        collapse = {}
        if scale == "stress":
            for r, o in zip(runs, stress_outcomes([{**r, "summary": r.get("summary") or {}} for r in runs])):
                collapse[id(r)] = o["time"] if o["collapsed"] else None
        by_arm: dict[str, list[dict]] = {}
        for r in runs:
            by_arm.setdefault(r["arm"], []).append(r)
        for arm, rs in by_arm.items():
            st = run_settings(rs[0]["argv"])
            if not st["filter"]:
                continue
            acts = [run_activity(r, collapse.get(id(r))) for r in rs]
            rows.append({"file": name, "arm": arm, "settings": st, "runs": len(rs),
                         "collapsed": sum(1 for r in rs if collapse.get(id(r)) is not None),
                         **{k: sum(a[k] for a in acts) for k in ("steps", "completions", "dropped", "steps_dropping",
                                                                  "dropped_before")},
                         "runs_dropping": sum(1 for a in acts if a["dropped"] > 0),
                         "runs_dropping_before": sum(1 for a in acts if a["dropped_before"] > 0),
                         "max_entropy": max(a["max_entropy"] for a in acts),
                         "above": {x: sum(a["above"][x] for a in acts) for x in TAUS},
                         "above_before": {x: sum(a["above_before"][x] for a in acts) for x in TAUS}})
    return rows


def all_steps_entropy(scale: str) -> dict:
    """Every run of ``scale`` (filter on or off): ``runs``, ``steps``, ``max_entropy`` (largest step mean token
    entropy) and ``above`` ({x: steps above x})."""
    acts = [run_activity(r) for _, r in scale_runs(scale)]
    return {"runs": len(acts), "steps": sum(a["steps"] for a in acts),
            "max_entropy": max((a["max_entropy"] for a in acts), default=float("nan")),
            "above": {x: sum(a["above"][x] for a in acts) for x in TAUS}}


# ------------------------------------------------------------------ SmolLM2: the filter at 0.7 against none
def smol_filter_pair() -> dict | None:
    """The SmolLM2 arms of :data:`SMOL_FILTER_PAIR` paired by seed (the first with the fixed tau 0.7 filter, which
    acts there; the second under the <H>_ini rule, which leaves the filter off): per outcome (``entropy_last5``:
    mean token entropy of the last 5 steps; ``accuracy_after``: greedy held-out accuracy after training) the
    paired t-test of first minus second and its MDD (:func:`stats.mdd_paired` at :data:`ALPHA`, power
    :data:`POWER`); ``start_entropy`` (median step-1 mean token entropy of both arms) and ``dropped_share``
    (completions the filter dropped, share of all in the filter arm)."""
    runs = [r for r in _runs("smol.jsonl.gz") if r["arm"] in SMOL_FILTER_PAIR]
    per = {a: {r["seed"]: r for r in runs if r["arm"] == a} for a in SMOL_FILTER_PAIR}
    seeds = sorted(set(per[SMOL_FILTER_PAIR[0]]) & set(per[SMOL_FILTER_PAIR[1]]))
    if len(seeds) < 3:
        return None
    out = {"seeds": seeds, "steps": len(per[SMOL_FILTER_PAIR[0]][seeds[0]]["steps"])}

    def ent_last(r):
        return statistics.mean(s["entropy/mean"] for s in r["steps"][-5:])

    for key, f in (("entropy_last5", ent_last), ("accuracy_after", lambda r: r["summary"]["accuracy_after"])):
        diffs = [f(per[SMOL_FILTER_PAIR[0]][s]) - f(per[SMOL_FILTER_PAIR[1]][s]) for s in seeds]
        t = stats.paired_t(diffs)
        out[key] = {"diffs": diffs, "t": t, "mdd": stats.mdd_paired(t["sd"], len(seeds), alpha=ALPHA, power=POWER),
                    "means": [statistics.mean(f(per[a][s]) for s in seeds) for a in SMOL_FILTER_PAIR]}
    out["start_entropy"] = statistics.median(per[a][s]["steps"][0]["entropy/mean"] for a in SMOL_FILTER_PAIR for s in seeds)
    acts = [run_activity(per[SMOL_FILTER_PAIR[0]][s]) for s in seeds]
    out["dropped_share"] = sum(a["dropped"] for a in acts) / sum(a["completions"] for a in acts)
    out["cpu_per_step"] = statistics.median(r["timing"]["cpu_s"] / len(r["steps"]) for r in runs)
    return out


# ------------------------------------------------------------------ claim 6 on the stress grid
def claim6_collapse(replicate_runs: dict[str, list[dict]]) -> dict:
    """Per stress replicate and reference arm: the log-rank test of :data:`C6_ARM` against it, stratified by learning
    rate over the rates both ran, with the collapses, events, the power to detect a hazard ratio of
    :data:`HAZARD_RATIO` and the smallest ratio detectable with :data:`POWER`."""
    out = {}
    for rep, runs in replicate_runs.items():
        outc = stress_outcomes(runs)
        for ref in C6_REFS:
            rates = sorted({o["lr"] for o in outc if o["arm"] == C6_ARM} & {o["lr"] for o in outc if o["arm"] == ref})
            both = [o for o in outc if o["arm"] in (C6_ARM, ref) and o["lr"] in rates]
            if not both:
                continue
            lr_res = stats.logrank([o["time"] for o in both], [int(o["collapsed"]) for o in both],
                                   [o["arm"] for o in both], strata=[o["lr"] for o in both])
            i = lr_res["groups"].index(C6_ARM)
            events = sum(o["collapsed"] for o in both)
            out[(rep, ref)] = {"rates": rates, "chi2": lr_res["chi2"], "p": lr_res["p"],
                               "observed": lr_res["observed"][i], "expected": lr_res["expected"][i],
                               "collapsed": (sum(o["collapsed"] for o in both if o["arm"] == C6_ARM),
                                             sum(1 for o in both if o["arm"] == C6_ARM),
                                             sum(o["collapsed"] for o in both if o["arm"] == ref),
                                             sum(1 for o in both if o["arm"] == ref)),
                               "events": events, "power": stats.logrank_power(events, HAZARD_RATIO, alpha=ALPHA),
                               "min_hr": stats.min_detectable_hazard_ratio(events, alpha=ALPHA, power=POWER)}
    return out


# ------------------------------------------------------------------ claim 4: the declared long-horizon design
def horizon(c7b_res: dict | None, records: list[dict] | None = None) -> dict:
    """The claim-4 design's power (declared; recomputed here) and, once it has data, its outcome.

    ``power``: {p: chance of the :func:`stats.min_differing_pairs` discordant pairs among the design's seeds when a
    share p of the no-filter runs cross ln 2 and no GTPO run does}; ``bound``: the crossing probability excluded
    when none crosses (:meth:`Horizon.upper_bound`); ``sd``/``mdd``: the paired SD of the nearest committed
    comparison (claim-7 attribution, official GTPO minus GTPO with gamma 0, sampled held-out pass@1) and the MDD of
    held-out pass@1 with the design's seeds. With ``records`` (the data file's final runs; a seed's missing
    no-filter run is its GTPO run, by the stopping rule): ``pairs`` {seed: (GTPO crossed, no-filter crossed)},
    ``verdict`` and ``p`` (:meth:`Horizon.verdict`), ``collapsed`` {seed: (GTPO, no-filter)}, ``check`` (the
    declaration check) and ``identical`` (the check seed's no-filter run reproduced its GTPO run, where the filter
    never acted)."""
    n, k = len(HORIZON.seeds), stats.min_differing_pairs(HORIZON.alpha)
    out: dict = {"n": n, "k": k, "power": {p: stats.differing_pairs_power(n, p, k) for p in (0.5, 0.6, 0.7, 0.8)},
                 "bound": HORIZON.upper_bound(n)}
    ref = (c7b_res or {}).get(("gtpo", "gtpo_gamma0", "sampled", "pass@1"))
    if ref:
        out["sd"], out["n_sd"] = ref["t"]["sd"], len(ref["seeds"])
        out["mdd"] = stats.mdd_paired(ref["t"]["sd"], n, alpha=HORIZON.alpha, power=POWER)
    if not records:
        return out
    by = {(r["arm"], r["seed"]): r for r in records}
    pairs, collapsed = {}, {}
    for s in HORIZON.seeds:
        f = by.get((HORIZON.filter_arm, s))
        if f is None:
            continue
        nf = by.get((HORIZON.nofilter_arm, s), f if not HORIZON.acted(f["steps"]) else None)
        if nf is None:
            continue

        def ent(r):
            return [x["entropy/mean"] for x in r["steps"]]

        pairs[s] = (HORIZON.crossed(ent(f)), HORIZON.crossed(ent(nf)))
        collapsed[s] = tuple(HORIZON.collapsed([x["reward/mean"] for x in r["steps"]], bool(r.get("stopped")))
                             for r in (f, nf))
    out["pairs"], out["collapsed"] = pairs, collapsed
    n_gtpo = sum(1 for s in HORIZON.seeds if (HORIZON.filter_arm, s) in by)
    # a pair is complete when its no-filter run is not needed (the filter never acted) or has finished; the check
    # seed always runs both arms
    n_pairs = sum(1 for s in pairs if s != HORIZON.check_seed or (HORIZON.nofilter_arm, s) in by)
    if n_gtpo == n and n_pairs == n:  # the stopping rule: the test once every declared run has finished
        out["verdict"], out["p"] = HORIZON.verdict(list(pairs.values()))
    else:
        out["running"] = {"gtpo": n_gtpo, "pairs": n_pairs}
    out["check"] = check_runs(records, os.path.basename(HORIZON.data))
    c = HORIZON.check_seed
    if (HORIZON.filter_arm, c) in by and (HORIZON.nofilter_arm, c) in by and not HORIZON.acted(by[(HORIZON.filter_arm, c)]["steps"]):
        out["identical"] = by[(HORIZON.filter_arm, c)]["steps"] == by[(HORIZON.nofilter_arm, c)]["steps"]
    return out


def _horizon_text(h: dict, cost_h: float) -> str:
    pw = "; ".join(f"{100 * v:.3g} % at p = {p:g}" for p, v in h["power"].items())
    text = [f"**Declared design for claim 4** (`experiments/protocol/claim4.py`, `designs/{HORIZON.text}`"
            + ("" if "pairs" in h else "; not run yet") + f"). Power, recomputed: an exact McNemar test on {h['n']} pairs needs {h['k']} discordant "
            f"pairs for p < {HORIZON.alpha}; if a share p of the no-filter runs cross ln 2 and no GTPO run does, "
            f"the chance of that is {pw}; if none crosses, a crossing probability above {100 * h['bound']:.0f} % is "
            f"excluded (95 %)."
            + (f" Held-out pass@1: paired SD {100 * h['sd']:.2f} points in the nearest committed comparison (GTPO "
               f"minus GTPO with γ 0, {h['n_sd']} seeds, 150 steps), so an MDD of {100 * h['mdd']:.1f} points with "
               f"{h['n']} pairs at α = {HORIZON.alpha}, power {100 * POWER:.0f} %." if "mdd" in h else "")
            + f" Cost at the committed per-step time: {cost_h:.2f} CPU-hours a run.\n",
            design_paragraph(HORIZON)]
    if "running" in h:
        r = h["running"]
        text.append(f"**Running:** {r['gtpo']} of {h['n']} GTPO runs finished, {r['pairs']} of {h['n']} pairs complete; "
                    "by the stopping rule no test is computed before all. " + describe(h["check"]) + ".\n")
    elif "pairs" in h:
        nf = sum(1 for _, x in h["pairs"].values() if x)
        fi = sum(1 for x, _ in h["pairs"].values() if x)
        text.append(f"**Result: {h['verdict']}.** {len(h['pairs'])} pairs: the entropy crossed ln 2 in {nf} no-filter "
                    f"and {fi} GTPO runs (exact McNemar p = {fmt_p(h['p'])}); collapsed "
                    f"{sum(1 for _, x in h['collapsed'].values() if x)} vs {sum(1 for x, _ in h['collapsed'].values() if x)}. "
                    f"{describe(h['check'])}."
                    + (f" The check seed's no-filter run {'reproduced' if h['identical'] else 'did NOT reproduce'} its "
                       "GTPO run step for step." if "identical" in h else "") + "\n")
    return "\n".join(text)


# ------------------------------------------------------------------ claim 5: the declared OnlyNeg design on SmolLM2
def onlyneg(pair: dict | None, records: list[dict] | None = None) -> dict:
    """The claim-5 design's power (declared; recomputed from the committed SmolLM2 pair :func:`smol_filter_pair`:
    its paired sd of accuracy after training and of the last-5-step entropy, with the design's seeds) and, once it
    has data, its result: ``diffs`` (OnlyNeg minus full filter, accuracy after, per seed), ``verdict`` and ``t``
    (:meth:`OnlyNeg.verdict`), ``mdd_own`` (the MDD from the design's own pairs), ``check``."""
    n = len(ONLYNEG.seeds)
    out: dict = {"n": n}
    if pair:
        for key in ("accuracy_after", "entropy_last5"):
            sd = pair[key]["t"]["sd"]
            out[key] = {"sd": sd, "n_sd": len(pair["seeds"]), "mdd": stats.mdd_paired(sd, n, alpha=ONLYNEG.alpha,
                                                                                     power=POWER)}
    if not records:
        return out
    by = {(r["arm"], r["seed"]): r for r in records}
    seeds = [s for s in ONLYNEG.seeds if (ONLYNEG.full, s) in by and (ONLYNEG.onlyneg, s) in by]
    diffs = [by[(ONLYNEG.onlyneg, s)]["summary"]["accuracy_after"] - by[(ONLYNEG.full, s)]["summary"]["accuracy_after"]
             for s in seeds]
    out["seeds"], out["diffs"] = seeds, diffs
    if len(diffs) == n:  # the stopping rule: the test once every declared pair has finished
        out["verdict"], out["t"] = ONLYNEG.verdict(diffs)
        out["mdd_own"] = stats.mdd_paired(out["t"]["sd"], len(diffs), alpha=ONLYNEG.alpha, power=POWER)
    else:
        out["running"] = len(diffs)
    out["check"] = check_runs(records, os.path.basename(ONLYNEG.data))
    return out


def _onlyneg_text(o: dict) -> str:
    a, e = o.get("accuracy_after"), o.get("entropy_last5")
    text = [f"**Declared design for claim 5** (`experiments/protocol/claim5.py`, `designs/{ONLYNEG.text}`"
            + ("" if "seeds" in o else "; not run yet") + f"). Power, recomputed from the committed SmolLM2 pair "
            "(fixed τ 0.7 filter minus no filter, same settings)"
            + (f": accuracy after training, paired SD {100 * a['sd']:.1f} points ({a['n_sd']} seeds), so an MDD of "
               f"{100 * a['mdd']:.1f} points with {o['n']} pairs; last-5-step entropy, SD {e['sd']:.3f} nats, MDD "
               f"{e['mdd']:.3f}; α = {ONLYNEG.alpha}, power {100 * POWER:.0f} %." if a else ": not available.") + "\n",
            design_paragraph(ONLYNEG)]
    if "running" in o:
        text.append(f"**Running:** {o['running']} of {o['n']} pairs finished; by the stopping rule no test is computed "
                    f"before all. {describe(o['check'])}.\n")
    if "verdict" in o:
        t = o["t"]
        text.append(f"**Result: {o['verdict']}.** OnlyNeg minus full filter, accuracy after training: "
                    f"{100 * t['mean']:+.1f} points on {len(o['diffs'])} seeds (95 % CI {100 * t['lo']:+.1f} to "
                    f"{100 * t['hi']:+.1f}; paired t = {t['t']:.2f}, p = {fmt_p(t['p'])}; MDD from these pairs "
                    f"{100 * o['mdd_own']:.1f}). {describe(o['check'])}.\n")
    return "\n".join(text)


# ------------------------------------------------------------------ the section
def _act_rows(rows: list[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        st = r["settings"]
        filt = (f"τ {st['tau']:.3g} ({st['rule']}" + (", OnlyNeg" if st["scope"] == "negative" else "") + ")")
        out.append([f"`{r['file']}`", f"`{r['arm']}`", filt, f"{st['gamma']:g}", str(r["runs"]),
                    f"{r['completions']:,}", f"{r['dropped']:,}", f"{r['steps_dropping']} of {r['steps']:,}",
                    f"{r['runs_dropping']}" + (f" ({r['runs_dropping_before']} before collapse; {r['collapsed']} collapsed)"
                                               if r["file"].startswith("stress") else ""),
                    f"{r['max_entropy']:.3f}", " / ".join(str(r["above"][x]) for x in TAUS)])
    return out


def _sum(rows, key, pred=lambda r: True):
    return sum(r[key] for r in rows if pred(r))


def section(c7b_res: dict | None = None) -> tuple[str, dict]:
    """The section's markdown and its results (``verdicts``: {3: ..., 4: ..., 5: ..., 6: ...}, each a
    (label, sentence) pair; ``readme``: the README table's row)."""
    res: dict = {"act": {s: activity(s) for s in FILES}, "all": {s: all_steps_entropy(s) for s in FILES}}
    tiny, stress, smol = res["act"]["tiny"], res["act"]["stress"], res["act"]["smol"]
    if not tiny:
        return "", res
    t_comp, t_drop, t_runs = _sum(tiny, "completions"), _sum(tiny, "dropped"), _sum(tiny, "runs")
    t_all = res["all"]["tiny"]
    sb = [r for r in stress if r["file"] == "stress-b.jsonl.gz"]
    s_runs, s_drop_runs, s_before = _sum(stress, "runs"), _sum(stress, "runs_dropping"), _sum(stress, "runs_dropping_before")
    s_comp, s_drop = _sum(stress, "completions"), _sum(stress, "dropped")
    s_before_c = _sum(stress, "dropped_before")
    s_above = sum(r["above"][1.05] for r in stress)
    s_above_before = sum(r["above_before"][1.05] for r in stress)
    pair = res["smol_pair"] = smol_filter_pair()
    c7_cpu = statistics.median(r["timing"]["cpu_s"] / len(r["steps"]) for _, r in scale_runs("tiny") if r.get("timing"))
    trend = res["trend"] = entropy_trend("tiny")
    trend_txt = (f"the mean token entropy of the last {trend['window']} steps is a median {trend['median']:.2f} times that "
                 f"of the first {trend['window']} in the {trend['n']} tiny runs with γ 0.1, higher in {trend['rose']} "
                 f"of them (at most {trend['max']:.2f} times)")
    res["tiny_cpu_per_step"] = c7_cpu
    inactive = t_drop == 0
    tiny_drop = (f"on the tiny model's claim-7 runs with the filter on ({t_runs} runs, {t_comp:,} completions) it dropped "
                 f"{t_drop} completions")
    tiny_ent = (f"the largest step mean token entropy of all {t_all['runs']} tiny claim-7 runs is "
                f"{t_all['max_entropy']:.3f} nats ({t_all['above'][LN2]} of {t_all['steps']:,} steps above ln 2)")
    tiny_line = f"{tiny_drop}; {tiny_ent}"
    # the stress grid's replicate b, official GTPO: the share of runs in which a threshold above 0.7 could change
    # anything (a drop at 0.7), and the seeds a paired threshold design would need to see enough differing pairs
    off_b = next((r for r in sb if r["arm"] == "gtpo_official"), None)
    q = off_b["runs_dropping"] / off_b["runs"] if off_b else float("nan")
    k_min = stats.min_differing_pairs(ALPHA)
    n_need = stats.seeds_for_differing_pairs(q, k_min, POWER) if off_b and q > 0 else None
    s_cpu = statistics.median(r["timing"]["cpu_s"] for r in _runs("stress-b.jsonl.gz") if r.get("timing"))
    res["threshold_power"] = {"q": q, "k_min": k_min, "n_need": n_need, "cpu_s": s_cpu}
    stress_line = (f"on the stress model ({s_runs} filter-on runs, {s_comp:,} completions) it dropped {s_drop:,} "
                   f"completions in {s_drop_runs} runs ({s_before} of them with a drop before the run's collapse or "
                   f"without one; {s_before_c:,} completions there); of those runs' {s_above:,} steps with a mean entropy above 1.05, "
                   f"{s_above_before} come before the run's collapse or in a run without one")
    # ---- claim 3
    if inactive:
        body3 = (f"At τ 0.7 the filter drops nothing where training is stable: {tiny_line}. A step without a completion "
                 "above 0.7 is the same update at τ 0.7, 1.05 and 2.0, so on this model the three thresholds are one "
                 f"run, and over 150 steps the claimed drift toward ln 2 does not start: {trend_txt}. On the tiny "
                 f"model the filter acts only in the collapse study: {stress_line}.")
        if off_b and n_need:
            body3 += (f" There a threshold could change official GTPO's run in {off_b['runs_dropping']} of its "
                      f"{off_b['runs']} runs on replicate b (q = {q:.2f}, over its rates x3-x15); every other pair of a τ 0.7 vs 2.0 design is "
                      f"the same run (difference 0), so the mean difference of any outcome is at most q times its "
                      f"range, and an exact two-sided paired test needs at least {k_min} differing pairs to reach "
                      f"p < {ALPHA} (sign test, 2 x 0.5^{k_min} = {2 * 0.5 ** k_min:.3f}): {n_need} runs per arm for an "
                      f"{100 * POWER:.0f} % chance of that many, even for an effect of the same sign in every differing pair. Such a "
                      f"design would be cheap ({2 * n_need} runs of about {s_cpu:.0f} CPU-s: "
                      f"{2 * n_need * s_cpu / 3600:.1f} CPU-hours, on a rebuilt stress model, a new replicate), but "
                      f"it could only see an effect confined to the {100 * q:.0f} % of high-rate stress runs where the filter "
                      "acts, not the paper's drift in stable training; none is declared.")
        v3 = ("not testable here: the filter does not act in stable training at this scale", body3)
    else:
        v3 = ("not decided: the filter acts on the tiny model; a design is needed", tiny_line + ".")
    if pair:
        e, a = pair["entropy_last5"], pair["accuracy_after"]
        v3 = (v3[0], v3[1] + (
            f" On SmolLM2 the filter does act (the fixed τ 0.7 arm dropped {100 * pair['dropped_share']:.1f} % of its "
            f"completions), but there the entropy starts above ln 2 (median {pair['start_entropy']:.3f} nats at step 1, "
            "temperature 0.7) and the task has no format reward, so the claim's premise (an entropy below ln 2 "
            "drifting up to it, format lost) does not arise; what the committed runs do show, over "
            f"{pair['steps']} steps on {len(pair['seeds'])} paired seeds, τ 0.7 against no filter (the <H>_ini rule "
            f"leaves it off): mean entropy of the last 5 steps {e['means'][0]:.3f} vs {e['means'][1]:.3f} (paired t = "
            f"{e['t']['t']:.2f}, p = {fmt_p(e['t']['p'])}, MDD {e['mdd']:.3f} nats at α = {ALPHA}, power {100 * POWER:.0f} %); "
            f"greedy accuracy after {100 * a['means'][0]:.1f} % vs {100 * a['means'][1]:.1f} % (t = {a['t']['t']:.2f}, "
            f"p = {fmt_p(a['t']['p'])}, MDD {100 * a['mdd']:.1f} points). Exploratory: this pair was not declared "
            "for claim 3, and τ 1.05 and 2.0 never ran there."))
    # ---- claim 4
    steps_needed = HORIZON.steps
    cost_h = steps_needed * c7_cpu / 3600.0
    res["claim4_cost_h"] = cost_h
    recs = [r for r in read_jsonl_gz(HORIZON.data) if r["kind"] == "final"] if os.path.isfile(HORIZON.data) else []
    h = res["horizon"] = horizon(c7b_res, recs)
    if "verdict" in h:
        label4 = f"{h['verdict']} (declared design, {len(h['pairs'])} of {h['n']} pairs, McNemar p = {fmt_p(h['p'])})"
    else:
        label4 = (f"testable with new runs: a design is declared ({h['n']} paired seeds x {steps_needed} steps on the "
                  f"tiny model, power {100 * h['power'][0.6]:.0f} % if 60 % of no-filter runs cross ln 2), "
                  + (f"running ({h['running']['gtpo']} of {h['n']} GTPO runs finished)" if "running" in h else "not run yet"))
    v4 = (label4,
          f"With the filter never acting (claim 3), every claim-7 GTPO run is also a run of γ 0.1 without the filter "
          f"(the same updates), and so are the attribution's GRPO + γ runs (filter off): over 150 steps {tiny_ent}, and "
          f"{trend_txt}. The paper's climb past ln 2 and collapse come near step {steps_needed}, 30 times longer: one "
          f"such run of the tiny model takes about {cost_h:.2f} CPU-hours at the committed median {c7_cpu:.2f} CPU-s "
          "per step, within this machine's reach, so the design below runs GTPO with and without the filter for "
          f"{steps_needed} steps; where GTPO's filter never acts the two arms are one run, so the no-filter arm runs "
          "only where it acted, plus a check seed."
          + (f" SmolLM2's runs (30-40 steps, {pair['cpu_per_step']:.0f} CPU-s per step) are no nearer that horizon."
             if pair else ""))
    # ---- claim 5
    recs5 = read_jsonl_gz(ONLYNEG.data) if os.path.isfile(ONLYNEG.data) else []
    o = res["onlyneg"] = onlyneg(pair, recs5)
    if "verdict" in o:
        label5 = f"{o['verdict']} (declared design on SmolLM2, {len(o['diffs'])} pairs, p = {fmt_p(o['t']['p'])})"
    elif inactive:
        label5 = ("not testable on the tiny model (the filter does not act there); testable on SmolLM2, where it "
                  f"does: a design is declared ({o['n']} paired seeds, MDD "
                  + (f"{100 * o['accuracy_after']['mdd']:.0f} points of accuracy" if "accuracy_after" in o else "n/a")
                  + "), " + (f"running ({o['running']} of {o['n']} pairs finished)" if "running" in o else "not run yet"))
    else:
        label5 = "not decided"
    v5 = (label5,
          "OnlyNeg is selectable (`entropy_filter_scope: negative`, docs/config.md) but never ran. It drops a subset of "
          "what the full filter drops, so where the full filter drops nothing the two are the same run: "
          f"{tiny_line}. On the stress model the full filter acts only in {s_drop_runs} of {s_runs} runs "
          f"({s_before} of them with a drop outside a collapse)"
          + (f"; on SmolLM2 it acts ({100 * pair['dropped_share']:.1f} % of completions at τ 0.7), so the design "
             "below compares the two there" if pair else "")
          + ". The stress grid's `neg_only` arm is another thing: GRPO trained on negative completions only "
          "(`completion_sign: negative`), not the filter restricted to them.")
    # ---- claim 6
    reps = {k: [r for r in _runs(f) if r["arm"] in (C6_ARM, *C6_REFS)] for k, f in
            (("a", "stress.jsonl.gz"), ("b", "stress-b.jsonl.gz"))}
    c6 = res["c6"] = claim6_collapse({k: v for k, v in reps.items() if v})
    fg = next((r for r in sb if r["arm"] == C6_ARM), None)
    b_g, b_o = c6.get(("b", "grpo")), c6.get(("b", "gtpo_official"))
    acc = ""
    key = ("sampled", "pass@1")
    if c7b_res and ("gtpo", "grpo_gamma", *key) in c7b_res:
        g, gg = c7b_res[("gtpo", "grpo_gamma", *key)], c7b_res[("grpo_gamma", "grpo", *key)]
        acc = (f" Accuracy (the claim-7 attribution's GRPO + γ, filter off; with the filter on at τ 0.7 the runs would "
               "be the same wherever no completion exceeds 0.7, as in every filter-on run of that model, though not "
               f"checked in this arm): GTPO minus GRPO + γ {100 * g['mean']:+.2f} points of sampled pass@1 on "
               f"{len(g['seeds'])} seeds (Wilcoxon p = {fmt_p(g['wilcoxon']['p'])}, MDD {100 * g['mdd']:.1f}); "
               f"GRPO + γ minus GRPO {100 * gg['mean']:+.2f} (p = {fmt_p(gg['wilcoxon']['p'])}, MDD "
               f"{100 * gg['mdd']:.1f}).")
    if b_g:
        ca, na, cg, ng = b_g["collapsed"]
        stab = b_g["p"] < ALPHA and b_g["observed"] < b_g["expected"]
        below = None
        if acc:
            below = g["wilcoxon"]["p"] < ATTRIBUTION.alpha and g["mean"] > 0
        res["c6_label"] = {"stabilised": stab, "below_gtpo": below}
        label6 = ((f"stabilised on the stress grid (log-rank p = {fmt_p(b_g['p'])})" if stab else
                   f"no stabilisation detected on the stress grid (power {100 * b_g['power']:.0f} % for a halved hazard; "
                   "there the filter barely acts, so the arm is in effect GRPO + γ)")
                  + (f"; in accuracy {'below' if below else 'not shown below'} GTPO (GTPO minus GRPO + γ "
                     f"{100 * g['mean']:+.2f} points, p = {fmt_p(g['wilcoxon']['p'])}, MDD {100 * g['mdd']:.1f})"
                     if below is not None else ""))
        v6 = (label6,
              f"On replicate b of the stress grid GRPO + filter + γ collapsed in {ca} of {na} runs against GRPO's {cg} of "
              f"{ng} (log-rank stratified by rate, χ² = {b_g['chi2']:.2f}, p = {fmt_p(b_g['p'])}; {b_g['events']} "
              f"events: power {100 * b_g['power']:.0f} % to detect a halved hazard, hazard ratio {b_g['min_hr']:.2f} "
              f"detectable with {100 * POWER:.0f} % power at α = {ALPHA})"
              + (f" and against official GTPO's {b_o['collapsed'][2]} of {b_o['collapsed'][3]} (χ² = {b_o['chi2']:.2f}, "
                 f"p = {fmt_p(b_o['p'])})" if b_o else "")
              + (f"; its filter dropped {fg['dropped']} of {fg['completions']:,} completions, in {fg['runs_dropping']} "
                 f"of its {fg['runs']} runs, so on this model the arm is in effect GRPO + γ" if fg else "")
              + ". The critical-rate ratio and replicate a are in claim 2's tables." + acc
              + (f" The accuracy threshold is the attribution's Bonferroni α = {ATTRIBUTION.alpha:.4f}." if acc else ""))
    else:
        v6 = ("not decided", "the stress grid's GRPO + filter + γ arm is not in the committed data.")
    res["verdicts"] = {3: v3, 4: v4, 5: v5, 6: v6}
    res["readme"] = readme_row(res)
    text = ["Claims 3-6 are the paper's ablations of the entropy control (docs/gtpo-method.md sections 5-6). What "
            "the filter did in every committed run where it was on: completions dropped (`gtpo/filtered_frac` x the "
            "step's completions), and steps whose mean token entropy exceeds ln 2, 1.05 and 2.0 (each such step had "
            "at least one completion above that value; a step that drops nothing at τ drops nothing at any larger "
            "threshold, nor under OnlyNeg).\n",
            table(["data", "arm", "filter", "γ", "runs", "completions", "dropped", "steps dropping",
                   "runs dropping", "max step entropy", "steps above ln 2 / 1.05 / 2.0"], _act_rows(tiny + stress + smol))
            + "\n"]
    names = {3: "Claim 3, the filter's threshold (τ 2.0 drifts toward ln 2 and loses format; 0.7 and 1.05 do not)",
             4: "Claim 4, γ without the filter (entropy climbs past ln 2; accuracy collapses near step 4500)",
             5: "Claim 5, OnlyNeg (filtering negative completions only over-prunes and does worse)",
             6: "Claim 6, GRPO + filter + γ (stabilised, but below GTPO)"}
    for k in (3, 4, 5, 6):
        label, body = res["verdicts"][k]
        text.append(f"**{names[k]}: {label}.** {body}\n")
        if k == 4:
            text.append(_horizon_text(res["horizon"], res["claim4_cost_h"]))
        if k == 5:
            text.append(_onlyneg_text(res["onlyneg"]))
    if c6:
        text.append(table(["replicate", "GRPO + filter + γ vs", "rates", "collapsed", "log-rank (stratified)", "events",
                           f"power at HR {HAZARD_RATIO}", f"HR detectable ({100 * POWER:.0f} %)"],
                          [[rep, STRESS_LABELS[ref], ", ".join(f"x{f:g}" for f in v["rates"]),
                            "{} of {} vs {} of {}".format(*v["collapsed"]), f"χ² = {v['chi2']:.2f}, p = {fmt_p(v['p'])}",
                            str(v["events"]), f"{100 * v['power']:.0f} %", f"{v['min_hr']:.2f}"]
                           for (rep, ref), v in sorted(c6.items())]) + "\n")
    return "\n".join(text), res


def readme_row(res: dict) -> str:
    """The README results table's row of claims 3-6: each claim's label."""
    short = {3: "thresholds", 4: "γ without filter", 5: "OnlyNeg", 6: "GRPO + filter + γ"}
    return ("| 3-6. entropy filter thresholds, γ without filter, OnlyNeg, GRPO + filter + γ | "
            + "; ".join(f"{k}. {short[k]}: {res['verdicts'][k][0]}" for k in (3, 4, 5, 6)) + " |")


def status_rows(res: dict) -> list[list[str]]:
    """The claim-4 and claim-5 designs' rows of "Where the protocol stands"."""
    h, o = res.get("horizon") or {}, res.get("onlyneg") or {}
    return [["claim 4, the long horizon (issue 45 item 2; declared)",
             (f"{h['running']['gtpo']} of {h['n']} GTPO runs, {h['running']['pairs']} of {h['n']} pairs complete (running). "
              if "running" in h else f"{len(h['pairs'])} of {h['n']} pairs. ") + describe(h["check"]) if "pairs" in h else
             f"declared, not run yet: {h.get('n', len(HORIZON.seeds))} paired seeds x {HORIZON.steps} steps",
             f"`experiments/data/{os.path.basename(HORIZON.data)}`" if "pairs" in h else "—"],
            ["claim 5, OnlyNeg on SmolLM2 (issue 45 item 2; declared)",
             f"{len(o['diffs'])} of {o['n']} pairs" + (" (running)" if "running" in o else "")
             + f". {describe(o['check'])}" if "check" in o else
             f"declared, not run yet: {o.get('n', len(ONLYNEG.seeds))} paired seeds x 2 arms",
             f"`experiments/data/{os.path.basename(ONLYNEG.data)}`" if "check" in o else "—"]]
