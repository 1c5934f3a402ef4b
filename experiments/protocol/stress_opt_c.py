"""Claim 2 under the released optimiser, replicate c (issue 32, item 2): the declared 12-seed grid on a stress
model built on this machine.

**Why a second data file.** :mod:`experiments.protocol.stress_opt` ran its pilot and seeds 0-5 of its main
grid on replicate b's model, rebuilt on an Intel machine (its start record equals replicate b's). Its seeds
6-11 (its block 6) did not start before that session ended. The machine of the next sessions is an AMD
EPYC (Zen 3), on which the same build code and seeds give a model that measures differently (a rebuild here
sampled the error on 10.2 % of the other prompts, replicate b's on 11.2 %), so ``stress.check_same_model``
refuses to add runs of it to that file, rightly: the runs would be on another model. This experiment is
therefore the whole declared design again, pilot included, on the model this machine builds: **replicate
c**. The first file stays as it is, its grid reported as far as it ran (6 seeds).

**Design (declared here and committed before the first run; everything not named is
:mod:`experiments.protocol.stress_opt`'s, by its code).**

* Model: ``stress.build`` with replicate b's recipe (the same code and seeds), cached apart
  (:data:`REP`); its start record is committed with the runs and the report states whether it equals
  replicate b's (expected not, see above). 40 steps per run, the collapse criterion of
  ``stress.collapse_step``; runs stopped by non-finite updates count as collapsed where they stopped.
* Arms: ``stress_opt.ARMS``, GRPO and official GTPO, both with the released optimiser settings
  ``stress_opt.OPT`` (Adam beta1 = beta2 = 0.999999, ``max_grad_norm`` 0.1, weight decay 0.1, cosine
  schedule with warm-up ratio 0.005).
* **Pilot**: ``stress_opt.PILOT_FACTORS`` x 1e-4 on seed 100, both arms, extended along
  ``stress_opt.LADDER`` by ``stress_opt.pilot_factors`` (a factor above while the top has no collapse, one
  below while the bottom has one). Reported, not pooled with the main grid.
* **Main grid** by ``stress_opt.main_grid`` from this pilot alone (3 factors, lo, geometric middle, hi),
  both arms, seeds 0-11, in the order seed, rate, arm (seed by seed, so a grid cut short stays balanced).
* **Primary test**: on this replicate's main grid, the log-rank test of time to collapse, official GTPO vs
  GRPO, stratified by rate, two-sided alpha = 0.05. With it each arm's critical rate (collapse fraction
  first reaching 1/2, log-linear between grid rates) and GTPO's divided by GRPO's with its 95 % bootstrap
  interval (2,000 resamples of seeds within each rate, seed 0). Secondary: Fisher's exact test per rate;
  the entropy rise (largest 5-step mean / mean of steps 1-5), Mann-Whitney per rate; and the log-rank test
  over both data files' main grids stratified by (model, rate): replicate b's model seeds 0-5 and this
  one's seeds 0-11, 18 seeds per arm, each compared only within its own model and rate.
* Power: 12 seeds per arm and rate detect 12/12 against <= 7/12 collapsed at one rate (Fisher, 80 %).
* **The decision on the preset** follows the primary test: if official GTPO collapses significantly later
  than GRPO under the released optimiser, the stability depends on settings the ``official`` preset does
  not carry and the README says to use them with it; otherwise the preset keeps GTPO's loss, filter and
  sampling fields only and the paper configs keep carrying the optimiser.
* **Workers and stopping rule.** After one process has built the model (``build``), two worker processes
  of one thread each take the jobs in the declared order (lock files; a job is run by one worker; a worker
  waits while the only jobs left are running in the other, since the pilot's extension and the main grid
  depend on them). No job starts after :data:`STOP_AT`; a job running then finishes. A grid cut short is
  reported on the seeds it finished, each test on every finished run. Nothing is added after the runs
  are seen.

* **Amendment (committed after the build, before any run; git has its time).** The model built here measures
  exactly as replicate b's: every value of its start record equals the one in ``stress-released-optimiser.jsonl.gz``
  (the error on 85.1 % of the error-prompt samples and 11.2 % of the others, entropy 0.1753), not as the
  previous session's rebuild on this kind of machine (10.2 %; the cause of that difference was not isolated).
  So the design branches on the start record (:func:`branch`):

  - **A, replicate b's model (this case):** this experiment becomes the continuation of
    :mod:`experiments.protocol.stress_opt`, its block 6: that design's main grid, taken by its own rule
    from its committed pilot (:func:`committed_main_grid`: x3.2, x5.7, x10), on seeds 6-11, seed by seed
    (:func:`continuation_jobs`), preceded by a **reproduction check** (descriptive): seed 0 of both arms at
    the grid's top rate, rerun here and compared step by step with the committed runs. No pilot is run. The
    **primary test** is stress_opt's on its full declared grid, 12 seeds, pooling its seeds 0-5 with these
    seeds 6-11 (same model, same code, same grid; the reproduction runs are not pooled); the critical rates,
    bootstrap ratio, Fisher and entropy tests as declared there. The pooled-by-model test above is not
    needed (one model). The decision on the preset follows this primary test.
  - **B, another model:** as declared above.

  The stop time is unchanged.

    python -m experiments.protocol.declare snapshot experiments/protocol/stress_opt_c.py /work/snap-stress-opt-c
    cd /work/snap-stress-opt-c && nice -n 15 python -m experiments.protocol.stress_opt_c build
    cd /work/snap-stress-opt-c && (nice -n 15 python -m experiments.protocol.stress_opt_c work &
                                   nice -n 15 python -m experiments.protocol.stress_opt_c work; wait)
    python -m experiments.protocol.stress_opt_c export     # (from the main checkout)
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

from . import stress_opt
from .common import DATA, EXPERIMENTS, ROOT, RUNS, setup_env
from .stress import Replicate

MODULE = "experiments/protocol/stress_opt_c.py"
DATA_FILE = os.path.join(DATA, "stress-released-optimiser-c.jsonl.gz")
#: replicate b's recipe built on this machine (a model of its own unless its start record says otherwise)
REP = Replicate("c", os.path.join(EXPERIMENTS, ".cache", "tiny-v3-s0-stress-c"), os.path.join(RUNS, "stress-opt-c"),
                DATA_FILE)
STOP_AT = datetime.datetime(2026, 12, 3, 17, 35, tzinfo=datetime.timezone.utc).timestamp()
#: how the stopping rule ended the runs (written after the runs; the design above is the declaration)
ENDED = ("branch A (the start record equal to the first file's); all 38 jobs ran, the reproduction check and seeds "
         "6-11, from 15:56 to 16:04 UTC (two workers, 20-38 s a run), well before the stop time (17:35 UTC); "
         "nothing was added.")
#: how long a worker waits, when every job left is running in the other worker, before it reads the list again
WAIT_S = 10.0


#: branch A: the seeds of stress_opt's main grid that did not run there, and the reproduction check's seed
CONTINUATION_SEEDS = tuple(range(6, 12))
REPRO_SEED = 0


def branch(start: dict | None = None) -> str:
    """"A" when the model built here (its start record ``start``, read from the cache by default) measures
    exactly as the one of stress_opt's committed data, "B" otherwise (see the amendment)."""
    import json

    from .common import read_jsonl_gz
    from .stress import same_start

    if start is None:
        start = json.load(open(os.path.join(REP.model, "start.json")))
    first = next((r for r in read_jsonl_gz(stress_opt.DATA_FILE) if r["kind"] == "start"), None)
    return "A" if same_start(start, first) else "B"


