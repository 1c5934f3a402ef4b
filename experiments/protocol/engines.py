"""The two engines on a real run (issue 45, item 4; ``designs/engines.md``): the default run, ``gtpo train --demo --seed
S``, on gtpo's engine and on TRL's engine (``--engine trl``), 4 paired seeds; the greedy held-out accuracy after
training, the per-step reward and entropy, the step time. The declared rules are :meth:`Engines.verdict`,
:meth:`Engines.curve_summary` and :meth:`Engines.step_time`; the report (``report/engines.py``) renders them.

    python -m experiments.protocol.engines work      # in a snapshot; one single-thread process; resumable
    python -m experiments.protocol.engines plan
    python -m experiments.protocol.engines export    # -> experiments/data/engines.jsonl.gz
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass

from .common import DATA, ROOT, RUNS, Design, cpu_seconds, now, read_jsonl, read_jsonl_gz, setup_env, \
    write_json, write_jsonl_gz

MODULE = "experiments/protocol/engines.py"


@dataclass(frozen=True)
class Engines(Design):
    """GTPO on two engines (``designs/engines.md``): ``arms`` (name, extra ``gtpo train`` arguments) on top of
    ``gtpo train --demo --seed S``, paired over ``seeds``, ``threads`` torch threads per run; the primary paired
    t-test at ``alpha``, the equivalence margin ``margin`` (accuracy, a fraction) by a 90 % interval."""

    seeds: tuple[int, ...]
    arms: tuple[tuple[str, tuple[str, ...]], ...]
    threads: int
    alpha: float
    margin: float
    #: the seed SDs of the default run's accuracy after training the power was declared from (two threads, one)
    seed_sds: tuple[float, float]

    # -------------------------------------------------------------- the declared rules (pure)
    def arm_names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.arms)

    def verdict(self, diffs: list[float]) -> dict:
        """The declared analysis of the paired differences ``diffs`` (TRL minus gtpo, greedy accuracy after, one per
        seed, fractions): paired t (two-sided), exact Wilcoxon, the 90 % interval of the mean and the verdict:
        "differ" (t p < alpha), else "agree within ±margin" (the 90 % interval inside (-margin, margin)), else
        "no difference detected"."""
        from . import stats

        n = len(diffs)
        t = stats.paired_t(diffs)
        mean = statistics.mean(diffs)
        sd = statistics.stdev(diffs) if n > 1 else float("nan")
        half = stats.t_ppf(0.95, n - 1) * sd / math.sqrt(n) if n > 1 else float("nan")
        lo, hi = mean - half, mean + half
        if t["p"] == t["p"] and t["p"] < self.alpha:
            label = "differ"
        elif lo > -self.margin and hi < self.margin:
            label = f"agree within ±{100 * self.margin:g} points"
        else:
            label = "no difference detected"
        return {"n": n, "mean": mean, "sd": sd, "t": t, "wilcoxon": stats.wilcoxon_signed_rank(diffs),
                "ci90": (lo, hi), "verdict": label}

    def power(self, n: int | None = None) -> list[dict]:
        """The declared power: for each seed SD, the paired difference's SD (√2 times: a seed does not couple the
        engines' samples) and the MDD at 80 % power and ``alpha`` with ``n`` pairs (default: the design's)."""
        from . import stats

        n = n or len(self.seeds)
        out = []
        for sd in self.seed_sds:
            d = math.sqrt(2) * sd
            out.append({"seed_sd": sd, "sd_diff": d, "n": n, "mdd": stats.mdd_paired(d, n, alpha=self.alpha),
                        "ci90_half": stats.t_ppf(0.95, n - 1) * d / math.sqrt(n)})
        return out

    #: the per-run curve summaries (name -> (metric, first step, last step); None: the run's last step)
    CURVES = {"reward, mean of all steps": ("reward", 1, None), "entropy, mean of all steps": ("entropy", 1, None),
              "entropy, mean of the last 10 steps": ("entropy", -10, None), "entropy at step 1": ("entropy", 1, 1)}

    @classmethod
    def curve_summary(cls, steps: list[dict]) -> dict[str, float]:
        """One run's curve summaries (:data:`CURVES`) from its per-step records (``step``, ``reward``, ``entropy``):
        a negative first step counts from the end."""
        steps = sorted(steps, key=lambda s: s["step"])
        out = {}
        for name, (key, first, last) in cls.CURVES.items():
            rows = steps[first:] if first < 0 else [s for s in steps if s["step"] >= first and (last is None or s["step"] <= last)]
            vals = [s[key] for s in rows if key in s]
            out[name] = statistics.mean(vals) if vals else float("nan")
        return out

    @staticmethod
    def step_time(run: dict) -> dict:
        """One run's step time: the median of its per-step wall ``step_time`` and the training CPU seconds per step
        (``timing['train_cpu_s']`` over the steps, None where an attempt was interrupted: not all its CPU counted;
        ``resumed`` marks a run that logged a step twice, resumed after an attempt killed before it could record its
        timing)."""
        walls = [s["step_time"] for s in run["steps"] if "step_time" in s]
        t = run.get("timing") or {}
        cpu = t.get("train_cpu_s")
        whole = t.get("attempts") == 1 and not run.get("resumed")  # an attempt killed before its end records nothing
        return {"wall_median_s": statistics.median(walls) if walls else float("nan"),
                "cpu_per_step_s": cpu / len(run["steps"]) if cpu and whole and run["steps"] else None}

    @staticmethod
    def ratio(trl: list[float], gtpo: list[float]) -> float:
        """Geometric mean of the per-seed ratios trl / gtpo."""
        rs = [a / b for a, b in zip(trl, gtpo)]
        return math.exp(statistics.mean(math.log(r) for r in rs)) if rs else float("nan")

    # -------------------------------------------------------------- jobs and runs
    def jobs(self) -> list[tuple[str, int]]:
        """(arm, seed) in run order: seed by seed, both engines of a seed before the next seed."""
        return [(a, s) for s in self.seeds for a in self.arm_names()]

    def run_dir(self, arm: str, seed: int) -> str:
        return os.path.join(self.runs, arm, f"seed{seed}")

    def argv_for(self, arm: str, seed: int) -> list[str]:
        return ["--demo", "--seed", str(seed), *dict(self.arms)[arm], "--disable_tqdm", "true",
                "--output_dir", os.path.relpath(self.run_dir(arm, seed), ROOT)]

    def before_cache(self, arm: str) -> str:
        return os.path.join(self.runs, f"before-{arm}.json")

    def done(self, arm: str, seed: int) -> bool:
        d = self.run_dir(arm, seed)
        return all(os.path.isfile(os.path.join(d, n)) for n in ("summary.json", "eval_after.json"))

    def _hooks(self, arm: str, d: str, marks: dict):
        """:class:`gtpo.app.RunHooks` whose greedy accuracy (the CLI's, ``smol.detailed_greedy``) also records each
        problem's verdict and reply, computes "before" once per engine, and marks when training starts and ends."""
        from gtpo.app import RunHooks

        from .smol import detailed_greedy

        def greedy(model, tokenizer, dataset, reward, config, engine=None, stage=None):
            if stage == "before":
                cache = self.before_cache(arm)
                if os.path.isfile(cache):
                    acc = json.load(open(cache))["accuracy"]
                else:
                    res = detailed_greedy(model, tokenizer, dataset, reward, config)
                    write_json(cache, res)
                    acc = res["accuracy"]
                marks["train_start"] = (time.time(), cpu_seconds())
                return acc
            marks["train_end"] = (time.time(), cpu_seconds())
            res = detailed_greedy(model, tokenizer, dataset, reward, config)
            write_json(os.path.join(d, "eval_after.json"), res)
            return res["accuracy"]

        return RunHooks(accuracy=greedy)

    def run_job(self, arm: str, seed: int) -> None:
        from .declare import run_stamp
        from .tinyruns import run_status, train

        d = self.run_dir(arm, seed)
        st = run_status(d)  # before the stamp is written: a folder holding only the stamp is a fresh run
        if st == "restart" and os.listdir(d) == ["declared.json"]:
            st = "fresh"
        stamp = os.path.join(d, "declared.json")
        if not os.path.isfile(stamp):  # the first start of this run (a resumed run keeps its first stamp)
            write_json(stamp, run_stamp(self.module))
        argv = self.argv_for(arm, seed)
        if st == "partial":
            argv += ["--resume_from_checkpoint", "true"]
        elif st == "restart":
            argv += ["--overwrite"]
        if st == "done":  # trained, not scored: cannot happen (the after-evaluation precedes summary.json)
            raise SystemExit(f"{d}: summary.json without eval_after.json; remove the folder to rerun it")
        print(f"[engines] {now()} {arm} seed {seed} ({st}): gtpo train {' '.join(argv)}", flush=True)
        t0, c0 = time.time(), cpu_seconds()
        marks = {"attempt_start": (t0, c0)}
        code = train(argv, hooks=self._hooks(arm, d, marks))
        if code != 0 or not os.path.isfile(os.path.join(d, "eval_after.json")):
            raise SystemExit(f"{d}: gtpo train exited {code}" + ("" if code else " without eval_after.json"))
        tpath = os.path.join(d, "timing.json")
        old = json.load(open(tpath)) if os.path.isfile(tpath) else {"wall_s": 0.0, "cpu_s": 0.0, "attempts": 0,
                                                                      "train_wall_s": 0.0, "train_cpu_s": 0.0}
        start = marks.get("train_start", marks["attempt_start"])  # a resumed run may skip the before-evaluation
        end = marks["train_end"]
        write_json(tpath, {"wall_s": old["wall_s"] + time.time() - t0, "cpu_s": old["cpu_s"] + cpu_seconds() - c0,
                           "train_wall_s": old["train_wall_s"] + end[0] - start[0],
                           "train_cpu_s": old["train_cpu_s"] + end[1] - start[1],
                           "attempts": old["attempts"] + 1, "threads": self.threads, "argv": self.argv_for(arm, seed)})
        print(f"[engines] {now()} {arm} seed {seed}: done in {(time.time() - t0) / 60:.1f} min", flush=True)

    def work(self) -> None:
        """One worker (:meth:`common.Design.work_loop`, two at most): runs or resumes every job neither done nor in the
        committed data file, skipping those another worker holds; a STOP file in ``runs`` ends it before its next job."""
        setup_env(self.threads)
        self.work_loop()

    @staticmethod
    def resumed(d: str) -> bool:
        """Whether the run in ``d`` logged some step more than once: an attempt ended before the run's end (killed,
        its timing never written) and the next resumed from a checkpoint, re-logging the steps after it."""
        seen = [int(m["step"]) for m in read_jsonl(os.path.join(d, "metrics.jsonl")) if "reward" in m and "step" in m]
        return len(seen) != len(set(seen))

    @staticmethod
    def steps_of(d: str) -> list[dict]:
        """Every training step's numeric metrics of the run in ``d`` under the current names (both engines log the
        same ones: :func:`gtpo.run.metric_names.canonical_record`), the last line of a step winning (a resumed run
        re-logs steps); lines without ``reward`` (TRL's closing summary) are not steps."""
        from gtpo.run.metric_names import canonical_record

        steps: dict[int, dict] = {}
        for m in map(canonical_record, read_jsonl(os.path.join(d, "metrics.jsonl"))):
            if "reward" in m and "step" in m:
                steps[int(m["step"])] = {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return [steps[k] for k in sorted(steps)]

    def export(self, out: str | None = None) -> str:
        """The data file: each engine's "before" evaluation, then every finished run (per-step metrics, the
        after-evaluation with every reply, timing, declaration); committed runs whose folders are gone are kept."""
        out = out or self.data
        old = read_jsonl_gz(out) if os.path.isfile(out) else []
        recs = []
        for arm in self.arm_names():
            if os.path.isfile(self.before_cache(arm)):
                recs.append({"kind": "before", "arm": arm, **json.load(open(self.before_cache(arm)))})
            else:
                recs += [r for r in old if r["kind"] == "before" and r["arm"] == arm]
        kept = {(r["arm"], r["seed"]): r for r in old if r["kind"] == "run"}
        for arm, seed in self.jobs():
            d = self.run_dir(arm, seed)
            if self.done(arm, seed):
                recs.append({"kind": "run", "arm": arm, "seed": seed, "argv": self.argv_for(arm, seed),
                             **json.load(open(os.path.join(d, "declared.json"))),
                             "summary": json.load(open(os.path.join(d, "summary.json"))),
                             "timing": json.load(open(t)) if os.path.isfile(t := os.path.join(d, "timing.json")) else None,
                             "eval_after": json.load(open(os.path.join(d, "eval_after.json"))),
                             "resumed": self.resumed(d), "steps": self.steps_of(d)})
            elif (arm, seed) in kept:
                recs.append(kept[(arm, seed)])
        write_jsonl_gz(out, recs)
        return out

    def plan(self) -> None:
        n = sum(self.done(a, s) for a, s in self.jobs())
        print(f"{n} of {len(self.jobs())} runs done")
        for arm, seed in self.jobs():
            d = self.run_dir(arm, seed)
            state = "done" if self.done(arm, seed) else ("running" if os.path.exists(d + ".lock") else
                                                          ("partial" if os.path.isdir(d) else "-"))
            print(arm, seed, state)


ENGINES = Engines(
    name="engines", text="engines.md", declared_in=MODULE, module=MODULE,
    data=os.path.join(DATA, "engines.jsonl.gz"), runs=os.path.join(RUNS, "engines"),
    seeds=(0, 1, 2, 3), arms=(("gtpo", ()), ("trl", ("--engine", "trl"))), threads=1,
    alpha=0.05, margin=0.10, seed_sds=(0.03546, 0.04932),
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cmd", choices=["work", "plan", "export"])
    args = p.parse_args(argv)
    os.chdir(ROOT)
    if args.cmd == "work":
        ENGINES.work()
    elif args.cmd == "plan":
        ENGINES.plan()
    else:
        print(ENGINES.export())
    return 0


if __name__ == "__main__":
    sys.exit(main())
