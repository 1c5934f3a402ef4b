"""Claim 2 under the released optimiser (issue 32, item 2): does GTPO stay stable where GRPO collapses
when both train as the released code trains?

**Why.** Every protocol arm so far ran AdamW (0.9, 0.999), clip 1.0 and a constant rate; the released
code trains with Adam beta1 = beta2 = 0.999999, ``max_grad_norm`` 0.1, weight decay 0.1 and a cosine
schedule with warm-up 0.005 (and paged 8-bit AdamW, a memory optimisation of no consequence on CPU, in
fp32, for a 1M-parameter model). With beta1 ~ 1 the update is nearly the running mean of all past
gradients: a candidate source of the released code's stability that the method itself may not need.

**Design (declared here and committed before the first run).**

* Model: replicate b's recipe (``stress.build``, the same code and seeds) rebuilt in this session (a
  stress model built twice has not always measured the same: replicates a and b). If the rebuild's start
  record equals replicate b's (``stress-b.jsonl.gz``; the measured error rates, formats, rewards and
  entropies), it is replicate b's model and replicate b's default-optimiser grid is a same-model
  reference; otherwise it is a new replicate, **c**, and comparisons with replicate b are across models and
  descriptive only (the report says which, from the two records). 40 steps per run, the collapse criterion
  of ``stress.collapse_step`` (declared there before any stress run), runs stopped by non-finite
  updates count as collapsed where they stopped.
* Arms (:data:`ARMS`): GRPO and official GTPO, both with the released optimiser settings :data:`OPT`
  (the fields ``adam_beta1``, ``adam_beta2``, ``max_grad_norm``, ``weight_decay``,
  ``lr_scheduler_type``, ``warmup_ratio`` of ``gtpo.GTPOConfig``; 40 x 0.005 rounds up to one warm-up step).
* **Pilot** (re-brackets the rates; its runs are reported but not pooled with the main grid): both arms
  at :data:`PILOT_FACTORS` x 1e-4 on seeds :data:`PILOT_SEEDS`. If no pilot run collapses at the highest
  factor, the next factor (x ~3.16) is added on the pilot seeds, up to x1e5; if a run collapses at the
  lowest, the next factor below is added, down to x1.
* **Main grid**, from the pilot by :func:`main_grid` (no other choice): from lo = the highest pilot factor
  at which no pilot run of either arm collapsed, below the lowest factor at which any did, to hi = the
  lowest pilot factor at which every pilot run of both arms collapsed (the highest pilot factor if there
  is none), :data:`N_MAIN` factors spaced evenly on a log scale (two significant digits), both arms,
  seeds :data:`MAIN_SEEDS` (12).
* Tests on the main grid: primary, the log-rank test of time to collapse, official GTPO vs GRPO,
  stratified by rate, two-sided alpha = 0.05; with it each arm's critical rate (where the collapse
  fraction first reaches 1/2, log-linear between grid rates) and the ratio GTPO / GRPO with its 95 %
  bootstrap interval (2,000 resamples of seeds within each rate, seed 0). Secondary: Fisher's exact
  test per rate, the entropy rise (largest 5-step mean / mean of steps 1-5, Mann-Whitney per rate).
  Power: 12 seeds per arm and rate detect 12/12 against <= 7/12 collapsed at one rate (Fisher, 80 %);
  on replicate b with the default optimiser the same grid gave ratio intervals about [0.76, 1.46].
* Order and stopping rule: this experiment's pilot, its main grid's seeds 0-5 and then seeds 6-11 are
  blocks 2, 3 and 6 of the order declared in :mod:`experiments.protocol.claim7b` (one process at a time
  on the shared machine); the pilot runs to its rule's end, then the main grid seed by seed (every arm
  and rate per seed, so a grid cut short by the end of the session stays balanced); nothing is added.
* **Amendment (committed before any run of this experiment).** A tiny-model step measured ~2.5x slower
  than estimated on the shared machine (a claim-7b run: training 290 s at ~35 % of one core), so a
  40-step run is expected at ~2 minutes: the pilot uses one seed (:data:`PILOT_SEEDS`), the main grid
  :data:`N_MAIN` = 3 rates (lo, the geometric middle, hi), still seeds 0-11 in two blocks.

    python -m experiments.protocol.declare snapshot experiments/protocol/stress_opt.py /work/snap-stress-opt
    cd /work/snap-stress-opt && nice -n 15 python -m experiments.protocol.stress_opt work --phase pilot
    cd /work/snap-stress-opt && nice -n 15 python -m experiments.protocol.stress_opt work --phase main --seeds 0 1 2 3 4 5
    python -m experiments.protocol.stress_opt export     # (from the main checkout)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from .common import DATA, ROOT, RUNS, setup_env, write_json, write_jsonl_gz
from .common import EXPERIMENTS
from .stress import BASE_LR, STEPS, Replicate, collapse_step

MODULE = "experiments/protocol/stress_opt.py"
OPT_RUNS = os.path.join(RUNS, "stress-opt")
DATA_FILE = os.path.join(DATA, "stress-released-optimiser.jsonl.gz")
#: replicate b's recipe rebuilt in this session (see the docstring: replicate b's model or a new one, by its record)
REP = Replicate("rebuilt", os.path.join(EXPERIMENTS, ".cache", "tiny-v3-s0-stress-opt"), OPT_RUNS, DATA_FILE)
#: the released code's optimiser settings (github.com/winstonsmith1897/GTPO; docs/method.md)
OPT = ["--adam_beta1", "0.999999", "--adam_beta2", "0.999999", "--max_grad_norm", "0.1", "--weight_decay", "0.1",
       "--lr_scheduler_type", "cosine", "--warmup_ratio", "0.005"]
ARMS: dict[str, list[str]] = {
    "grpo": ["--preset", "grpo", *OPT],
    "gtpo_official": ["--preset", "official", *OPT],
}
#: log-spaced by sqrt(10); the extension ladder continues it both ways
LADDER = (1.0, 3.2, 10.0, 32.0, 100.0, 320.0, 1000.0, 3200.0, 10000.0, 32000.0, 100000.0)
PILOT_FACTORS = (10.0, 32.0, 100.0, 320.0, 1000.0)
PILOT_SEEDS = (100,)
N_MAIN = 3
MAIN_SEEDS = tuple(range(12))


def run_dir(phase: str, arm: str, factor: float, seed: int, rep: Replicate = REP) -> str:
    return os.path.join(rep.runs, phase, arm, f"x{factor:g}", f"seed{seed}")


def argv_for(arm: str, factor: float, seed: int, rep: Replicate = REP) -> list[str]:
    return ["experiments/configs/tiny.yaml", *ARMS[arm], "--model", os.path.relpath(os.path.join(rep.model, "model"), ROOT),
            "--learning_rate", repr(BASE_LR * factor), "--seed", str(seed), "--max_steps", str(STEPS),
            "--eval_steps", "0", "--save_steps", "20", "--log_completions_steps", "10", "--log_policy_change", "true"]


def collapsed(d: str) -> bool | None:
    """Whether the finished run in ``d`` collapsed (None while it has not finished)."""
    from .tinyruns import run_status, step_metrics

    if run_status(d) != "done":
        return None
    if "stopped" in json.load(open(os.path.join(d, "summary.json"))):
        return True
    return collapse_step([m["reward/mean"] for m in step_metrics(d)]) is not None


# ------------------------------------------------------------------ the declared rules
def pilot_factors(outcomes: dict[float, list[bool]]) -> list[float]:
    """The pilot's factors given its finished outcomes so far (``outcomes[factor]``: collapsed per run, both
    arms, all pilot seeds): PILOT_FACTORS extended along LADDER while the top has no collapse or the bottom
    has one."""
    fs = sorted(set(PILOT_FACTORS) | set(outcomes))
    full = len(ARMS) * len(PILOT_SEEDS)
    if all(len(outcomes.get(f, [])) == full for f in fs):
        top, bottom = fs[-1], fs[0]
        if not any(outcomes[top]) and top < LADDER[-1]:
            fs.append(LADDER[LADDER.index(top) + 1])
        elif any(outcomes[bottom]) and bottom > LADDER[0]:
            fs.insert(0, LADDER[LADDER.index(bottom) - 1])
    return fs


def main_grid(outcomes: dict[float, list[bool]]) -> list[float]:
    """The main grid from the finished pilot (see the module docstring)."""
    fs = sorted(outcomes)
    first_any = next((f for f in fs if any(outcomes[f])), None)
    if first_any is None:
        raise ValueError("stress_opt: no pilot run collapsed at any factor; the main grid has no upper end")
    below = [f for f in fs if f < first_any]
    lo = below[-1] if below else first_any
    hi = next((f for f in fs if all(outcomes[f])), fs[-1])
    if hi <= lo:
        hi = fs[fs.index(lo) + 1] if fs.index(lo) + 1 < len(fs) else lo
    if hi == lo:
        return [lo]
    step = (math.log(hi) - math.log(lo)) / (N_MAIN - 1)
    return [float(f"{math.exp(math.log(lo) + i * step):.2g}") for i in range(N_MAIN)]


def pilot_outcomes(rep: Replicate = REP) -> dict[float, list[bool]]:
    out: dict[float, list[bool]] = {}
    base = os.path.join(rep.runs, "pilot")
    for arm in ARMS:
        d_arm = os.path.join(base, arm)
        for name in os.listdir(d_arm) if os.path.isdir(d_arm) else []:
            f = float(name[1:])
            for s in PILOT_SEEDS:
                c = collapsed(run_dir("pilot", arm, f, s, rep))
                if c is not None:
                    out.setdefault(f, []).append(c)
    return out


def jobs(phase: str = "all", seeds=MAIN_SEEDS, rep: Replicate = REP) -> list[tuple[str, str, float, int]]:
    """The runs to do now: the pilot (with its extensions), then (``phase`` "main" or "all") the main grid on
    ``seeds``; ``phase`` "pilot" stops after the pilot."""
    outc = pilot_outcomes(rep)
    fs = pilot_factors(outc)
    pilot = [("pilot", a, f, s) for f in fs for s in PILOT_SEEDS for a in ARMS]
    todo = [j for j in pilot if collapsed(run_dir(*j, rep)) is None]
    if todo or phase == "pilot":
        return todo
    return [("main", a, f, s) for s in seeds for f in main_grid(outc) for a in ARMS]


def run_job(phase: str, arm: str, factor: float, seed: int, rep: Replicate = REP, module: str = MODULE) -> None:
    """Run (or resume) one job on ``rep``'s model, its runs stamped with ``module``'s declaration."""
    from .declare import run_stamp
    from .stress import build, check_same_model
    from .tinyruns import execute

    build(rep)
    check_same_model(rep)
    d = run_dir(phase, arm, factor, seed, rep)
    stamp = os.path.join(d, "declared.json")
    if not os.path.isfile(stamp):
        write_json(stamp, run_stamp(module))
    execute(argv_for(arm, factor, seed, rep), d, f"stress-opt {rep.name} {phase} {arm} x{factor:g} seed {seed}")


def work(phase: str = "all", seeds=MAIN_SEEDS) -> None:
    while True:
        todo = [j for j in jobs(phase, seeds) if collapsed(run_dir(*j)) is None]
        if not todo or os.path.exists(os.path.join(OPT_RUNS, "STOP")):
            return
        run_job(*todo[0])


def export(out: str = DATA_FILE, rep: Replicate = REP) -> str:
    from .common import read_jsonl_gz
    from .tinyruns import kept_steps, run_status

    old = read_jsonl_gz(out) if os.path.isfile(out) else []
    kept = {(r["phase"], r["arm"], r["lr_factor"], r["seed"]): r for r in old if r["kind"] == "run"}
    recs = [r for r in old if r["kind"] == "start"][:1]
    if not recs and os.path.isfile(os.path.join(rep.model, "start.json")):
        recs.append({"kind": "start", **json.load(open(os.path.join(rep.model, "start.json")))})
    keep = ("reward/mean", "entropy/mean", "reward/paper_format/mean", "reward/paper_accuracy/mean", "update_norm",
            "kl/new_old", "grad_norm", "lr", "frac_zero_std_groups", "gtpo/filtered_frac", "gtpo/conflict_frac",
            "completion_length/mean", "truncated_frac", "step_time_s", "step")
    seen = set()
    for phase in ("pilot", "main"):
        for arm in ARMS:
            base = os.path.join(rep.runs, phase, arm)
            for name in sorted(os.listdir(base), key=lambda n: float(n[1:])) if os.path.isdir(base) else []:
                f = float(name[1:])
                names = [n for n in os.listdir(os.path.join(base, name)) if n[4:].isdigit()]  # not the .lock files
                for sname in sorted(names, key=lambda n: int(n[4:])):
                    seed = int(sname[4:])
                    d = run_dir(phase, arm, f, seed, rep)
                    if run_status(d) != "done":
                        continue
                    timing = json.load(open(os.path.join(d, "timing.json")))
                    recs.append({"kind": "run", "phase": phase, "arm": arm, "lr_factor": f, "lr": BASE_LR * f,
                                 "seed": seed, "argv": timing["argv"], **json.load(open(os.path.join(d, "declared.json"))),
                                 "summary": json.load(open(os.path.join(d, "summary.json"))), "timing": timing,
                                 "steps": kept_steps(d, keep)})
                    seen.add((phase, arm, f, seed))
    recs += [r for k, r in sorted(kept.items(), key=str) if k not in seen]
    write_jsonl_gz(out, recs)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cmd", choices=["work", "plan", "export"])
    p.add_argument("--phase", choices=["pilot", "main", "all"], default="all")
    p.add_argument("--seeds", type=int, nargs="+", default=list(MAIN_SEEDS), help="main-grid seeds to run")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    os.chdir(ROOT)
    setup_env(args.threads)
    if args.cmd == "work":
        work(args.phase, tuple(args.seeds))
    elif args.cmd == "plan":
        outc = pilot_outcomes()
        print("pilot:", {f"x{f:g}": v for f, v in sorted(outc.items())}, "factors:", pilot_factors(outc))
        print("next jobs:", jobs()[:5])
    else:
        print(export())
    return 0


if __name__ == "__main__":
    sys.exit(main())
