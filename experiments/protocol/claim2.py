"""Claim 2, GRPO collapses where GTPO stays stable: a stress model on which GRPO's failure can appear, and three
designs on it.

Each design is a record of this module, its parameters as data, and a declaration under ``designs/`` (the text
committed before its runs, word for word; its amendments included):

* :data:`GRID` (issue 16, item 2; ``designs/claim2-grid.md``): every arm (:data:`ARMS`) x learning rates
  (:data:`LR_FACTORS` x 1e-4) x seeds on the stress model, replicates a and b (:data:`REPLICATES`: one stress
  model each, never pooled) -> ``data/stress.jsonl.gz``, ``data/stress-b.jsonl.gz``;
* :data:`RELEASED` (issue 32, item 2; ``designs/claim2-released-optimiser.md``): GRPO and official GTPO under the
  released code's optimiser, a pilot then a main grid by declared rules -> ``data/stress-released-optimiser.jsonl.gz``;
* :data:`RELEASED_CONTINUED` (``designs/claim2-released-optimiser-continued.md``): its seeds 6-11 on the same model
  rebuilt on another machine, two workers -> ``data/stress-released-optimiser-c.jsonl.gz``.

**The stress model** (:func:`experiments.protocol.startmodels.build_stress`): the tiny model fine-tuned to write a
confident systematic error on a third of the prompts; **the collapse criterion** (:func:`collapse_step`), declared
before any run.

    python -m experiments.protocol.claim2 grid --replicate b build        # the stress model (cached)
    python -m experiments.protocol.claim2 grid --replicate b run --lrs 4.5 6.5 10 15 --seeds 0 1 2
    python -m experiments.protocol.claim2 grid --replicate b export
    python -m experiments.protocol.claim2 released work --phase pilot | plan | export
    python -m experiments.protocol.claim2 released-continued build | work | plan | export   # work: two processes
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from dataclasses import dataclass

from .common import (DATA, EXPERIMENTS, ROOT, RUNS, Design, read_jsonl_gz, setup_env, take_lock, write_json,
                     write_jsonl_gz)
from .startmodels import Replicate, build_stress

MODULE = "experiments/protocol/claim2.py"


# ------------------------------------------------------------------ the grid: arms x rates x seeds on a stress replicate
#: stress1 (200 SFT steps at lr 1e-3) learned the error only weakly and not per prompt: sampled at
#: temperature 1 it wrote "The answer is N." on 52 % of error-prompt samples and on 29 % of the others
#: (5 % / 8 % before); stress2 trains longer and faster. Replicate "a" is the stress2 model of the first
#: grid; "b" the same build run again in a later session (it measures differently:
#: error on 11.2 % of the other prompts, not 7.6 %), with the whole grid rerun on it.
REPLICATES = {
    "a": Replicate("a", os.path.join(EXPERIMENTS, ".cache", "tiny-v3-s0-stress2"), os.path.join(RUNS, "stress"),
                   os.path.join(DATA, "stress.jsonl.gz")),
    "b": Replicate("b", os.path.join(EXPERIMENTS, ".cache", "tiny-v3-s0-stress-b"), os.path.join(RUNS, "stress-b"),
                   os.path.join(DATA, "stress-b.jsonl.gz")),
}
BASE_LR = 1e-4
#: x15 was added after the pilot (GRPO and official GTPO, seeds 0-3, x2-x10): GTPO collapsed at no rate of
#: the grid (GRPO 2 of 4 at x10), so the grid had no upper end for GTPO's critical rate
LR_FACTORS = (2.0, 3.0, 4.5, 6.5, 10.0, 15.0)
STEPS = 40
ARMS: dict[str, list[str]] = {
    "grpo": ["--preset", "grpo"],
    # a baseline given GTPO's switches is an ablation the trainer refuses without --gtpo_ablation true
    "grpo_masks": ["--preset", "grpo", "--conflict_masks", "true", "--gtpo_ablation", "true"],
    "grpo_filter_gamma": ["--preset", "grpo", "--entropy_filter", "true", "--gamma", "0.1", "--gtpo_ablation", "true"],
    "gtpo_paper": ["--preset", "paper"],
    "gtpo_official": ["--preset", "official"],
    "gtpo_gamma0": ["--preset", "official", "--gamma", "0.0"],
    "gtpo_varying": ["--preset", "official", "--gamma_groups", "varying"],
    "pos_only": ["--preset", "grpo", "--completion_sign", "positive", "--gtpo_ablation", "true"],
    "neg_only": ["--preset", "grpo", "--completion_sign", "negative", "--gtpo_ablation", "true"],
}


def lr_label(f: float) -> str:
    return f"x{f:g}"


def run_dir(rep: Replicate, arm: str, factor: float, seed: int) -> str:
    return os.path.join(rep.runs, arm, lr_label(factor), f"seed{seed}")


def argv_for(rep: Replicate, arm: str, factor: float, seed: int, steps: int = STEPS) -> list[str]:
    return ["experiments/configs/tiny.yaml", *ARMS[arm], "--model", os.path.relpath(os.path.join(rep.model, "model"), ROOT),
            "--learning_rate", repr(BASE_LR * factor), "--seed", str(seed), "--max_steps", str(steps),
            "--eval_steps", "0", "--save_steps", "20", "--log_completions_steps", "10", "--log_policy_change", "true"]


def collapse_step(rewards: list[float], window: int = 5, frac: float = 0.5) -> int | None:
    """The declared collapse criterion: the first step t (1-based) at which the mean reward over
    steps t-window+1..t falls below ``frac`` times the mean over steps 1..window; None if never."""
    if len(rewards) < window:
        return None
    ref = sum(rewards[:window]) / window
    for t in range(window, len(rewards) + 1):
        if sum(rewards[t - window:t]) / window < frac * ref:
            return t
    return None


#: start-record keys that describe the build, not the model
_BUILD_KEYS = ("kind", "build_seconds", "build_cpu_seconds")


def start_diff(a: dict, b: dict) -> list[str]:
    """The keys in which two stress start records differ, the build's own (times) ignored."""
    return sorted(k for k in set(a) | set(b) if k not in _BUILD_KEYS and a.get(k) != b.get(k))


