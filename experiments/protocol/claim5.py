"""Claim 5, OnlyNeg on SmolLM2 (issue 45 item 2; ``designs/claim5-onlyneg.md``): GTPO with the fixed tau 0.7 entropy
filter against the same filter restricted to negative completions (``entropy_filter_scope: negative``) on
``gtpo train --demo`` at lr 3e-4 for 30 steps, 24 paired seeds; primary outcome the greedy held-out accuracy after
training, paired t-test; verdict by :meth:`OnlyNeg.verdict`. Runs go through :mod:`experiments.protocol.smol`'s
recording hooks (each held-out problem's verdict and reply).

    python -m experiments.protocol.claim5 work      # in a snapshot; at most two processes
    python -m experiments.protocol.claim5 plan | export
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass

from .common import DATA, ROOT, RUNS, Design, cpu_seconds, read_jsonl, read_jsonl_gz, setup_env, write_json, write_jsonl_gz

MODULE = "experiments/protocol/claim5.py"


@dataclass(frozen=True)
class OnlyNeg(Design):
    """``arms`` ({name: overrides on top of ``base``}; ``full`` and ``onlyneg`` name the two) on ``gtpo train
    --demo`` + ``base``, paired ``seeds``; ``alpha``; ``mdd_declared`` (the declared MDD of the primary outcome)."""

    base: tuple[str, ...]
    arms: dict
    full: str
    onlyneg: str
    seeds: tuple[int, ...]
    alpha: float
    mdd_declared: float

    # -------------------------------------------------------------- the declared rule (pure)
    def verdict(self, diffs: list[float], mdd: float | None = None) -> tuple[str, dict]:
        """The declared rule on the per-seed differences OnlyNeg minus full filter (accuracy after training):
        "reproduced" (mean < 0, paired t p < alpha); "the opposite" (mean > 0, p < alpha); "not reproduced" (p >=
        alpha and the (1 - alpha) confidence interval of the mean lies above -``mdd``, the declared MDD by default);
        else "not decided". Returns (verdict, the paired t-test with ``lo``/``hi``, the interval)."""
        from . import stats

        mdd = self.mdd_declared if mdd is None else mdd
        t = stats.paired_t(diffs)
        n = len(diffs)
        half = stats.t_ppf(1 - self.alpha / 2, n - 1) * t["sd"] / math.sqrt(n) if n > 1 and t["sd"] == t["sd"] else math.inf
        t = {**t, "lo": t["mean"] - half, "hi": t["mean"] + half}
        p = t["p"] if t["p"] == t["p"] else 1.0
        if p < self.alpha:
            return ("reproduced" if t["mean"] < 0 else "the opposite"), t
        if t["lo"] > -mdd:
            return "not reproduced", t
        return "not decided", t

    # -------------------------------------------------------------- jobs and runs
    def jobs(self) -> list[tuple[str, int]]:
        """(arm, seed): both arms of a seed before the next seed."""
        return [(a, s) for s in self.seeds for a in (self.full, self.onlyneg)]

    def run_dir(self, arm: str, seed: int) -> str:
        return os.path.join(self.runs, arm, f"seed{seed}")

    def argv_for(self, arm: str, seed: int) -> list[str]:
        return ["--demo", "--seed", str(seed), *self.base, *self.arms[arm], "--log_policy_change", "true",
                "--disable_tqdm", "true", "--output_dir", os.path.relpath(self.run_dir(arm, seed), ROOT)]

    def done(self, arm: str, seed: int) -> bool:
        d = self.run_dir(arm, seed)
        return all(os.path.isfile(os.path.join(d, f)) for f in ("summary.json", "eval_after.json", "timing.json"))

    def run_job(self, arm: str, seed: int) -> None:
        from .declare import run_stamp
        from .smol import _recording_hooks
        from .tinyruns import run_status, train

        d = self.run_dir(arm, seed)
        os.makedirs(d, exist_ok=True)
        stamp = os.path.join(d, "declared.json")
        if not os.path.isfile(stamp):
            write_json(stamp, run_stamp(self.module))
        argv = self.argv_for(arm, seed)
        st = run_status(d)
        if st == "partial":
            argv += ["--resume_from_checkpoint", "true"]
        elif st != "fresh":
            argv += ["--overwrite"]
        t0, c0 = time.time(), cpu_seconds()
        code = train(argv, hooks=_recording_hooks(d))
        if code != 0:
            raise SystemExit(f"gtpo train exited {code}")
        if not os.path.isfile(os.path.join(d, "eval_after.json")):
            raise SystemExit(f"{d}: no eval_after.json")
        write_json(os.path.join(d, "timing.json"), {"wall_s": time.time() - t0, "cpu_s": cpu_seconds() - c0,
                                                    "argv": self.argv_for(arm, seed)})

    def work(self) -> None:
        """One worker (:meth:`common.Design.work_loop`, two at most): runs or resumes every job neither done nor in the
        committed data file, skipping those another worker holds; a STOP file in ``runs`` ends it before its next job."""
        self.work_loop()

    def export(self, out: str | None = None) -> str:
        """The data file: every finished run (its stamp, arguments, summary, timing, per-problem evaluation and every
        step's metrics under the committed names); committed runs whose directories are gone are kept."""
        from gtpo.run.metric_names import legacy_record

        out = out or self.data
        kept = {(r["arm"], r["seed"]): r for r in (read_jsonl_gz(out) if os.path.isfile(out) else [])}
        recs = []
        for arm, seed in self.jobs():
            d = self.run_dir(arm, seed)
            if self.done(arm, seed):
                steps = {}
                for m in map(legacy_record, read_jsonl(os.path.join(d, "metrics.jsonl"))):
                    if "reward/mean" in m:
                        steps[int(m["step"])] = {k: v for k, v in m.items() if isinstance(v, (int, float))}
                recs.append({"kind": "final", "arm": arm, "seed": seed, **json.load(open(os.path.join(d, "declared.json"))),
                             "argv": self.argv_for(arm, seed), "summary": json.load(open(os.path.join(d, "summary.json"))),
                             "timing": json.load(open(os.path.join(d, "timing.json"))),
                             "eval_after": json.load(open(os.path.join(d, "eval_after.json"))),
                             "steps": [steps[k] for k in sorted(steps)]})
            elif (arm, seed) in kept:
                recs.append(kept[(arm, seed)])
        write_jsonl_gz(out, recs)
        return out

    def plan(self) -> None:
        print(f"{sum(self.done(a, s) for a, s in self.jobs())} of {len(self.jobs())} runs done")


ONLYNEG = OnlyNeg(
    name="onlyneg", text="claim5-onlyneg.md", declared_in=MODULE, module=MODULE,
    data=os.path.join(DATA, "claim5-onlyneg.jsonl.gz"), runs=os.path.join(RUNS, "claim5-onlyneg"),
    base=("--learning_rate", "3e-4", "--max_steps", "30", "--entropy_rule", "fixed", "--entropy_threshold", "0.7"),
    arms={"full": (), "onlyneg": ("--entropy_filter_scope", "negative")}, full="full", onlyneg="onlyneg",
    seeds=tuple(range(100, 124)), alpha=0.05, mdd_declared=0.110,
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cmd", choices=["work", "plan", "export"])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    os.chdir(ROOT)
    setup_env(args.threads)
    if args.cmd == "work":
        ONLYNEG.work()
    elif args.cmd == "plan":
        ONLYNEG.plan()
    else:
        print(ONLYNEG.export())
    return 0


if __name__ == "__main__":
    sys.exit(main())
