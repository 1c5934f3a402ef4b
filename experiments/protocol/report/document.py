"""docs/results.md from the committed raw data (experiments/data/*.jsonl.gz): no training.

    python -m experiments.protocol.report            # rewrites docs/results.md and docs/results/protocol/*.png

Every number in the file is computed from the data files by the section modules of this package (one per
claim: ``claim1``, ``claim2``, ``claim2_optimiser``, ``claims3to6``, ``claim7``, ``claim7_attribution``,
``claim7_confirm``, ``smol``, ``engines``; the claims 3-6 section also writes the README results table's row of
those claims); the verdict labels are generated (``verdicts``) and the longer readings are the hand-written
:data:`prose.VERDICTS` (edit them when the data change). This module puts the sections together in the document's order.
"""

from __future__ import annotations

import os
import sys

from ..claim2 import RELEASED, RELEASED_CONTINUED
from ..claim7 import ATTRIBUTION, CONTINUED, FIRST
from ..common import DATA
from ..declare import describe
from ..smol import DEFAULT_ARM
from . import claim2_optimiser, claim7_attribution, claim7_confirm, claims3to6, engines, tables, verdicts
from .claim1 import fig_onestep, load_onestep, onestep_section
from .claim2 import STRESS_FILES, STRESS_LABELS, _stress_design, fig_stress, stress_section
from .claim7 import C7_LABELS, claim7_section, fig_claim7
from .prose import VERDICTS
from .smol import SMOL_LABELS, _item5_state, fig_smol, smol_section
from .tables import design_paragraph, table


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
    rows = []
    if c7b_res:
        per = c7b_res["final"]
        rows.append(["claim 7 attribution (issue 32 item 1; declared, checked)",
                     "; ".join(f"{ATTRIBUTION.labels[a]}: {sum(1 for e in per[a].values() if e['own'])} run(s)"
                               for a in ATTRIBUTION.arms if a in per) + f". {describe(c7b_res['check'])}",
                     f"`experiments/data/{os.path.relpath(ATTRIBUTION.data, DATA)}`"])
    if c7b_res.get("check_c"):
        runs = [e for es in c7b_res["final"].values() for e in es.values() if e["own"]]
        rows.append(["claim 7 attribution continued (issue 32 item 1; declared, checked)",
                     f"branch {c7b_res.get('branch_c')}; {c7b_res['check_c']['n']} runs ({len(runs)} final runs of both "
                     f"designs pooled). {describe(c7b_res['check_c'])}",
                     f"`experiments/data/{os.path.relpath(CONTINUED.data, DATA)}`"])
    if opt_res:
        n_p, n_m = len(opt_res.get("pilot", [])), len(opt_res.get("main", []))
        rows.append(["claim 2 under the released optimiser (issue 32 item 2; declared, checked)",
                     f"pilot {n_p} runs, main grid {n_m} of {len(RELEASED.arms) * RELEASED.n_main * len(RELEASED.main_seeds)} "
                     f"runs. {describe(opt_res['check'])}", f"`experiments/data/{os.path.relpath(RELEASED.data, DATA)}`"])
    if opt_res.get("check_c"):
        rows.append(["claim 2 under the released optimiser continued: seeds 6-11 (issue 32 item 2; declared, checked)",
                     f"{opt_res['check_c']['n']} runs (2 of them the reproduction check), pooled above. "
                     f"{describe(opt_res['check_c'])}", f"`experiments/data/{os.path.relpath(RELEASED_CONTINUED.data, DATA)}`"])
    if opt_c_res:
        n_p, n_m = len(opt_c_res.get("pilot", [])), len(opt_c_res.get("main", []))
        rows.append(["claim 2 under the released optimiser, replicate c (issue 32 item 2; declared, checked)",
                     f"pilot {n_p} runs, main grid {n_m} of {len(RELEASED.arms) * RELEASED.n_main * len(RELEASED.main_seeds)} "
                     f"runs. {describe(opt_c_res['check'])}",
                     f"`experiments/data/{os.path.relpath(RELEASED_CONTINUED.data, DATA)}`"])
    return rows