def same_start(a: dict | None, b: dict | None) -> bool:
    """Whether two stress start records measure the same model (every key but the build's own)."""
    return bool(a) and bool(b) and not start_diff(a, b)


def check_same_model(rep: Replicate) -> None:
    """Refuse to mix runs of two stress models. The build is not reproducible across sessions (a rebuild
    in a later session samples the error on 11.2 % of the other prompts, the model of
    replicate a on 7.6 %), so new runs may join a replicate's data file only when the cached model
    measures exactly as the file's start record."""
    data = rep.data
    cached = os.path.join(rep.model, "start.json")
    if not (os.path.isfile(data) and os.path.isfile(cached)):  # nothing committed, or no model here to run
        return
    old = next((r for r in read_jsonl_gz(data) if r["kind"] == "start"), None)
    if old is None:
        return
    new = json.load(open(cached))
    diff = start_diff(old, new)
    if diff:
        raise SystemExit(
            f"stress: the model in {rep.model} is not the one that made the runs in {data} (they differ in "
            f"{', '.join(diff)}; e.g. error_rate_other {new.get('error_rate_other')} here, "
            f"{old.get('error_rate_other')} in the file). Extend the grid on the machine that built it, or run "
            f"the whole grid on this model as a new replicate (REPLICATES in {__name__}).")


