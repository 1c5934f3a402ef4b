"""Claim 4, the long horizon (issue 45 item 2; ``designs/claim4-horizon.md``): official GTPO against the same without
the entropy filter (gamma 0.1 on every completion) for 4500 steps on the claim-7 confirmation's committed start model,
12 paired seeds; the no-filter arm runs only where the GTPO run's filter acted (:meth:`Horizon.jobs`: elsewhere the
two are one run), plus one check seed. Primary outcome: the entropy crossed ln 2 (:meth:`Horizon.crossed`), exact
McNemar; verdict by :meth:`Horizon.verdict`.

    python -m experiments.protocol.claim4 work      # in a snapshot; at most two processes
    python -m experiments.protocol.claim4 plan | export
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass

from .claim2 import collapse_step
from .claim7 import GREEDY, NOTHING_LEARNED, _eval_file, _record, base_argv
from .claim7_confirm import CONFIRM, CONFIRM_START
from .common import DATA, ROOT, RUNS, Design, read_jsonl_gz, setup_env, write_json, write_jsonl_gz

MODULE = "experiments/protocol/claim4.py"
LN2 = math.log(2.0)


@dataclass(frozen=True)
class Horizon(Design):
    """``arms`` ({name: gtpo train overrides}; ``filter_arm`` first, ``nofilter_arm`` second) at ``lr`` for ``steps``
    steps from the confirmation's start model, paired ``seeds``; ``check_seed`` always runs both arms; ``evals``
    ((split, temperature); 0 greedy); ``window`` and ``level`` of the primary outcome; ``alpha``."""

    steps: int
    lr: float
    seeds: tuple[int, ...]
    arms: dict
    filter_arm: str
    nofilter_arm: str
    check_seed: int
    evals: tuple[tuple[str, float], ...]
    window: int
    level: float
    alpha: float

    # -------------------------------------------------------------- the declared rules (pure)
    def crossed(self, entropies: list[float]) -> bool:
        """The primary outcome of one run: some ``window``-step moving mean of its step mean token entropies is above
        ``level`` (ln 2)."""
        w = self.window
        return any(sum(entropies[i:i + w]) / w > self.level for i in range(0, len(entropies) - w + 1))

    @staticmethod
    def collapsed(rewards: list[float], stopped: bool = False) -> bool:
        """The secondary outcome: the claim-2 collapse criterion on the training reward, or the run ended itself."""
        return stopped or collapse_step(rewards) is not None

    @staticmethod
    def acted(steps: list[dict]) -> bool:
        """Whether the filter dropped any completion in a run (``gtpo/filtered_frac`` > 0 at some step)."""
        return any(s.get("gtpo/filtered_frac", 0.0) > 0 for s in steps)

    def verdict(self, pairs: list[tuple[bool, bool]]) -> tuple[str, float]:
        """The declared rule on the primary outcome: ``pairs`` one (GTPO crossed, no-filter crossed) per seed.
        Returns (verdict, exact McNemar p): "reproduced" (p < alpha, the discordant pairs on the no-filter side: it
        crosses ln 2, the GTPO run does not); "not reproduced" (no no-filter run crossed: the crossing probability
        is then below :meth:`upper_bound`); else "not decided"."""
        from . import stats

        nofilter_only = sum(1 for f, n in pairs if n and not f)
        filter_only = sum(1 for f, n in pairs if f and not n)
        p = stats.mcnemar_exact(nofilter_only, filter_only)
        if p < self.alpha and nofilter_only > filter_only:
            return "reproduced", p
        if pairs and not any(n for _, n in pairs):
            return "not reproduced", p
        return "not decided", p

    def upper_bound(self, n: int) -> float:
        """One-sided (1 - alpha) upper bound of a probability with 0 events in ``n`` trials: 1 - alpha^(1/n)."""
        return 1.0 - self.alpha ** (1.0 / n)

    # -------------------------------------------------------------- jobs and runs
    def run_dir(self, arm: str, seed: int) -> str:
        return os.path.join(self.runs, arm, f"seed{seed}")

    def argv_for(self, arm: str, seed: int) -> list[str]:
        argv = base_argv(list(self.arms[arm]), self.lr, seed, self.steps)
        i = argv.index("--model")
        return [*argv[:i + 1], os.path.relpath(os.path.join(CONFIRM_START, "model"), ROOT), *argv[i + 2:]]

    @staticmethod
    def eval_name(split: str, t: float) -> str:
        return f"{split}_t{t:g}"

    def done(self, arm: str, seed: int) -> bool:
        d = self.run_dir(arm, seed)
        return all(os.path.isfile(_eval_file(d, self.eval_name(*e))) for e in self.evals)

    def needs_nofilter(self, seed: int) -> bool | None:
        """The stopping rule: the no-filter arm runs on ``check_seed`` and where the GTPO run's filter acted; None
        while the GTPO run has not finished."""
        if seed == self.check_seed:
            return True
        if not self.done(self.filter_arm, seed):  # finished and committed elsewhere: its exported steps decide
            rec = next((r for r in (read_jsonl_gz(self.data) if os.path.isfile(self.data) else [])
                        if r.get("arm") == self.filter_arm and r.get("seed") == seed and "steps" in r), None)
            return None if rec is None else self.acted(rec["steps"])
        from .tinyruns import step_metrics

        return self.acted(step_metrics(self.run_dir(self.filter_arm, seed)))

    def jobs(self) -> list[tuple[str, int]]:
        """(arm, seed) in run order: every GTPO run, then the no-filter runs the stopping rule asks for so far."""
        return ([(self.filter_arm, s) for s in self.seeds]
                + [(self.nofilter_arm, s) for s in self.seeds if self.needs_nofilter(s)])

    def score(self, d: str, split: str, t: float) -> None:
        from gtpo.evaluation import evaluate

        from .common import cpu_seconds
        from .startmodels import EVAL

        path = _eval_file(d, self.eval_name(split, t))
        summary = json.load(open(os.path.join(d, "summary.json")))
        if "stopped" in summary:
            write_json(path, {"metrics": dict(NOTHING_LEARNED), "stopped": summary["stopped"]})
            return
        data = os.path.relpath(os.path.join(CONFIRM_START, "data", f"{split}.jsonl"), ROOT)
        t0, c0 = time.time(), cpu_seconds()
        opts = dict(GREEDY) if t == 0 else dict(EVAL, temperature=t)
        ev = evaluate(d, dataset=data, seed=0, **opts)
        ev["split"], ev["temperature"] = split, t
        ev["timing"] = {"wall_s": time.time() - t0, "cpu_s": cpu_seconds() - c0}
        write_json(path, ev)

    def run_job(self, arm: str, seed: int) -> None:
        from .declare import run_stamp
        from .tinyruns import execute, run_status

        d = self.run_dir(arm, seed)
        stamp = os.path.join(d, "declared.json")
        if not os.path.isfile(stamp):
            write_json(stamp, {**run_stamp(self.module), "start_sha256": CONFIRM.start_digest()})
        if run_status(d) != "done":
            execute(self.argv_for(arm, seed), d, f"claim4 horizon {arm} seed {seed}")
        for split, t in self.evals:
            if not os.path.isfile(_eval_file(d, self.eval_name(split, t))):
                self.score(d, split, t)

    def work(self) -> None:
        """One worker (:meth:`common.Design.work_loop`, two at most): runs or resumes every job neither done nor in the
        committed data file, skipping those another worker holds; a STOP file in ``runs`` ends it before its next job."""
        CONFIRM.unpack()
        self.work_loop()

    def export(self, out: str | None = None) -> str:
        """The data file: the start record (the archive's digest), then every finished run; committed runs whose
        directories are gone are kept."""
        from .tinyruns import run_status

        out = out or self.data
        old = read_jsonl_gz(out) if os.path.isfile(out) else []
        kept = {(r["arm"], r["seed"]): r for r in old if r["kind"] != "start"}
        dig = CONFIRM.start_digest()
        recs = [r for r in old if r["kind"] == "start" and r.get("archive_sha256") == dig][:1]
        if not recs:
            recs = [{"kind": "start", "archive_sha256": dig,
                     **json.load(open(os.path.join(CONFIRM.unpack(), "start.json")))}]
        for arm, seed in self.jobs():
            d = self.run_dir(arm, seed)
            if run_status(d) == "done" and self.done(arm, seed):
                recs.append(_record(d, {"kind": "final", "arm": arm, "lr": self.lr, "seed": seed},
                                    tuple(self.eval_name(*e) for e in self.evals)))
            elif (arm, seed) in kept:
                recs.append(kept[(arm, seed)])
        write_jsonl_gz(out, recs)
        return out

    def plan(self) -> None:
        jobs = self.jobs()
        print(f"{sum(self.done(a, s) for a, s in jobs)} of {len(jobs)} runs listed so far done")
        for arm, seed in jobs:
            print(arm, seed, "done" if self.done(arm, seed) else ("running" if os.path.exists(self.run_dir(arm, seed) + ".lock") else "-"))


HORIZON = Horizon(
    name="horizon", text="claim4-horizon.md", declared_in=MODULE, module=MODULE,
    data=os.path.join(DATA, "claim4-horizon.jsonl.gz"), runs=os.path.join(RUNS, "claim4-horizon"),
    steps=4500, lr=5e-5, seeds=tuple(range(300, 312)),
    arms={"gtpo": ("--preset", "official"), "gtpo_nofilter": ("--preset", "official", "--entropy_filter", "false")},
    filter_arm="gtpo", nofilter_arm="gtpo_nofilter", check_seed=300,
    evals=(("heldout", 1.0), ("heldout", 0.0)), window=5, level=LN2, alpha=0.05,
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cmd", choices=["work", "plan", "export"])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    os.chdir(ROOT)
    setup_env(args.threads)
    if args.cmd == "work":
        HORIZON.work()
    elif args.cmd == "plan":
        HORIZON.plan()
    else:
        print(HORIZON.export())
    return 0


if __name__ == "__main__":
    sys.exit(main())
