"""Claim 7, attribution continued (issue 32, item 1): GRPO + masks, twelve and sixteen seeds, greedy pass@1
for every arm, and the rate grids re-bracketed, on a second machine (2026-12-03).

**Why.** The attribution design (:mod:`experiments.protocol.claim7b`, data ``claim7b.jsonl.gz``) ended
after its block 1 (GRPO + gamma and official GTPO with gamma 0, seeds 0-5) and one run of block 4: the
GRPO + masks arm never ran, the greedy pass@1 of GTPO and GRPO was measured on one seed, its six-seed
comparisons had minimum detectable differences of 3-4 points, and no arm's rate was bracketed (GRPO's
tuned 2.5e-5 is the lowest rate of the first design's grid, chosen on three noisy tuning seeds). This
design continues it on the machine of this session (2 cores of an AMD EPYC, Zen 3), where a run of
claim 7's size costs about a minute and a half of one core, two runs at a time.

**Design (declared here and committed before the first run of it).**

* **The start model** is rebuilt here by ``claim7.build`` (the same recipe, one thread). Its start record
  (validation per chunk, held-out metrics and per-problem scores) is compared with the first design's
  (``claim7.jsonl.gz``); :func:`branch` decides, nothing else:

  - **A, the same model** (every measured value equal): the runs **continue claim7b's design** (its arms
    :data:`claim7b.ARMS`, rate :data:`claim7b.LR`, 150 steps, ``tiny.yaml``, the evaluation, the 7
    primary comparisons :data:`claim7b.PRIMARY`, the threshold :data:`claim7b.ALPHA`, the attribution rule
    :func:`claim7b.attribution`, the rerun rule :func:`claim7b.modes`). Pooling: each (arm, seed) is run
    once over both designs; a run of this design fills an (arm, seed) claim7b does not hold, and the
    sampled metrics of official GTPO and GRPO come from the first design's runs of the same seeds as in
    claim7b's amendment. The first job reruns official GTPO seed 0 scored sampled and greedily: the
    **reproduction check** on this machine against the first design's run of the same seed and rate
    (held-out pass@1, every step's mean reward). The runs are pooled whether or not it reproduces (another
    machine's floating point, like another thread count, can flip a sampled token and fork the trajectory:
    the run is then another draw of the same seed's design, from the same model and the same prompts); the
    report states the check's result.
  - **B, another model**: a new replicate, **c**, analysed alone with claim7b's tests and rule (never
    pooled with claim7b or the first design): every arm of :data:`claim7b.ARMS`, official GTPO and GRPO
    included, at :data:`claim7b.LR`, sampled and greedy, seed by seed (blocks :data:`ORDER_B`).

* **Blocks, branch A** (:data:`ORDER_A`, in this order):

  1. official GTPO seed 0 (the reproduction check), then GRPO + masks seeds 0-5;
  2. the greedy reruns of official GTPO and GRPO, seeds 1-5;
  3. seeds 6-11: GRPO + gamma, GTPO gamma 0, GRPO + masks (sampled and greedy), GTPO and GRPO (greedy);
  4. **re-tuning GTPO (official preset) and GRPO** on the validation split (200 problems x 8 samples at
     temperature 1, as the first design's tuning): rate 1.25e-5 (below the old grid) on tuning seeds
     100-105, and 2.5e-5, 5e-5, 1e-4 on the new tuning seeds 103-105; with the first design's tuning runs
     of seeds 100-102 every rate of :data:`RETUNE_LRS` then has six seeds (2e-4 and 4e-4 scored 18 % and
     below on all three old seeds of both arms and are not rerun);
  5. seeds 12-15, as block 3;
  6. **bracketing the component arms**: GRPO + gamma, GTPO gamma 0 and GRPO + masks at 2.5e-5, 5e-5 and
     1e-4 on tuning seeds 100-102 (validation split).
  7. *(amendment)* the component arms' grids on tuning seeds 103-105 as well (six seeds per rate, as GTPO's
     and GRPO's);
  8. *(amendment)* **finals at the re-tuned rates**: for official GTPO and GRPO, when block 4's rule chooses
     a rate at which the first design has no finals (it has GTPO at 5e-5, GRPO at 2.5e-5 and 5e-5), that
     arm at that rate on the final seeds 0-15, sampled and greedy (:func:`retuned_jobs`); none otherwise.

* **Tuning rule** (:func:`chosen_rate`): an arm's rate is the one of its grid with the highest mean
  validation pass@1 over its tuning seeds (ties: the smaller rate; a component arm's over seeds 100-105
  where block 7 finished, else 100-102); the optimum is **bracketed** when it is not the grid's lowest or
  highest rate. At the re-tuned rates of GTPO and GRPO the primary test of the
  first design is repeated from its held-out finals where finals at both rates exist (16 paired seeds:
  GTPO at 5e-5, GRPO at 2.5e-5 and 5e-5, with block 8's finals where it ran; the tuning uses only
  validation runs, so the choice does not look at the held-out results); otherwise it is reported as not run. Official GTPO minus GRPO, sampled
  pass@1, Wilcoxon signed-rank (exact), two-sided alpha 0.05. A component arm whose optimum is not 5e-5 is
  stated as compared off its optimum in the attribution.
* **Blocks, branch B** (:data:`ORDER_B`): 1. seeds 0-5 of every arm; 2. seeds 6-11; 3. seeds 12-15.
* **Workers and stopping rule.** Two worker processes of one thread each take the jobs in the declared
  order (lock files; a job is run by one worker). No job starts after :data:`STOP_AT`; a job running then
  finishes. A block cut short is reported as far as it ran, each comparison on the seeds both of its arms
  finished, with its minimum detectable difference. Nothing is added after the runs are seen.
* **Amendment (committed at 11:57 UTC, when 16 runs had finished, blocks 1 and 2 but for GRPO seed 5, and
  two were running, GRPO seed 5 and GRPO + gamma seed 6; before any run of the added blocks; of the finished
  runs' results only the reproduction check was read: official GTPO seed 0 on this machine scored held-out
  pass@1 42.025 %, the first design's run of it 42.025 %).** Runs cost ~75 s of one core here, not the ~1.5 min
  assumed, so blocks 1-6 end about an hour before :data:`STOP_AT`; blocks 7 and 8 are added after them, in
  that order (the workers restart from a snapshot of this commit; done jobs stay done).

    python -m experiments.protocol.declare snapshot experiments/protocol/claim7c.py /work/snap-claim7c
    cd /work/snap-claim7c && python -m experiments.protocol.claim7c work &   # twice: two workers
    python -m experiments.protocol.claim7c export   # (from the main checkout) -> experiments/data/claim7c.jsonl.gz
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import sys
import time

from . import claim7b
from .common import DATA, ROOT, RUNS, read_jsonl_gz, setup_env, take_lock, write_json, write_jsonl_gz

MODULE = "experiments/protocol/claim7c.py"
C7C_RUNS = os.path.join(RUNS, "claim7c")
DATA_FILE = os.path.join(DATA, "claim7c.jsonl.gz")
FIRST_DATA = os.path.join(DATA, "claim7.jsonl.gz")
#: no job starts after this time (UTC)
STOP_AT = calendar.timegm((2026, 12, 3, 13, 40, 0))
LR = claim7b.LR
COMPONENTS = ("grpo_gamma", "gtpo_gamma0", "grpo_masks")
RETUNE_ARMS = ("gtpo", "grpo")
RETUNE_LRS = (1.25e-5, 2.5e-5, 5e-5, 1e-4)
COMPONENT_LRS = (2.5e-5, 5e-5, 1e-4)
OLD_TUNE_SEEDS = (100, 101, 102)   # the first design's (claim7.TUNE_SEEDS)
NEW_TUNE_SEEDS = (103, 104, 105)
ALPHA_TUNED = 0.05

#: a job: (kind, arm, learning rate, seed); kind "final" (held-out) or "tune" (validation)
Job = tuple[str, str, float, int]


def _finals(arms, seeds) -> list[Job]:
    return [("final", a, LR, s) for s in seeds for a in arms]


ORDER_A: dict[int, list[Job]] = {
    1: [("final", "gtpo", LR, 0)] + _finals(("grpo_masks",), range(6)),
    2: _finals(("gtpo", "grpo"), range(1, 6)),
    3: _finals((*COMPONENTS, "gtpo", "grpo"), range(6, 12)),
    4: [("tune", a, 1.25e-5, s) for a in RETUNE_ARMS for s in (*OLD_TUNE_SEEDS, *NEW_TUNE_SEEDS)]
       + [("tune", a, lr, s) for a in RETUNE_ARMS for lr in RETUNE_LRS[1:] for s in NEW_TUNE_SEEDS],
    5: _finals((*COMPONENTS, "gtpo", "grpo"), range(12, 16)),
    6: [("tune", a, lr, s) for a in COMPONENTS for lr in COMPONENT_LRS for s in OLD_TUNE_SEEDS],
    7: [("tune", a, lr, s) for a in COMPONENTS for lr in COMPONENT_LRS for s in NEW_TUNE_SEEDS],
}
#: the rates at which the first design ran finals (final and same-rate runs, seeds 0-15)
FIRST_FINALS = {("gtpo", 5e-5), ("grpo", 2.5e-5), ("grpo", 5e-5)}
FINAL_SEEDS = tuple(range(16))
ORDER_B: dict[int, list[Job]] = {
    1: _finals(tuple(claim7b.ARMS), range(6)),
    2: _finals(tuple(claim7b.ARMS), range(6, 12)),
    3: _finals(tuple(claim7b.ARMS), range(12, 16)),
}
#: how the stopping rule ended the blocks (written after the runs; the design above is the declaration)
ENDED = ("The stopping rule ended the experiment at 13:40 UTC with 2 jobs of block 7 not started (GRPO + masks at "
         "1e-4, tuning seeds 104 and 105); block 8 had no job due (block 4 chose rates at which the first design has "
         "finals). Of the 149 runs, 18 ran from the first snapshot (`9aefe2e`: 16 finished before the amendment's "
         "commit, 2 running at it), 131 from the amended one (`a98dd42`).")


# ------------------------------------------------------------------ the branch
def _measured(start: dict) -> dict:
    return {k: v for k, v in start.items() if k != "kind" and "seconds" not in k}


def first_start() -> dict | None:
    return next((r for r in read_jsonl_gz(FIRST_DATA) if r["kind"] == "start"), None) if os.path.isfile(FIRST_DATA) else None


def branch(start: dict | None, first: dict | None) -> str:
    """"A" when the rebuilt start model's record equals the first design's in every measured value, else "B"."""
    if start is None or first is None:
        raise SystemExit("claim7c: the branch needs both start records (build the start model; the first design's "
                         f"data {FIRST_DATA})")
    return "A" if _measured(start) == _measured(first) else "B"


def chosen_rate(scores: dict[float, list[float]]) -> tuple[float, bool]:
    """The tuning rule: ``scores`` maps each rate of an arm's grid to its validation pass@1 per tuning seed;
    returns (the rate with the highest mean, ties to the smaller rate; whether it is bracketed, i.e. neither
    the grid's lowest nor its highest rate)."""
    means = {lr: sum(v) / len(v) for lr, v in scores.items() if v}
    best = max(sorted(means), key=lambda lr: (means[lr], -lr))
    return best, min(scores) < best < max(scores)


def order(br: str) -> dict[int, list[Job]]:
    return {"A": ORDER_A, "B": ORDER_B}[br]


def retuned_jobs(scores: dict[str, dict[float, list[float]]]) -> list[Job]:
    """Block 8 from block 4's tuning: ``scores`` maps official GTPO and GRPO to {rate: validation pass@1 per
    seed}; an arm whose grid is complete (six seeds per rate of RETUNE_LRS) and whose chosen rate has no
    first-design finals gets finals at it on FINAL_SEEDS."""
    out: list[Job] = []
    for arm in RETUNE_ARMS:
        sc = scores.get(arm, {})
        if all(len(sc.get(lr, [])) >= len(OLD_TUNE_SEEDS) + len(NEW_TUNE_SEEDS) for lr in RETUNE_LRS):
            best, _ = chosen_rate({lr: sc[lr] for lr in RETUNE_LRS})
            if (arm, best) not in FIRST_FINALS:
                out += [("final", arm, best, s) for s in FINAL_SEEDS]
    return out


def tuning_scores(arms=RETUNE_ARMS, grid=RETUNE_LRS) -> dict[str, dict[float, list[float]]]:
    """{arm: {rate: validation pass@1 per seed}}: the first design's tuning runs and this design's finished ones."""
    out: dict = {a: {lr: {} for lr in grid} for a in arms}
    if os.path.isfile(FIRST_DATA):
        for r in read_jsonl_gz(FIRST_DATA):
            if r["kind"] == "tune" and r["arm"] in out and r["lr"] in out[r["arm"]]:
                out[r["arm"]][r["lr"]][r["seed"]] = r["metrics"]["pass@1"]
    for a in arms:
        for lr in grid:
            for s in (*OLD_TUNE_SEEDS, *NEW_TUNE_SEEDS):
                f = _eval_file(run_dir("tune", a, lr, s), "validation")
                if os.path.isfile(f):
                    out[a][lr][s] = json.load(open(f))["metrics"]["pass@1"]
    return {a: {lr: [v[s] for s in sorted(v)] for lr, v in g.items()} for a, g in out.items()}


def jobs(br: str, blocks=None) -> list[Job]:
    """The jobs of ``blocks`` (all by default) of branch ``br``'s order, in order, each once; in branch A
    block 8 (:func:`retuned_jobs`) follows, from the tuning finished so far."""
    od = order(br)
    out: list[Job] = []
    for b in sorted(od if blocks is None else blocks):
        out += [j for j in od.get(b, []) if j not in out]
    if br == "A" and (blocks is None or 8 in blocks):
        out += [j for j in retuned_jobs(tuning_scores()) if j not in out]
    return out


def modes(br: str, kind: str, arm: str, seed: int, lr: float = LR) -> tuple[str, ...]:
    """The evaluations of a job: tuning runs on the validation split (sampled); in branch A the finals follow
    claim7b's rule at its rate (official GTPO and GRPO greedy only, except seed 0); block 8's finals and
    branch B's every final both."""
    if kind == "tune":
        return ("validation",)
    return claim7b.modes(arm, seed) if br == "A" and lr == LR else claim7b.MODES


# ------------------------------------------------------------------ runs
def run_dir(kind: str, arm: str, lr: float, seed: int) -> str:
    return os.path.join(C7C_RUNS, kind, arm, f"lr{lr:g}", f"seed{seed}")


def argv_for(arm: str, lr: float, seed: int) -> list[str]:
    """The ``gtpo train`` arguments: claim7b's for the arm, at ``lr`` (claim7b's own at its rate)."""
    argv = claim7b.argv_for(arm, seed)
    i = argv.index("--learning_rate")
    return [*argv[:i + 1], repr(lr), *argv[i + 2:]]


def _eval_file(d: str, mode: str) -> str:
    return os.path.join(d, f"eval_{mode}.json")


def done(br: str, job: Job) -> bool:
    kind, arm, lr, seed = job
    d = run_dir(kind, arm, lr, seed)
    return all(os.path.isfile(_eval_file(d, m)) for m in modes(br, kind, arm, seed, lr))


def run_job(br: str, job: Job) -> None:
    from gtpo.evaluation import evaluate

    from .claim7 import START, eval_model
    from .declare import run_stamp
    from .tinyruns import execute, run_status

    kind, arm, lr, seed = job
    d = run_dir(kind, arm, lr, seed)
    stamp = os.path.join(d, "declared.json")
    if not os.path.isfile(stamp):  # the first start of this run (a resumed run keeps its first stamp)
        write_json(stamp, {**run_stamp(MODULE), "branch": br})
    if run_status(d) != "done":
        execute(argv_for(arm, lr, seed), d, f"claim7c {kind} {arm} lr {lr:g} seed {seed}")
    summary = json.load(open(os.path.join(d, "summary.json")))
    for mode in modes(br, kind, arm, seed, lr):
        if os.path.isfile(_eval_file(d, mode)):
            continue
        if "stopped" in summary:  # ended itself on non-finite updates: scored as nothing learned
            write_json(_eval_file(d, mode), {"metrics": {"pass@1": 0.0, "pass@8": 0.0, "maj@8": 0.0},
                                            "stopped": summary["stopped"]})
            continue
        split = "validation" if mode == "validation" else "heldout"
        data = os.path.join(START, "data", f"{split}.jsonl")
        ev = (evaluate(d, dataset=os.path.relpath(data, ROOT), seed=0, **claim7b.GREEDY) if mode == "greedy"
              else eval_model(d, data))
        ev["split"] = split
        write_json(_eval_file(d, mode), ev)


def work(blocks=None, now=time.time) -> None:
    """One worker: run (or resume) the jobs of ``blocks`` in the declared order, skipping those done or taken by
    another worker, starting none after :data:`STOP_AT` (or when a STOP file exists). The job list is read
    again after every job (block 8 depends on block 4's tuning)."""
    from .claim7 import START, build

    build()
    br = branch(json.load(open(os.path.join(START, "start.json"))), first_start())
    while True:
        for job in jobs(br, blocks):
            if done(br, job):
                continue
            if now() >= STOP_AT or os.path.exists(os.path.join(C7C_RUNS, "STOP")):
                return
            d = run_dir(*job)
            os.makedirs(os.path.dirname(d), exist_ok=True)
            lock = d + ".lock"
            if not take_lock(lock):
                continue
            try:
                run_job(br, job)
            finally:
                os.remove(lock)
            break
        else:
            return  # every job done or taken by another worker


def export(out: str = DATA_FILE) -> str:
    from .claim7 import START, _per_problem
    from .tinyruns import kept_steps, run_status

    old = read_jsonl_gz(out) if os.path.isfile(out) else []
    kept = {(r["kind"], r["arm"], r["lr"], r["seed"]): r for r in old if r["kind"] != "start"}
    recs = [r for r in old if r["kind"] == "start"][:1]
    if not recs and os.path.isfile(os.path.join(START, "start.json")):
        recs.append({"kind": "start", **json.load(open(os.path.join(START, "start.json")))})
    br = branch(recs[0] if recs else None, first_start())
    for job in jobs(br):
        kind, arm, lr, seed = job
        d = run_dir(*job)
        if run_status(d) != "done" or not done(br, job):
            if job in kept:  # committed, its directory gone
                recs.append(kept[job])
            continue
        timing = json.load(open(os.path.join(d, "timing.json")))
        rec = {"kind": kind, "arm": arm, "lr": lr, "seed": seed, "argv": timing["argv"],
               **json.load(open(os.path.join(d, "declared.json"))), "timing": timing,
               "steps": kept_steps(d)}
        for mode in modes(br, kind, arm, seed, lr):
            ev = json.load(open(_eval_file(d, mode)))
            rec[mode] = {"metrics": ev["metrics"], "per_problem": _per_problem(ev), "timing": ev.get("timing"),
                         "stopped": ev.get("stopped")}
        recs.append(rec)
    listed = {(r["kind"], r["arm"], r["lr"], r["seed"]) for r in recs if r["kind"] != "start"}
    recs += [r for j, r in kept.items() if j not in listed]  # committed runs of block 8 whose directories are gone
    write_jsonl_gz(out, recs)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cmd", choices=["work", "plan", "export"])
    p.add_argument("--blocks", type=int, nargs="+", default=None, help="blocks of the branch's order to run")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    os.chdir(ROOT)
    setup_env(args.threads)
    if args.cmd == "work":
        work(args.blocks)
    elif args.cmd == "plan":
        from .claim7 import START

        br = branch(json.load(open(os.path.join(START, "start.json"))), first_start())
        print("branch", br)
        for job in jobs(br):
            print(*job, "done" if done(br, job) else "-")
    else:
        print(export())
    return 0


if __name__ == "__main__":
    sys.exit(main())
