"""The verdict sentences of docs/results.md, generated from the section results (issue 32, item 4), and the
guard that keeps the remaining hand-written prose tied to the data it was written from.

Every verdict label and every number a verdict quotes is computed here from the results the report's
sections return, so a change of the data changes the sentence. The longer readings that stay hand-written
(``prose.VERDICTS``) name the data files they read in :data:`HAND_WRITTEN`; :func:`check_hand_written`
refuses to render them when one of those files no longer has the digest they were written against
(:data:`DIGESTS`), so they cannot silently go stale: reread, update the prose, then the digest.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import math
import os
import re
import statistics

from ..common import DATA
from .claim2 import critical_ratio_ci
from .tables import fmt_p

#: hand-written paragraphs of prose.VERDICTS -> the data files (globs under experiments/data) they read
HAND_WRITTEN = {
    "claim1_design": ("onestep/*.jsonl.gz",), "claim1": ("onestep/*.jsonl.gz",),
    "claim2": ("stress.jsonl.gz", "stress-b.jsonl.gz"), "claim2_b": ("stress-b.jsonl.gz",),
    "claim7": ("claim7.jsonl.gz",), "smol": ("smol.jsonl.gz",),
}
#: sha256 (first 16 hex digits) of each data file when its hand-written prose was last checked against it
DIGESTS = {
    "claim7.jsonl.gz": "43aeea943cd59f2f",
    "onestep/smol-start-natural-seed1.jsonl.gz": "04ab04e075c0d9f9",
    "onestep/smol-start-natural.jsonl.gz": "f06681955938ba01",
    "onestep/smol-start-short_neg-seed1.jsonl.gz": "9b3b40cf9827d7ea",
    "onestep/smol-start-short_neg.jsonl.gz": "f9622adf336ba2d6",
    "onestep/tiny-grpo150-natural.jsonl.gz": "1ce7e22681f6ccae",
    "onestep/tiny-grpo150-short_neg.jsonl.gz": "bb3d1d6a72e57003",
    "onestep/tiny-grpo150b-natural.jsonl.gz": "e38948c3e7fd1c93",
    "onestep/tiny-grpo50-natural.jsonl.gz": "70eb0202a5d4b4e8",
    "onestep/tiny-start-natural.jsonl.gz": "d94bb30a19ed4cba",
    "onestep/tiny-start-short_neg.jsonl.gz": "b3ee4eac6f50103d",
    "smol.jsonl.gz": "a23e539517f57442",
    "stress-b.jsonl.gz": "ef1c37baffc461b9",
    "stress.jsonl.gz": "9f3393732272fb49",
}


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def data_digests() -> dict[str, str]:
    out = {}
    for globs in HAND_WRITTEN.values():
        for g in globs:
            for p in sorted(glob.glob(os.path.join(DATA, g))):
                out[os.path.relpath(p, DATA)] = digest(p)
    return out


def check_hand_written(expected: dict[str, str] | None = None) -> None:
    """SystemExit naming the prose to reread if a data file it was written from changed (or is new)."""
    expected = DIGESTS if expected is None else expected
    now = data_digests()
    changed = sorted(f for f in set(now) | set(expected) if now.get(f) != expected.get(f))
    if changed:
        keys = sorted({k for k, globs in HAND_WRITTEN.items() for f in changed
                       if any(fnmatch.fnmatch(f, g) for g in globs)})
        raise SystemExit(f"report: the data of the hand-written verdicts {', '.join(keys)} changed ({', '.join(changed)}): "
                         "reread them, update report/prose.py's VERDICTS, then verdicts.DIGESTS (python -m "
                         "experiments.protocol.report.verdicts prints the digests)")


# ------------------------------------------------------------------ claim 1
def _g(res_arm: dict) -> str:
    return (f"median {res_arm['median']:+.1e} nats per token, lowered in {100 * res_arm['frac_neg']:.0f} % of "
            f"{res_arm['n']} groups, p = {fmt_p(res_arm['w0']['p'])}")


def claim1(one_res: dict) -> str:
    """Label and headline numbers of claim 1: GRPO's push on the conflict-run tokens of positive completions at
    equal step size, by variant, and the step size of the equal-learning-rate rows at SmolLM2's start."""
    key = ("unit", "conflict_pos")
    states = sorted({name for (name, mode, metric) in one_res if (mode, metric) == key})
    nat = [n for n in states if n.endswith("-natural") and "grpo" in one_res[(n, *key)]]
    ind = [n for n in states if n.endswith("-short_neg") and "grpo" in one_res[(n, *key)]]
    alpha = 0.05 / max(1, len(nat) + len(ind))

    def lowers(n):
        g = one_res[(n, *key)]["grpo"]
        return g["median"] < 0 and g["w0"]["p"] < alpha

    ind_low = [n for n in ind if lowers(n)]
    nat_low = [n for n in nat if lowers(n)]
    if nat_low:
        worst_nat = max(abs(one_res[(n, *key)]["grpo"]["median"]) for n in nat_low)
        least_ind = min(abs(one_res[(n, *key)]["grpo"]["median"]) for n in ind_low) if ind_low else float("nan")
        natural = (f"in natural groups GRPO lowers shared tokens detectably in only {len(nat_low)} of {len(nat)} states, "
                   f"by at most {worst_nat:.1e} nats per token (median), against at least {least_ind:.1e} under the "
                   "induced premise")
    else:
        natural = "in natural groups GRPO does not lower shared tokens here"
    label = ("reproduced under an induced premise (shorter wrong completions); " + natural
             if len(ind_low) == len(ind) and ind else "not reproduced under the induced premise")
    text = [f"**Verdict: {label}.** At equal step size (the first-order comparison), GRPO's change of the "
            f"conflict-run tokens of correct completions, Bonferroni over the {len(nat) + len(ind)} states "
            f"(p < {alpha:.4f}): induced premise (`short_neg`): "
            + "; ".join(f"`{n}` {_g(one_res[(n, *key)]['grpo'])}" for n in ind)
            + ". Natural groups: " + "; ".join(f"`{n}` {_g(one_res[(n, *key)]['grpo'])}" for n in nat) + "."]
    kls = [(n, arm, r["kl"]) for (n, mode, metric), arms in one_res.items()
           if n.startswith("smol-") and n.endswith("-short_neg") and mode == "adam" and metric == "conflict_pos"
           for arm, r in arms.items()]
    if kls:
        lo, hi = min(k for *_, k in kls), max(k for *_, k in kls)
        text.append(f"In SmolLM2's `short_neg` rows at equal learning rate the step moves the policy by KL(π_new‖π_old) "
                    f"= {lo:.2g} to {hi:.3g} (mean per arm, on the group's tokens: a first AdamW step from fresh moments "
                    "is sign-like, every LoRA weight moves by about the learning rate), far from a first-order step, so "
                    "there only the equal-step-size rows are evidence about the direction of the update.")
    return " ".join(text) + "\n"


