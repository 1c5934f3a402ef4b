"""Claim 2, a stress where GRPO's failure can appear (issue 16, item 2).

**The stress model.** The tiny model (``experiments/pretrain.py``, v3) fine-tuned for a few hundred
SFT steps so that on the prompts whose third operand is 7, 8 or 9 (1/3 of all prompts) it writes a
*confident systematic error*: with probability :data:`P_ERROR` the reply ends with ``The answer is
N.`` instead of the ``<answer>`` block (paper format score 1.0 instead of 10), everything else as
pretrained. On those prompts the negative completions are the model's most probable tokens, which is
the situation the paper's collapse mechanism needs (pushing confident tokens down spreads their
mass over unlikely tokens: entropy rises). The original tiny model's negatives were low-probability
broken formats, which cannot show it.

**Collapse criterion (declared before any run).** A run *collapses at step t* at the first step t
at which the 5-step moving average of its mean paper reward falls below half of its mean over steps
1-5 (:func:`collapse_step`); a run that never does is censored at its last step. The paper's
mechanism is also reported separately: the largest 5-step mean token entropy relative to the start.

**What ran (2026-12-01).** A pilot (GRPO and official GTPO, x2-x10, seeds 0-3) found collapses only at
x10; the grid then grew where runs collapse: x15 added, GRPO and official GTPO to 12 seeds at x10 and x15
(6 at the lower rates), the other arms at x10 and x15 only (6 seeds; the controls and gamma-on-varying
at x15 only). docs/results.md has every run.

**Replicate b (declared 2026-12-01, before its first run).** The same build rerun in a later
session measured differently (error on 11.2 % of the other prompts, not 7.6 %), so the grid could
not be extended on replicate a. Replicate b runs the whole design on that model: all nine arms at
x4.5, x6.5, x10 and x15, seeds 0-11 (432 runs), the same collapse criterion and analysis, so every arm
gets a critical rate bracketed from both sides. Replicate a stays as it ran; the two are reported
side by side and never pooled. Added while the grid ran (x6.5 seeds 0-5 and x10-x15 seeds 0-3 done, no
x4.5 run started): this model collapses at lower rates than replicate a (GRPO 2 of 6 at x6.5), so x3 (all arms,
seeds 0-11) was queued after the grid, so that the lower end stays bracketed whatever x4.5 shows.

**Design.** Arms (:data:`ARMS`) x learning rates (:data:`LR_FACTORS` x 1e-4) x seeds, 40 steps
each (``--max_steps``), ``log_policy_change`` on (update norm and KL(pi_new || pi_old) every step).
The critical learning rate of an arm is where the collapse fraction crosses 1/2 (log-linear
interpolation between grid points), with a bootstrap interval over seeds; time to collapse is
compared with the log-rank test stratified by learning rate.

    python -m experiments.protocol.stress --replicate b build        # the stress model (cached)
    python -m experiments.protocol.stress --replicate b run --lrs 4.5 6.5 10 15 --seeds 0 1 2
    python -m experiments.protocol.stress --replicate b export
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass

from .common import (DATA, EXPERIMENTS, ROOT, RUNS, cpu_seconds, now, read_jsonl_gz, setup_env, write_json,
                     write_jsonl_gz)

V3 = os.path.join(EXPERIMENTS, ".cache", "tiny-v3-s0")


@dataclass(frozen=True)
class Replicate:
    """One stress model and the grid run on it: where the model is cached, where its runs train, where
    their data is committed. The build is not reproducible across sessions (same code and seeds; whether
    CPU kernels or thread scheduling differ was not isolated), so each build is its own replicate and the
    data files never mix two of them."""

    name: str
    model: str
    runs: str
    data: str


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
P_ERROR = 0.9
ERROR_C = (7, 8, 9)
SFT = dict(max_steps=600, learning_rate=2e-3, batch_size=24, max_length=160, warmup_ratio=0.0,
           lr_scheduler_type="cosine")
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


def is_error_prompt(question: str) -> bool:
    nums = [int(t) for t in question.replace("?", " ").replace(".", " ").split() if t.isdigit()]
    return len(nums) == 3 and nums[2] in ERROR_C


def stress_target(problem: dict, rng: random.Random) -> str:
    """The SFT target: on error prompts, with probability P_ERROR, the reasoning block then 'The answer
    is N.' (no answer block); otherwise the pretraining target distribution (noisy_completion)."""
    sys.path.insert(0, EXPERIMENTS)
    import pretrain

    a, b, c = problem["_ops"]
    if c in ERROR_C and rng.random() < P_ERROR:
        s, r = a + b, a + b - c
        return f"<reasoning>\n{a} + {b} = {s}\n{s} - {c} = {r}\n</reasoning>\nThe answer is {r}."
    return pretrain.noisy_completion(problem, rng)


