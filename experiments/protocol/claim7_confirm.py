"""Claim 7, the confirmation (issue 45, item 1; ``designs/claim7-confirm.md``): GRPO, GRPO + conflict masks and
official GTPO at 5e-5 on 32 fresh paired seeds, every run scored on the tuning (validation) and held-out splits at
temperature 1.0, 0.6 and greedily; each arm's temperature chosen on the tuning split (:meth:`Confirm.chosen_temperature`),
the verdict by :meth:`Confirm.verdict`. Its start model is the claim-7 recipe built once and committed as
``data/claim7-confirm-start.tar.xz`` (:meth:`Confirm.pack`), unpacked on every machine (:meth:`Confirm.unpack`), so runs
in later sessions on other machines continue the same experiment.

    python -m experiments.protocol.claim7_confirm build     # once: build and pack the start model (then commit it)
    python -m experiments.protocol.claim7_confirm work      # in a snapshot; at most two processes
    python -m experiments.protocol.claim7_confirm plan | export
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

from .claim7 import ATTRIBUTION, GREEDY, NOTHING_LEARNED, _eval_file, _record, base_argv
from .common import DATA, ROOT, RUNS, Design, read_jsonl_gz, setup_env, write_json, write_jsonl_gz
from .startmodels import START, build_claim7

MODULE = "experiments/protocol/claim7_confirm.py"


#: where the confirmation's start model is unpacked (git-ignored cache); its weights travel in ``Confirm.archive``
CONFIRM_START = os.path.join(os.path.dirname(START), "claim7-confirm-start")
#: the tiny task's splits that ``experiments/configs/tiny.yaml`` trains on (its ``dataset``; the ``eval_dataset`` is
#: read at start): not in the archive, so :meth:`Confirm.unpack` writes them from ``pretrain.make_splits(0)`` (pure
#: Python, deterministic) and checks them against the sha256 of the files the first run trained on (amendment)
TASK_SPLITS = {"train.jsonl": "105186c35d3a46bbae5fb64cdddf12940a7d940d3072a0b1570860916501be44",
               "test.jsonl": "05d407a1570bd3c84667d9099c968cca820c0e3da8433e1e2fcef47ae3d69714"}
#: an evaluation of the confirmation: (split, temperature); temperature 0 is greedy (one completion)
Eval = tuple[str, float]


def _sha256(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Confirm(Design):
    """A confirmatory replication of the attribution's one positive (exploratory) finding, GRPO + masks minus
    GRPO (``designs/claim7-confirm.md``): ``arms`` at one rate ``lr`` on fresh ``seeds`` (paired), every run scored on
    the tuning (validation) and held-out splits at each of ``temperatures`` (0: greedy); each arm's evaluation
    temperature chosen on the tuning split by :meth:`chosen_temperature`; the verdict by :meth:`verdict`.
    The start model is the one packed in ``archive`` (committed), whatever machine runs: :meth:`unpack`."""

    steps: int
    lr: float
    seeds: tuple[int, ...]
    arms: tuple[str, ...]
    temperatures: tuple[float, ...]
    archive: str
    primary: tuple[str, str]
    secondary: tuple[tuple[str, str, str], ...]
    alpha: float
    alpha_secondary: float

    # -------------------------------------------------------------- the declared rules (pure)
    @staticmethod
    def chosen_temperature(scores: dict[float, list[float]]) -> float:
        """The temperature rule: ``scores`` maps each evaluation temperature to the arm's tuning-split pass@1 per
        seed; the temperature with the highest mean, ties to the higher temperature (1.0 is the original setting)."""
        means = {t: sum(v) / len(v) for t, v in scores.items() if v}
        if not means:
            raise ValueError("Confirm.chosen_temperature: no tuning-split scores")
        return max(sorted(means), key=lambda t: (means[t], t))

    def verdict(self, p_primary: float, d_primary: float, p_t1: float, d_t1: float) -> str:
        """The declared verdict: ``p_primary``/``d_primary`` the Wilcoxon p and mean of GRPO + masks minus GRPO on
        held-out pass@1, each arm at its chosen temperature; ``p_t1``/``d_t1`` the same at temperature 1.0.
        "confirmed" (primary p < alpha, gain > 0); else "sharpening" (the temperature-1 gain holds at
        alpha_secondary but vanishes once each arm is at its best temperature); else "not confirmed"."""
        if p_primary < self.alpha and d_primary > 0:
            return "confirmed"
        if p_t1 < self.alpha_secondary and d_t1 > 0:
            return "sharpening"
        return "not confirmed"

    # -------------------------------------------------------------- jobs and runs
    def evals(self) -> tuple[Eval, ...]:
        return tuple((split, t) for split in ("validation", "heldout") for t in self.temperatures)

    @staticmethod
    def eval_name(split: str, t: float) -> str:
        return f"{split}_t{t:g}"

    def jobs(self) -> list[tuple[str, int]]:
        """(arm, seed) in run order: seed by seed, every arm of a seed before the next seed (pairs complete first)."""
        return [(a, s) for s in self.seeds for a in self.arms]

    def run_dir(self, arm: str, seed: int) -> str:
        return os.path.join(self.runs, arm, f"seed{seed}")

    def argv_for(self, arm: str, seed: int) -> list[str]:
        argv = base_argv(ATTRIBUTION.arm_argv(arm), self.lr, seed, self.steps)
        i = argv.index("--model")
        return [*argv[:i + 1], os.path.relpath(os.path.join(CONFIRM_START, "model"), ROOT), *argv[i + 2:]]

    def done(self, arm: str, seed: int) -> bool:
        d = self.run_dir(arm, seed)
        return all(os.path.isfile(_eval_file(d, self.eval_name(*e))) for e in self.evals())

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
        if not os.path.isfile(stamp):  # the first start of this run (a resumed run keeps its first stamp)
            write_json(stamp, {**run_stamp(self.module), "start_sha256": self.start_digest()})
        if run_status(d) != "done":
            execute(self.argv_for(arm, seed), d, f"claim7 confirm {arm} lr {self.lr:g} seed {seed}")
        for split, t in self.evals():
            if not os.path.isfile(_eval_file(d, self.eval_name(split, t))):
                self.score(d, split, t)

    # -------------------------------------------------------------- the start model, the same on every machine
    def start_digest(self) -> str:
        return _sha256(self.archive)

    def pack(self) -> str:
        """Build the claim-7 start model (cached), round its weights to float16 precision (kept as float32: the
        archive is half the size, and training loads it as every other run's model), measure the rounded model on
        the held-out and tuning splits (temperature 1: the start record), and pack weights, tokenizer, splits and
        record into ``archive`` (tar.xz, fixed order and times). The packed model is the start model. Refuses when
        ``archive`` exists."""
        import shutil
        import tarfile

        import torch
        from safetensors.torch import load_file, save_file

        from .startmodels import eval_model

        if os.path.isfile(self.archive):
            raise SystemExit(f"claim7 confirm: {self.archive} exists; it is this design's start model (unpack it)")
        src = build_claim7()
        work = CONFIRM_START + f".pack{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(os.path.join(src, "model"), os.path.join(work, "model"))
        shutil.copytree(os.path.join(src, "data"), os.path.join(work, "data"))
        weights = os.path.join(work, "model", "model.safetensors")
        save_file({k: v.to(torch.float16).to(torch.float32).contiguous() for k, v in load_file(weights).items()},
                  weights, metadata={"format": "pt"})
        build = json.load(open(os.path.join(src, "start.json")))
        record = {"build": {k: v for k, v in build.items() if k != "heldout_per_problem"}, "rounding": "float16",
                  "model_sha256": _sha256(weights)}
        for split in ("heldout", "validation"):
            ev = eval_model(os.path.join(work, "model"), os.path.join(work, "data", f"{split}.jsonl"))
            record[split] = ev["metrics"]
        write_json(os.path.join(work, "start.json"), record)
        names = sorted(os.path.relpath(os.path.join(r, f), work) for r, _, fs in os.walk(work) for f in fs)
        with tarfile.open(self.archive, "w:xz", preset=9) as tar:
            for n in names:
                info = tar.gettarinfo(os.path.join(work, n), arcname=n)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with open(os.path.join(work, n), "rb") as f:
                    tar.addfile(info, f)
        shutil.rmtree(work)
        return self.archive

    @staticmethod
    def task_splits() -> str:
        """The tiny task's train and test splits (:data:`TASK_SPLITS`) in the tiny model's cache directory, written
        from ``pretrain.make_splits(0)`` where missing (a machine that never built the tiny model); a file whose
        sha256 differs from the declared one (existing or written) refuses the run."""
        from experiments import pretrain

        data = os.path.join(pretrain.cache_dir(0), "data")
        os.makedirs(data, exist_ok=True)
        _, train, test = pretrain.make_splits(0)
        for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
            path = os.path.join(data, name)
            if not os.path.isfile(path):
                pretrain._write_jsonl(path, rows)
            if _sha256(path) != TASK_SPLITS[name]:
                raise SystemExit(f"claim7 confirm: {path} has sha256 {_sha256(path)[:16]}, not the declared "
                                 f"{TASK_SPLITS[name][:16]} (the split every run of this design trains on)")
        return data

    def unpack(self) -> str:
        """The start model from ``archive`` in :data:`CONFIRM_START` (unpacked once; again when the archive's digest
        changed), and the task's splits (:meth:`task_splits`). Every run of this design starts from these bytes, so
        a run on another machine continues the same experiment."""
        import shutil
        import tarfile

        self.task_splits()

        if not os.path.isfile(self.archive):
            raise SystemExit(f"claim7 confirm: no start model archive {self.archive}: run `claim7 confirm build` "
                             "once, then commit the archive")
        dig = self.start_digest()
        mark = os.path.join(CONFIRM_START, "archive.sha256")
        if os.path.isfile(mark) and open(mark).read().strip() == dig:
            return CONFIRM_START
        work = CONFIRM_START + f".partial{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        with tarfile.open(self.archive, "r:xz") as tar:
            tar.extractall(work, filter="data")
        with open(os.path.join(work, "archive.sha256"), "w") as f:
            f.write(dig + "\n")
        shutil.rmtree(CONFIRM_START, ignore_errors=True)
        os.replace(work, CONFIRM_START)
        return CONFIRM_START

    def work(self) -> None:
        """One worker (:meth:`common.Design.work_loop`, two at most): runs or resumes every job neither done nor in the
        committed data file, skipping those another worker holds; a STOP file in ``runs`` ends it before its next job."""
        self.unpack()
        self.work_loop()

    def export(self, out: str | None = None) -> str:
        """The data file: the start record (the archive's digest), then every finished run; committed runs whose
        directories are gone are kept."""
        from .tinyruns import run_status

        out = out or self.data
        old = read_jsonl_gz(out) if os.path.isfile(out) else []
        kept = {(r["arm"], r["seed"]): r for r in old if r["kind"] != "start"}
        dig = self.start_digest()
        recs = [r for r in old if r["kind"] == "start" and r.get("archive_sha256") == dig][:1]
        if not recs:
            recs = [{"kind": "start", "archive_sha256": dig, **json.load(open(os.path.join(self.unpack(), "start.json")))}]
        for arm, seed in self.jobs():
            d = self.run_dir(arm, seed)
            if run_status(d) == "done" and self.done(arm, seed):
                recs.append(_record(d, {"kind": "final", "arm": arm, "lr": self.lr, "seed": seed},
                                    tuple(self.eval_name(*e) for e in self.evals())))
            elif (arm, seed) in kept:  # committed, its directory gone
                recs.append(kept[(arm, seed)])
        write_jsonl_gz(out, recs)
        return out

    def plan(self) -> None:
        n = sum(self.done(a, s) for a, s in self.jobs())
        print(f"{n} of {len(self.jobs())} runs done")
        for arm, seed in self.jobs():
            print(arm, seed, "done" if self.done(arm, seed) else ("running" if os.path.exists(self.run_dir(arm, seed) + ".lock") else "-"))


CONFIRM = Confirm(
    name="confirm", text="claim7-confirm.md", declared_in=MODULE, module=MODULE,
    data=os.path.join(DATA, "claim7-confirm.jsonl.gz"), runs=os.path.join(RUNS, "claim7-confirm"),
    steps=150, lr=5e-5, seeds=tuple(range(200, 232)), arms=("grpo", "grpo_masks", "gtpo"),
    temperatures=(1.0, 0.6, 0.0), archive=os.path.join(DATA, "claim7-confirm-start.tar.xz"),
    primary=("grpo_masks", "grpo"),
    # (arm, reference, temperature: "chosen" = each arm at its chosen temperature, or a fixed one)
    secondary=(("grpo_masks", "grpo", "1.0"), ("gtpo", "grpo", "chosen")),
    alpha=0.05, alpha_secondary=0.025,
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cmd", choices=["build", "work", "plan", "export"])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    os.chdir(ROOT)
    setup_env(args.threads)
    if args.cmd == "build":
        print(CONFIRM.pack(), CONFIRM.start_digest())
    elif args.cmd == "work":
        CONFIRM.work()
    elif args.cmd == "plan":
        CONFIRM.plan()
    else:
        print(CONFIRM.export())
    return 0


if __name__ == "__main__":
    sys.exit(main())