# ------------------------------------------------------------------ claim 2
MASKED = ("grpo_masks", "gtpo_paper", "gtpo_official", "gtpo_gamma0", "gtpo_varying")


def _interval(lo: float, hi: float) -> str:
    return f"[{lo:.2f}, {'∞' if hi == math.inf else f'{hi:.2f}'}]"


def claim2(res_a: dict, res_b: dict, labels: dict) -> str:
    """Label and headline numbers of claim 2 over both stress replicates (never pooled)."""
    if not res_b:
        return ""
    ratios = {arm: v for (k, arm), v in ((k, v) for k, v in res_b.items() if isinstance(k, tuple) and len(k) == 2)
              if k == "crit_ratio"}
    contain = [a for a, (_, lo, hi) in ratios.items() if lo <= 1 <= hi]
    protective = [a for a in ratios if a not in ("pos_only", "neg_only")]
    outc_b = res_b["outcomes"]
    lrs_b = sorted({o["lr"] for o in outc_b})
    top = lrs_b[-1]
    lr15 = res_b.get(("logrank", "gtpo_official", (top,)))
    lr15_a = res_a.get(("logrank", "gtpo_official", (top,))) if res_a else None
    reach = max((hi for a, (_, lo, hi) in ratios.items() if a in protective), default=float("nan"))
    label = ("not reproduced at this scale: GTPO does not stay stable where GRPO collapses, and for no component of it "
             "is a shift detected in the learning rate at which collapses start (with the protocol's AdamW; the "
             f"critical-rate ratio intervals reach up to {reach:.2f}, so shifts that large are not excluded)"
             if all(a in contain for a in protective) and (lr15 is None or lr15["p"] >= 0.05) else
             "partly reproduced: see the critical-rate ratios")
    off = ratios.get("gtpo_official")
    seed1 = critical_ratio_ci(outc_b, "gtpo_official", "grpo", lrs_b, seed=1) if off else None
    below = sig = 0
    cells = 0
    for arm in MASKED:
        for f in lrs_b:
            xs = [o["entropy_ratio"] for o in outc_b if o["arm"] == arm and o["lr"] == f]
            ref = [o["entropy_ratio"] for o in outc_b if o["arm"] == "grpo" and o["lr"] == f]
            if not xs or not ref:
                continue
            cells += 1
            if statistics.median(xs) < statistics.median(ref):
                below += 1
                sig += res_b[("entropy_mw", arm, f)]["p"] < 0.05
    text = (f"**Verdict over both replicates: {label}.** On replicate b (every arm at every rate, x{lrs_b[0]:g}-x{top:g}, "
            f"{len(res_b['design']['seeds'])} seeds), {len([a for a in protective if a in contain])} of the "
            f"{len(protective)} protective arms have a critical rate whose ratio to GRPO's has a 95 % bootstrap interval "
            f"containing 1 (" + "; ".join(f"{labels[a]} {ratios[a][0]:.2f} {_interval(*ratios[a][1:])}" for a in protective)
            + ")")
    if off and seed1:
        text += (f"; for the official preset the interval's upper end depends on the bootstrap's seed ({off[2]:.2f} with "
                 f"seed 0, {seed1[1]:.2f} with seed 1), so no bound on how much later it could start collapsing is "
                 "claimed beyond that")
    if lr15:
        text += (f". At x{top:g} official GTPO and GRPO collapse alike on replicate b (log-rank p = {fmt_p(lr15['p'])})")
        if lr15_a:
            text += (f", so replicate a's later collapse of official GTPO there (p = {fmt_p(lr15_a['p'])}) does not "
                     "replicate")
    text += (f". What replicates is part of the mechanism: in {below} of the {cells} (arm, rate) cells of the "
             f"{len(MASKED)} arms with conflict masks the median entropy rise is below GRPO's ({sig} of them with "
             "Mann-Whitney p < 0.05, uncorrected); here the lower entropy does not buy stability.")
    return text + "\n"