def export(rep: Replicate) -> str:
    from .tinyruns import kept_steps, run_status

    # runs already in the data file whose directories are gone (another machine, a cleaned cache) are kept:
    # the file is the record, the run directories only a working copy
    out = rep.data
    old = read_jsonl_gz(out) if os.path.isfile(out) else []
    recs = [r for r in old if r["kind"] == "start"][:1]
    if not recs and os.path.isfile(os.path.join(rep.model, "start.json")):
        recs.append({"kind": "start", **json.load(open(os.path.join(rep.model, "start.json")))})
    kept = {(r["arm"], r["lr_factor"], r["seed"]): r for r in old if r["kind"] == "run"}
    for arm in ARMS:
        for f in LR_FACTORS:
            for seed in range(20):
                d = run_dir(rep, arm, f, seed)
                if run_status(d) != "done":
                    if (arm, f, seed) in kept:
                        recs.append(kept[(arm, f, seed)])
                    continue
                keep = ("reward/mean", "entropy/mean", "reward/paper_format/mean", "reward/paper_accuracy/mean",
                        "update_norm", "kl/new_old", "kl/old_new", "grad_norm", "frac_zero_std_groups",
                        "gtpo/filtered_frac", "gtpo/conflict_frac", "completion_length/mean", "truncated_frac",
                        "probe/q0_open_tag", "probe/q0_answer_tags", "probe/q0_close_eos", "probe/q0_copy_operands",
                        "step_time_s", "step")
                steps = kept_steps(d, keep)
                recs.append({"kind": "run", "arm": arm, "lr_factor": f, "lr": BASE_LR * f, "seed": seed,
                             "argv": argv_for(rep, arm, f, seed), "summary": json.load(open(os.path.join(d, "summary.json"))),
                             "timing": json.load(open(os.path.join(d, "timing.json"))) if os.path.isfile(os.path.join(d, "timing.json")) else None,
                             "steps": steps})
    write_jsonl_gz(out, recs)
    return out


GRID = Design(name="grid", text="claim2-grid.md", declared_in="experiments/protocol/stress.py", module=MODULE,
              data=REPLICATES["b"].data, runs=REPLICATES["b"].runs)  # replicate b: the declared one (a predates it)