def write_results(default_arm: str = DEFAULT_ARM) -> str:
    onestep = load_onestep()
    one_txt, one_res = onestep_section(onestep)
    smol_txt, smol_res = smol_section(default_arm)
    stress_txt, stress_res = stress_section("a")
    stress_b_txt, stress_b_res = stress_section("b")
    c7_txt, c7_res = claim7_section()
    verdicts.check_hand_written()
    c7b_txt, c7b_res = claim7_attribution.section()
    c7c_txt, c7c_res = claim7_confirm.section(c7b_res)
    c36_txt, c36_res = claims3to6.section(c7b_res)
    eng_txt, eng_res = engines.section()
    opt_txt, opt_res = claim2_optimiser.section("b")
    opt_c_txt, opt_c_res = claim2_optimiser.section("c")
    if opt_c_res:
        opt_c_res["pooled"] = claim2_optimiser.pooled(opt_res, opt_c_res)
    v1 = verdicts.claim1(one_res)
    v2 = verdicts.claim2(stress_res, stress_b_res, STRESS_LABELS)
    v7 = verdicts.claim7_first(c7_res, FIRST.tune_lrs, c7b_res)
    v7b = c7b_res.get("verdict", "")
    v2opt = claim2_optimiser.claim_verdict(opt_res, opt_c_res)
    status = verdicts.status([("Claim 1", v1), ("Claim 2", v2), ("Claim 2 under the released optimiser", v2opt),
                              *((f"Claim {k}", f"**Verdict: {c36_res['verdicts'][k][0]}.**") for k in (3, 4, 5, 6)
                                if c36_res.get("verdicts")),
                              ("Claim 7, first design", v7), ("Claim 7, attribution", v7b),
                              ("Claim 7, confirmation", c7c_res.get("verdict_text", ""))],
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
              + _new_design_rows(c7b_res, opt_res, opt_c_res) + [claim7_confirm.status_row(c7c_res), engines.status_row(eng_res)]
              + (claims3to6.status_rows(c36_res) if c36_res.get("verdicts") else [])) + "\n",
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
              "\n".join((design_paragraph(RELEASED), opt_res.get("verdict", ""), opt_txt)) if opt_res else "",
              "#### The continuation's declaration (seeds 6-11)\n" if opt_res.get("check_c") else "",
              design_paragraph(RELEASED_CONTINUED) if opt_res.get("check_c") else "",
              "#### The design in full: replicate c\n" if opt_c_res else "",
              "\n".join((design_paragraph(RELEASED_CONTINUED), opt_c_res.get("verdict", ""), opt_c_txt)) if opt_c_res else "",
              "## Claims 3-6: the entropy filter's thresholds, γ without the filter, OnlyNeg, GRPO + filter + γ\n"
              if c36_txt else "", c36_txt,
              "## Claim 7: GTPO reaches higher accuracy\n", v7, VERDICTS.get("claim7", ""), c7_txt,
              f"![claim 7, accuracy]({figs['claim7']})\n" if figs.get("claim7") else "",
              "### Attribution: which part of GTPO carries the gain\n" if c7b_res else "",
              "\n".join((design_paragraph(ATTRIBUTION), v7b, c7b_txt)) if c7b_res else "",
              "### Confirmation: the masks finding at matched temperature (declared, issue 45 item 1)\n", c7c_txt,
              "## SmolLM2-135M on the default task\n", VERDICTS.get("smol", ""), smol_txt if smol_res else "(no runs yet)\n"]
    if figs.get("smol"):
        parts.append(f"![default task]({figs['smol']})\n")
    parts += ["## The two engines on a real run (declared, issue 45 item 4)\n", eng_txt]
    if (fig := engines.fig_engines()):
        parts.append(f"![the two engines, reward and entropy per step]({fig})\n")
    parts += ["## What would need a GPU\n", VERDICTS.get("gpu", "")]
    text = "\n".join(p for p in parts if p)
    tmp = tables.DOCS_MD + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, tables.DOCS_MD)
    if c36_res.get("readme"):
        tables.replace_row(tables.README_MD, "| 3-6. ", c36_res["readme"])
    return tables.DOCS_MD


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--default-arm", default=DEFAULT_ARM, help="the SmolLM2 arm that is `gtpo train --demo`'s default")
    args = p.parse_args(argv)
    print(write_results(args.default_arm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