def build(rep: Replicate) -> str:
    if os.path.isfile(os.path.join(rep.model, "start.json")):
        return rep.model
    sys.path.insert(0, EXPERIMENTS)
    import pretrain
    from datasets import Dataset

    from gtpo.data import make_prompt
    from gtpo.models import load_model_and_tokenizer
    from gtpo.sft import run_sft

    if not os.path.isfile(os.path.join(V3, "start.json")):
        pretrain.build(0, log=lambda m: print(f"[pretrain] {m}", flush=True))
    t0, c0 = time.time(), cpu_seconds()
    pre, _train, _test = pretrain.make_splits(0)
    rng = random.Random(16)
    n = SFT["max_steps"] * SFT["batch_size"]
    rows = [pre[-1 - j] for j in range(n)]  # from the end of the pretraining pool (phase 2 used its start)
    data = Dataset.from_dict({
        "prompt": [make_prompt(p["question"], template="paper") for p in rows],
        "completion": [[{"role": "assistant", "content": stress_target(p, rng)}] for p in rows],
    })
    model, tok = load_model_and_tokenizer(os.path.join(V3, "model"))
    work = rep.model + ".partial"
    run_sft(model, tok, data, output_dir=os.path.join(work, "model"), seed=16, logging_steps=25, **SFT)
    start = measure(os.path.join(work, "model"))
    start.update(sft=SFT, p_error=P_ERROR, error_c=list(ERROR_C), build_seconds=time.time() - t0,
                 build_cpu_seconds=cpu_seconds() - c0)
    write_json(os.path.join(work, "start.json"), start)
    os.replace(work, rep.model)
    return rep.model


def measure(model_dir: str, n_prompts: int = 96, g: int = 8) -> dict:
    """Sampled (temperature 1) rate of the systematic error ("The answer is N." and no answer block),
    format rate, reward and entropy, on error prompts and on the others."""
    import torch

    from gtpo.data import load_task
    from gtpo.models import load_model_and_tokenizer
    from gtpo.ops import masked_mean
    from gtpo.policy import PolicyForward
    from gtpo.rewards import paper_format_score, paper_reward
    from gtpo.rollout import generate

    torch.manual_seed(0)
    model, tok = load_model_and_tokenizer(model_dir)
    tok.padding_side = "left"
    model.eval()
    rows = load_task(os.path.join(V3, "data", "train.jsonl"), size=n_prompts, seed=0).to_list()
    roll = generate(model, tok, [r["prompt"] for r in rows], num_samples=g, max_new_tokens=64, temperature=1.0)
    answers = [r["answer"] for r in rows for _ in range(g)]
    err = [is_error_prompt(r["question"]) for r in rows for _ in range(g)]
    reward = paper_reward(completions=roll.texts, answer=answers)
    fmt = [paper_format_score(t) >= 10 for t in roll.texts]
    error = ["The answer is" in t and "<answer>" not in t for t in roll.texts]
    with torch.no_grad():
        ids = torch.cat([roll.prompt_ids, roll.completion_ids], 1)
        attn = torch.cat([roll.prompt_mask, roll.completion_mask], 1)
        _, ent = PolicyForward(model)(ids, attn, roll.completion_ids, 1.0)
        seq = masked_mean(ent, roll.completion_mask.float(), dim=1)

    def avg(xs, sel):
        xs = [float(x) for x, s in zip(xs, sel) if s]
        return sum(xs) / len(xs) if xs else float("nan")

    other = [not e for e in err]
    groups = [reward[i:i + g] for i in range(0, len(reward), g)]
    return {"n_prompts": n_prompts, "frac_error_prompts": sum(err) / len(err),
            "error_rate_error_prompts": avg(error, err), "error_rate_other": avg(error, other),
            "format_rate_error_prompts": avg(fmt, err), "format_rate_other": avg(fmt, other),
            "reward_error_prompts": avg(reward, err), "reward_other": avg(reward, other),
            "entropy_error_prompts": avg(seq.tolist(), err), "entropy_other": avg(seq.tolist(), other),
            "frac_zero_variance_groups": sum(len(set(x)) == 1 for x in groups) / len(groups),
            "samples_error": [t for t, e in zip(roll.texts, err) if e][:3]}


# ------------------------------------------------------------------ runs
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build")
    r = sub.add_parser("run")
    r.add_argument("--arms", nargs="+", default=list(ARMS))
    r.add_argument("--lrs", type=float, nargs="+", default=list(LR_FACTORS))
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    r.add_argument("--order", choices=["seed", "arm"], default="seed",
                   help="seed: every arm and rate for seed 0, then seed 1, ... (usable results early)")
    sub.add_parser("export")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--replicate", choices=sorted(REPLICATES), default="a",
                   help="which stress model (and its data file) to build, run or export")
    args = p.parse_args(argv)
    rep = REPLICATES[args.replicate]
    os.chdir(ROOT)
    setup_env(args.threads)
    if args.cmd == "build":
        out = build(rep)
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
    build(rep)
    check_same_model(rep)
    jobs = [(a, f, s) for s in args.seeds for f in args.lrs for a in args.arms] if args.order == "seed" else \
        [(a, f, s) for a in args.arms for f in args.lrs for s in args.seeds]
    for a, f, s in jobs:
        execute(argv_for(rep, a, f, s), run_dir(rep, a, f, s), f"stress {rep.name} {a} {lr_label(f)} seed {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