# ------------------------------------------------------------------ under the released optimiser (issue 32, item 2)
@dataclass(frozen=True)
class ReleasedOptimiser(Design):
    """GRPO and official GTPO (``arms``) with the released code's optimiser settings ``opt`` on the stress model
    ``rep``: a pilot at ``pilot_lrs`` x 1e-4 on ``pilot_seeds``, extended along ``ladder`` (:meth:`pilot_factors`),
    then ``n_main`` rates by :meth:`main_grid` on ``main_seeds``."""

    rep: Replicate
    opt: list[str]
    arms: dict[str, list[str]]
    ladder: tuple[float, ...]
    pilot_lrs: tuple[float, ...]
    pilot_seeds: tuple[int, ...]
    n_main: int
    main_seeds: tuple[int, ...]

    def run_dir(self, phase: str, arm: str, factor: float, seed: int, rep: Replicate | None = None) -> str:
        return os.path.join((rep or self.rep).runs, phase, arm, f"x{factor:g}", f"seed{seed}")

    def argv_for(self, arm: str, factor: float, seed: int, rep: Replicate | None = None) -> list[str]:
        rep = rep or self.rep
        return ["experiments/configs/tiny.yaml", *self.arms[arm], "--model",
                os.path.relpath(os.path.join(rep.model, "model"), ROOT), "--learning_rate", repr(BASE_LR * factor),
                "--seed", str(seed), "--max_steps", str(STEPS), "--eval_steps", "0", "--save_steps", "20",
                "--log_completions_steps", "10", "--log_policy_change", "true"]

    @staticmethod
    def collapsed(d: str) -> bool | None:
        """Whether the finished run in ``d`` collapsed (None while it has not finished)."""
        from .tinyruns import run_status, step_metrics

        if run_status(d) != "done":
            return None
        if "stopped" in json.load(open(os.path.join(d, "summary.json"))):
            return True
        return collapse_step([m["reward/mean"] for m in step_metrics(d)]) is not None

    # -------------------------------------------------------------- the declared rules
    def pilot_factors(self, outcomes: dict[float, list[bool]]) -> list[float]:
        """The pilot's factors given its finished outcomes so far (``outcomes[factor]``: collapsed per run, both
        arms, all pilot seeds): ``pilot_lrs`` extended along ``ladder`` while the top has no collapse or the
        bottom has one."""
        fs = sorted(set(self.pilot_lrs) | set(outcomes))
        full = len(self.arms) * len(self.pilot_seeds)
        if all(len(outcomes.get(f, [])) == full for f in fs):
            top, bottom = fs[-1], fs[0]
            if not any(outcomes[top]) and top < self.ladder[-1]:
                fs.append(self.ladder[self.ladder.index(top) + 1])
            elif any(outcomes[bottom]) and bottom > self.ladder[0]:
                fs.insert(0, self.ladder[self.ladder.index(bottom) - 1])
        return fs

    def main_grid(self, outcomes: dict[float, list[bool]]) -> list[float]:
        """The main grid from the finished pilot (``designs/claim2-released-optimiser.md``, **Main grid**)."""
        fs = sorted(outcomes)
        first_any = next((f for f in fs if any(outcomes[f])), None)
        if first_any is None:
            raise ValueError("claim2 released: no pilot run collapsed at any factor; the main grid has no upper end")
        below = [f for f in fs if f < first_any]
        lo = below[-1] if below else first_any
        hi = next((f for f in fs if all(outcomes[f])), fs[-1])
        if hi <= lo:
            hi = fs[fs.index(lo) + 1] if fs.index(lo) + 1 < len(fs) else lo
        if hi == lo:
            return [lo]
        step = (math.log(hi) - math.log(lo)) / (self.n_main - 1)
        return [float(f"{math.exp(math.log(lo) + i * step):.2g}") for i in range(self.n_main)]

    def pilot_outcomes(self, rep: Replicate | None = None) -> dict[float, list[bool]]:
        out: dict[float, list[bool]] = {}
        base = os.path.join((rep or self.rep).runs, "pilot")
        for arm in self.arms:
            d_arm = os.path.join(base, arm)
            for name in os.listdir(d_arm) if os.path.isdir(d_arm) else []:
                f = float(name[1:])
                for s in self.pilot_seeds:
                    c = self.collapsed(self.run_dir("pilot", arm, f, s, rep))
                    if c is not None:
                        out.setdefault(f, []).append(c)
        return out

    def jobs(self, phase: str = "all", seeds=None, rep: Replicate | None = None) -> list[tuple[str, str, float, int]]:
        """The runs to do now: the pilot (with its extensions), then (``phase`` "main" or "all") the main grid on
        ``seeds`` (``main_seeds`` by default); ``phase`` "pilot" stops after the pilot."""
        outc = self.pilot_outcomes(rep)
        fs = self.pilot_factors(outc)
        pilot = [("pilot", a, f, s) for f in fs for s in self.pilot_seeds for a in self.arms]
        todo = [j for j in pilot if self.collapsed(self.run_dir(*j, rep)) is None]
        if todo or phase == "pilot":
            return todo
        return [("main", a, f, s) for s in (self.main_seeds if seeds is None else seeds)
                for f in self.main_grid(outc) for a in self.arms]

    def run_job(self, phase: str, arm: str, factor: float, seed: int, rep: Replicate | None = None,
                module: str | None = None) -> None:
        """Run (or resume) one job on ``rep``'s model, its runs stamped with ``module``'s declaration."""
        from .declare import run_stamp
        from .tinyruns import execute

        rep = rep or self.rep
        build_stress(rep)
        check_same_model(rep)
        d = self.run_dir(phase, arm, factor, seed, rep)
        stamp = os.path.join(d, "declared.json")
        if not os.path.isfile(stamp):
            write_json(stamp, run_stamp(module or self.module))
        execute(self.argv_for(arm, factor, seed, rep), d, f"stress-opt {rep.name} {phase} {arm} x{factor:g} seed {seed}")

    def work(self, phase: str = "all", seeds=None) -> None:
        while True:
            todo = [j for j in self.jobs(phase, seeds) if self.collapsed(self.run_dir(*j)) is None]
            if not todo or os.path.exists(os.path.join(self.rep.runs, "STOP")):
                return
            self.run_job(*todo[0])

    def export(self, out: str | None = None, rep: Replicate | None = None) -> str:
        from .tinyruns import kept_steps, run_status

        out, rep = out or self.data, rep or self.rep
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
            for arm in self.arms:
                base = os.path.join(rep.runs, phase, arm)
                for name in sorted(os.listdir(base), key=lambda n: float(n[1:])) if os.path.isdir(base) else []:
                    f = float(name[1:])
                    names = [n for n in os.listdir(os.path.join(base, name)) if n[4:].isdigit()]  # not the .lock files
                    for sname in sorted(names, key=lambda n: int(n[4:])):
                        seed = int(sname[4:])
                        d = self.run_dir(phase, arm, f, seed, rep)
                        if run_status(d) != "done":
                            continue
                        timing = json.load(open(os.path.join(d, "timing.json")))
                        recs.append({"kind": "run", "phase": phase, "arm": arm, "lr_factor": f, "lr": BASE_LR * f,
                                     "seed": seed, "argv": timing["argv"],
                                     **json.load(open(os.path.join(d, "declared.json"))),
                                     "summary": json.load(open(os.path.join(d, "summary.json"))), "timing": timing,
                                     "steps": kept_steps(d, keep)})
                        seen.add((phase, arm, f, seed))
        recs += [r for k, r in sorted(kept.items(), key=str) if k not in seen]
        write_jsonl_gz(out, recs)
        return out

    def plan(self) -> None:
        outc = self.pilot_outcomes()
        print("pilot:", {f"x{f:g}": v for f, v in sorted(outc.items())}, "factors:", self.pilot_factors(outc))
        print("next jobs:", self.jobs()[:5])