def committed_main_grid() -> list[float]:
    """stress_opt's main grid by its own rule (``stress_opt.main_grid``) from its committed pilot runs."""
    from .common import read_jsonl_gz
    from .stress import collapse_step

    outc: dict[float, list[bool]] = {}
    for r in read_jsonl_gz(stress_opt.DATA_FILE):
        if r["kind"] == "run" and r["phase"] == "pilot":
            c = "stopped" in r["summary"] or collapse_step([m["reward/mean"] for m in r["steps"]]) is not None
            outc.setdefault(r["lr_factor"], []).append(c)
    return stress_opt.main_grid(outc)


def continuation_jobs() -> list[tuple[str, str, float, int]]:
    """Branch A in order: the reproduction check, then the grid on CONTINUATION_SEEDS seed by seed."""
    grid = committed_main_grid()
    return ([("main", a, grid[-1], REPRO_SEED) for a in stress_opt.ARMS]
            + [("main", a, f, s) for s in CONTINUATION_SEEDS for f in grid for a in stress_opt.ARMS])


def jobs() -> list[tuple[str, str, float, int]]:
    """The jobs due now, in the declared order: branch A's continuation, or (B) the pilot with its
    extensions, then the main grid."""
    if branch() == "A":
        return continuation_jobs()
    return stress_opt.jobs("all", stress_opt.MAIN_SEEDS, REP)


def _done(job) -> bool:
    return stress_opt.collapsed(stress_opt.run_dir(*job, REP)) is not None


def work(now=time.time, sleep=time.sleep) -> None:
    """One worker: take the first job due that is neither done nor running in the other worker; wait while
    every job left is running; stop when none is left, at :data:`STOP_AT`, or when a STOP file exists."""
    from .common import take_lock

    while True:
        todo = [j for j in jobs() if not _done(j)]
        if not todo:
            return
        if now() >= STOP_AT or os.path.exists(os.path.join(REP.runs, "STOP")):
            return
        for job in todo:
            d = stress_opt.run_dir(*job, REP)
            os.makedirs(os.path.dirname(d), exist_ok=True)
            lock = d + ".lock"
            if not take_lock(lock):
                continue
            try:
                stress_opt.run_job(*job, rep=REP, module=MODULE)
            finally:
                os.remove(lock)
            break
        else:
            sleep(WAIT_S)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cmd", choices=["build", "work", "plan", "export"])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    os.chdir(ROOT)
    setup_env(args.threads)
    if args.cmd == "build":
        from .stress import build

        print(build(REP))
    elif args.cmd == "work":
        work()
    elif args.cmd == "plan":
        print("branch", branch())
        outc = stress_opt.pilot_outcomes(REP)
        print("pilot:", {f"x{f:g}": v for f, v in sorted(outc.items())}, "factors:", stress_opt.pilot_factors(outc))
        for job in jobs():
            print(*job, "done" if _done(job) else "-")
    else:
        print(stress_opt.export(DATA_FILE, REP))
    return 0


if __name__ == "__main__":
    sys.exit(main())