# ------------------------------------------------------------------ claim 7 (first design)
def claim7_first(c7_res: dict, tune_lrs: tuple[float, ...], retuned: dict | None = None) -> str:
    """The first claim-7 design's reading, as the audit of issue 32 asks: the tuned-rate gain, GRPO's rate at
    its grid's edge (and what the re-tuning of the continuation, ``retuned`` = its results' ``tuned`` and
    ``tuned_cmp``, chose), and the equal-rate comparison against the report's own Bonferroni threshold."""
    if not c7_res or ("gtpo", "vs", "grpo", "pass@1") not in c7_res:
        return ""
    n_cmp = sum(1 for k in c7_res if isinstance(k, tuple) and len(k) == 4 and k[3] == "pass@1")
    alpha = 0.05 / n_cmp
    t = c7_res[("gtpo", "vs", "grpo", "pass@1")]
    k8 = c7_res[("gtpo", "vs", "grpo", "pass@8")]
    chosen = c7_res["chosen"]
    edge = chosen.get("grpo") == min(tune_lrs)
    same = c7_res.get(("gtpo", "vs", "grpo@samelr", "pass@1"))
    weaker = same is not None and same["wilcoxon"]["p"] >= alpha
    text = (f"**Verdict (first design): a pass@1 gain at tuned rates, not attributed"
            + (", and for the official preset not shown at equal rates" if weaker else "") + ".** "
            f"Official GTPO minus GRPO at their tuned rates: {100 * t['t']['mean']:+.2f} points of held-out pass@1 "
            f"(Wilcoxon p = {fmt_p(t['wilcoxon']['p'])}, below the Bonferroni threshold 0.05 / {n_cmp} = {alpha:.4f}); "
            f"pass@8 {100 * k8['t']['mean']:+.2f} (p = {fmt_p(k8['wilcoxon']['p'])}).")
    tuned = (retuned or {}).get("tuned") or {}
    if edge and "grpo" in tuned and "gtpo" in tuned:
        (g, g_in), (o, o_in) = tuned["grpo"], tuned["gtpo"]
        text += (f" GRPO's tuned rate ({chosen['grpo']:g}) is the lowest of its grid; the re-tuning (below: rates "
                 f"from 1.25e-5, six tuning seeds) chooses GRPO {g:g} ({'bracketed' if g_in else 'not bracketed'}) and "
                 f"GTPO {o:g} ({'bracketed' if o_in else 'not bracketed'})")
        c = retuned.get("tuned_cmp")
        text += (f", where official GTPO minus GRPO is {100 * c['mean']:+.2f} (p = {fmt_p(c['wilcoxon']['p'])})."
                 if c else ".")
    elif edge:
        text += (f" GRPO's tuned rate ({chosen['grpo']:g}) is the lowest of its grid, so its optimum is not bracketed.")
    if same:
        ok = same["wilcoxon"]["p"] < alpha
        text += (f" At GTPO's rate ({chosen['gtpo']:g}) the official preset's gain over GRPO is "
                 f"{100 * same['t']['mean']:+.2f} (p = {fmt_p(same['wilcoxon']['p'])}), which "
                 + ("survives" if ok else "does not survive") + " that threshold")
        paper = c7_res.get(("gtpo_paper", "vs", "grpo@samelr", "pass@1"))
        if paper:
            text += (f"; the paper preset's, {100 * paper['t']['mean']:+.2f} (p = {fmt_p(paper['wilcoxon']['p'])}), "
                     + ("survives it" if paper["wilcoxon"]["p"] < alpha else "does not"))
        text += "."
    return text + "\n"


def label(verdict: str) -> str:
    """The bold label of a generated verdict ("**Verdict ...: <label>.**" -> "<label>")."""
    m = re.match(r"\*\*(?:Verdict[^:]*: )?(.*?)\.?\*\*", verdict.strip())
    return m.group(1) if m else ""


def status(parts: list[tuple[str, str]], item5: str) -> str:
    """The paragraph under "Where the protocol stands": each claim's generated label, then item 5."""
    text = " ".join(f"**{name}:** {label(v)}." for name, v in parts if v and label(v))
    return f"{text} **The default run (item 5):** {item5}.\n"


def main() -> int:
    for f, d in sorted(data_digests().items()):
        print(f"{f}: {d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