#: the released code's optimiser settings (github.com/winstonsmith1897/GTPO; docs/method.md)
_OPT = ["--adam_beta1", "0.999999", "--adam_beta2", "0.999999", "--max_grad_norm", "0.1", "--weight_decay", "0.1",
        "--lr_scheduler_type", "cosine", "--warmup_ratio", "0.005"]
_RELEASED_DATA = os.path.join(DATA, "stress-released-optimiser.jsonl.gz")
RELEASED = ReleasedOptimiser(
    name="released", text="claim2-released-optimiser.md", declared_in="experiments/protocol/stress_opt.py",
    module=MODULE, data=_RELEASED_DATA, runs=os.path.join(RUNS, "stress-opt"),
    # replicate b's recipe rebuilt in that session (replicate b's model or a new one, by its start record)
    rep=Replicate("rebuilt", os.path.join(EXPERIMENTS, ".cache", "tiny-v3-s0-stress-opt"), os.path.join(RUNS, "stress-opt"),
                  _RELEASED_DATA),
    opt=_OPT, arms={"grpo": ["--preset", "grpo", *_OPT], "gtpo_official": ["--preset", "official", *_OPT]},
    ladder=(1.0, 3.2, 10.0, 32.0, 100.0, 320.0, 1000.0, 3200.0, 10000.0, 32000.0, 100000.0),  # by sqrt(10), both ways
    pilot_lrs=(10.0, 32.0, 100.0, 320.0, 1000.0), pilot_seeds=(100,), n_main=3, main_seeds=tuple(range(12)),
)


# ------------------------------------------------------------------ its continuation on another machine
@dataclass(frozen=True)
class ReleasedContinued(Design):
    """:data:`RELEASED`'s design (``base``) on the stress model ``rep`` built on another machine; by
    :meth:`branch`, "A" (the same model: ``base``'s seeds ``continuation_seeds`` on its committed grid, after a
    reproduction check on ``repro_seed``) or "B" (the whole design again); two workers, no job after ``stop_at``."""

    base: ReleasedOptimiser
    rep: Replicate
    stop_at: float
    ended: str
    wait_s: float
    continuation_seeds: tuple[int, ...]
    repro_seed: int

    def branch(self, start: dict | None = None) -> str:
        """"A" when the model built here (its start record ``start``, read from the cache by default) measures
        exactly as the one of the base design's committed data, "B" otherwise (see the amendment)."""
        if start is None:
            start = json.load(open(os.path.join(self.rep.model, "start.json")))
        first = next((r for r in read_jsonl_gz(self.base.data) if r["kind"] == "start"), None)
        return "A" if same_start(start, first) else "B"

    def committed_main_grid(self) -> list[float]:
        """The base design's main grid by its own rule (:meth:`ReleasedOptimiser.main_grid`) from its committed pilot."""
        outc: dict[float, list[bool]] = {}
        for r in read_jsonl_gz(self.base.data):
            if r["kind"] == "run" and r["phase"] == "pilot":
                c = "stopped" in r["summary"] or collapse_step([m["reward/mean"] for m in r["steps"]]) is not None
                outc.setdefault(r["lr_factor"], []).append(c)
        return self.base.main_grid(outc)

    def continuation_jobs(self) -> list[tuple[str, str, float, int]]:
        """Branch A in order: the reproduction check, then the grid on ``continuation_seeds`` seed by seed."""
        grid = self.committed_main_grid()
        return ([("main", a, grid[-1], self.repro_seed) for a in self.base.arms]
                + [("main", a, f, s) for s in self.continuation_seeds for f in grid for a in self.base.arms])

    def jobs(self) -> list[tuple[str, str, float, int]]:
        """The jobs due now, in the declared order: branch A's continuation, or (B) the pilot with its
        extensions, then the main grid."""
        if self.branch() == "A":
            return self.continuation_jobs()
        return self.base.jobs("all", self.base.main_seeds, self.rep)

    def _done(self, job) -> bool:
        return self.base.collapsed(self.base.run_dir(*job, self.rep)) is not None

    def work(self, now=time.time, sleep=time.sleep) -> None:
        """One worker: take the first job due that is neither done nor running in the other worker; wait while
        every job left is running; stop when none is left, at ``stop_at``, or when a STOP file exists."""
        while True:
            todo = [j for j in self.jobs() if not self._done(j)]
            if not todo:
                return
            if now() >= self.stop_at or os.path.exists(os.path.join(self.rep.runs, "STOP")):
                return
            for job in todo:
                d = self.base.run_dir(*job, self.rep)
                os.makedirs(os.path.dirname(d), exist_ok=True)
                lock = d + ".lock"
                if not take_lock(lock):
                    continue
                try:
                    self.base.run_job(*job, rep=self.rep, module=self.module)
                finally:
                    os.remove(lock)
                break
            else:
                sleep(self.wait_s)

    def plan(self) -> None:
        print("branch", self.branch())
        outc = self.base.pilot_outcomes(self.rep)
        print("pilot:", {f"x{f:g}": v for f, v in sorted(outc.items())}, "factors:", self.base.pilot_factors(outc))
        for job in self.jobs():
            print(*job, "done" if self._done(job) else "-")

    def export(self, out: str | None = None) -> str:
        return self.base.export(out or self.data, self.rep)


_CONTINUED_DATA = os.path.join(DATA, "stress-released-optimiser-c.jsonl.gz")
RELEASED_CONTINUED = ReleasedContinued(
    name="released-continued", text="claim2-released-optimiser-continued.md",
    declared_in="experiments/protocol/stress_opt_c.py", module=MODULE, data=_CONTINUED_DATA,
    runs=os.path.join(RUNS, "stress-opt-c"), base=RELEASED,
    # replicate b's recipe built on this machine (a model of its own unless its start record says otherwise)
    rep=Replicate("c", os.path.join(EXPERIMENTS, ".cache", "tiny-v3-s0-stress-c"), os.path.join(RUNS, "stress-opt-c"),
                  _CONTINUED_DATA),
    stop_at=datetime.datetime(2026, 12, 3, 17, 35, tzinfo=datetime.timezone.utc).timestamp(),
    # how the stopping rule ended the runs (written after the runs; the declaration is designs/...-continued.md)
    ended=("branch A (the start record equal to the first file's); all 38 jobs ran, the reproduction check and seeds "
           "6-11, from 15:56 to 16:04 UTC (two workers, 20-38 s a run), well before the stop time (17:35 UTC); "
           "nothing was added."),
    wait_s=10.0,  # how long a worker waits, when every job left runs in the other worker, before it reads them again
    continuation_seeds=tuple(range(6, 12)), repro_seed=0,  # branch A: base's seeds that did not run there; the check's
)
DESIGNS = {d.name: d for d in (GRID, RELEASED, RELEASED_CONTINUED)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    designs = p.add_subparsers(dest="design", required=True)
    g = designs.add_parser("grid", help="the arms x rates x seeds grid on a stress replicate")
    g.add_argument("--replicate", choices=sorted(REPLICATES), default="a",
                   help="which stress model (and its data file) to build, run or export")
    g.add_argument("--threads", type=int, default=argparse.SUPPRESS)
    sub = g.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build")
    r = sub.add_parser("run")
    r.add_argument("--arms", nargs="+", default=list(ARMS))
    r.add_argument("--lrs", type=float, nargs="+", default=list(LR_FACTORS))
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    r.add_argument("--order", choices=["seed", "arm"], default="seed",
                   help="seed: every arm and rate for seed 0, then seed 1, ... (usable results early)")
    sub.add_parser("export")
    o = designs.add_parser("released", help="GRPO and official GTPO under the released optimiser")
    o.add_argument("cmd", choices=["work", "plan", "export"])
    o.add_argument("--phase", choices=["pilot", "main", "all"], default="all")
    o.add_argument("--seeds", type=int, nargs="+", default=list(RELEASED.main_seeds), help="main-grid seeds to run")
    o.add_argument("--threads", type=int, default=argparse.SUPPRESS)
    c = designs.add_parser("released-continued", help="the released-optimiser design continued on another machine")
    c.add_argument("cmd", choices=["build", "work", "plan", "export"])
    c.add_argument("--threads", type=int, default=argparse.SUPPRESS)
    args = p.parse_args(argv)
    os.chdir(ROOT)
    setup_env(args.threads)
    if args.design == "released":
        if args.cmd == "work":
            RELEASED.work(args.phase, tuple(args.seeds))
        elif args.cmd == "plan":
            RELEASED.plan()
        else:
            print(RELEASED.export())
        return 0
    if args.design == "released-continued":
        if args.cmd == "build":
            print(build_stress(RELEASED_CONTINUED.rep))
        elif args.cmd == "work":
            RELEASED_CONTINUED.work()
        elif args.cmd == "plan":
            RELEASED_CONTINUED.plan()
        else:
            print(RELEASED_CONTINUED.export())
        return 0
    rep = REPLICATES[args.replicate]
    if args.cmd == "build":
        out = build_stress(rep)
        print(json.dumps(json.load(open(os.path.join(out, "start.json"))), indent=1))
        return 0
    if args.cmd == "export":
        check_same_model(rep)
        print(export(rep))
        return 0
    from .tinyruns import execute

    for a in args.arms:
        if a not in ARMS:
            p.error(f"unknown arm {a}")
    build_stress(rep)
    check_same_model(rep)
    jobs = [(a, f, s) for s in args.seeds for f in args.lrs for a in args.arms] if args.order == "seed" else \
        [(a, f, s) for a in args.arms for f in args.lrs for s in args.seeds]
    for a, f, s in jobs:
        execute(argv_for(rep, a, f, s), run_dir(rep, a, f, s), f"stress {rep.name} {a} {lr_label(f)} seed {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
