"""The start models of the claims, built from the tiny model (``experiments/pretrain.py``, v3) and cached under
``experiments/.cache/`` (git-ignored); a model built twice is not always the same model, so each data file keeps
its model's start record.

* **Claim 7's start model** (:func:`build_claim7`): the tiny model pretrained further in chunks of
  :data:`CHUNK_STEPS` steps until validation pass@1 nears :data:`TARGET_PASS1` (room to sharpen and to lose
  diversity), with its held-out and validation splits (:func:`make_splits`).
* **The stress model** of claim 2 (:func:`build_stress`, one per :class:`Replicate`): the tiny model fine-tuned to
  write a confident systematic error (``The answer is N.``) on the prompts whose third operand is 7-9
  (:func:`is_error_prompt`), measured by :func:`measure`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass

from .common import EXPERIMENTS, ROOT, cpu_seconds, write_json

V3 = os.path.join(EXPERIMENTS, ".cache", "tiny-v3-s0")  # the tiny model (experiments/pretrain.py, seed 0)


# ------------------------------------------------------------------ claim 7's start model and its splits
START = os.path.join(EXPERIMENTS, ".cache", "tiny-v3-s0-claim7")
N_HELDOUT = 500
N_VAL = 200
#: the continued pretraining: chunks of CHUNK_STEPS steps at a constant rate, stop at TARGET_PASS1
CLAIM7_SFT = dict(learning_rate=1e-3, batch_size=24, max_length=160, warmup_ratio=0.0, lr_scheduler_type="constant")
CHUNK_STEPS = 250
MAX_CHUNKS = 12
TARGET_PASS1 = 0.25
#: the sampled evaluation of claim 7 (validation and held-out): 8 samples at temperature 1, answers from the tag
EVAL = dict(n=8, k=[1, 8], maj_k=[8], temperature=1.0, max_new_tokens=64, answer_from="tag", batch_size=256)


def _ops_key(p: dict) -> tuple:
    return tuple(p["_ops"])


def make_splits() -> tuple[list[dict], list[dict], set]:
    """(heldout, validation, excluded operand triples): see ``designs/claim7-first.md`` (**Splits**)."""
    sys.path.insert(0, EXPERIMENTS)
    import pretrain

    pre, train, test = pretrain.make_splits(0)
    seen_pre = {_ops_key(p) for p in pre}
    in_train = {_ops_key(p) for p in train}
    rng = random.Random(7)
    every = [(a, b, c) for a in range(10, 100) for b in range(1, 10) for c in range(1, 10)]
    rng.shuffle(every)
    taken = {_ops_key(p) for p in test}
    never = [t for t in every if t not in seen_pre and t not in in_train and t not in taken]
    once = [t for t in every if t in seen_pre and t not in in_train and t not in taken]

    def problem(t):
        a, b, c = t
        q = random.Random(a * 100 + b * 10 + c).choice(pretrain.QUESTION_TEMPLATES).format(e=f"{a} + {b} - {c}")
        return {"question": q, "answer": str(a + b - c), "solution": f"{a} + {b} = {a + b}\n{a + b} - {c} = {a + b - c}",
                "_ops": t}

    heldout = [dict(p, origin="test") for p in test]
    for t in never[:N_HELDOUT - len(heldout)]:
        heldout.append(dict(problem(t), origin="never_seen"))
    rest = once
    k = N_HELDOUT - len(heldout)
    for t in rest[:k]:
        heldout.append(dict(problem(t), origin="pretrain_pool"))
    val = [dict(problem(t), origin="pretrain_pool") for t in rest[k:k + N_VAL]]
    excluded = {_ops_key(p) for p in heldout} | {_ops_key(p) for p in val}
    return heldout, val, excluded


def _write_rows(path: str, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({k: (list(v) if k == "_ops" else v) for k, v in r.items()}) + "\n")


def eval_model(model_dir: str, data_path: str, *, seed: int = 0, size: int | None = None) -> dict:
    from gtpo.evaluation import evaluate

    t0, c0 = time.time(), cpu_seconds()
    res = evaluate(model_dir, dataset=os.path.relpath(data_path, ROOT), seed=seed, size=size, **EVAL)
    res["timing"] = {"wall_s": time.time() - t0, "cpu_s": cpu_seconds() - c0}
    return res


def build_claim7(log=print) -> str:
    """The claim-7 start model (``designs/claim7-first.md``, **The start model**); cached under :data:`START`."""
    if os.path.isfile(os.path.join(START, "start.json")):
        return START
    sys.path.insert(0, EXPERIMENTS)
    import pretrain
    from datasets import Dataset

    from gtpo.data import make_prompt
    from gtpo.run.models import load_model_and_tokenizer
    from gtpo.sft import run_sft

    if not os.path.isfile(os.path.join(V3, "start.json")):
        pretrain.build(0, log=log)
    t0, c0 = time.time(), cpu_seconds()
    work = START + ".partial"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "data"))
    heldout, val, excluded = make_splits()
    _write_rows(os.path.join(work, "data", "heldout.jsonl"), heldout)
    _write_rows(os.path.join(work, "data", "validation.jsonl"), val)
    rng = random.Random(17)
    base = os.path.join(V3, "model")
    model, tok = load_model_and_tokenizer(base)
    chunks = []
    cur = base
    for i in range(MAX_CHUNKS):
        rows = []
        while len(rows) < CHUNK_STEPS * CLAIM7_SFT["batch_size"]:
            p = pretrain.make_problem(rng)
            if _ops_key(p) not in excluded:
                rows.append(p)
        data = Dataset.from_dict({
            "prompt": [make_prompt(p["question"], template="paper") for p in rows],
            "completion": [[{"role": "assistant", "content": pretrain.noisy_completion(p, rng)}] for p in rows],
        })
        out = os.path.join(work, f"chunk{i + 1}")
        run_sft(model, tok, data, output_dir=out, seed=17 + i, logging_steps=50, max_steps=CHUNK_STEPS, **CLAIM7_SFT)
        ev = eval_model(out, os.path.join(work, "data", "validation.jsonl"))
        m = ev["metrics"]
        chunks.append({"chunk": i + 1, "sft_steps": (i + 1) * CHUNK_STEPS, "validation": m})
        log(f"[claim7] chunk {i + 1} ({(i + 1) * CHUNK_STEPS} steps): validation pass@1 {m['pass@1']:.3f} "
            f"pass@8 {m['pass@8']:.3f} format {m.get('format_rate', float('nan')):.3f}")
        prev, cur = cur, out
        if m["pass@1"] >= TARGET_PASS1:
            # the chunk whose validation pass@1 is closest to the target: this one or the one before
            if len(chunks) > 1 and abs(chunks[-2]["validation"]["pass@1"] - TARGET_PASS1) < m["pass@1"] - TARGET_PASS1:
                shutil.rmtree(cur)
                cur = prev
                chunks[-1]["kept"] = False
            elif prev != base:
                shutil.rmtree(prev)
            break
        if prev != base:
            shutil.rmtree(prev)
        model, tok = load_model_and_tokenizer(out)
    os.replace(cur, os.path.join(work, "model"))
    kept = next(c for c in reversed(chunks) if c.get("kept", True))
    start = {"chunks": chunks, "kept_chunk": kept["chunk"], "kept_validation": kept["validation"], "sft": CLAIM7_SFT, "chunk_steps": CHUNK_STEPS, "target_pass1": TARGET_PASS1,
             "heldout_origin": {o: sum(p["origin"] == o for p in heldout) for o in ("test", "never_seen", "pretrain_pool")},
             "build_seconds": time.time() - t0, "build_cpu_seconds": cpu_seconds() - c0}
    ev = eval_model(os.path.join(work, "model"), os.path.join(work, "data", "heldout.jsonl"))
    start["heldout"] = ev["metrics"]
    start["heldout_per_problem"] = per_problem(ev)
    write_json(os.path.join(work, "start.json"), start)
    os.replace(work, START)
    return START


def per_problem(ev: dict) -> list[float]:
    """Per-problem fraction of correct samples (pass@1 per problem), in the split's order."""
    out = []
    for p in ev.get("problems", []):
        s = [bool(x["correct"]) for x in p["samples"]]
        out.append(round(sum(s) / len(s), 4))
    return out


# ------------------------------------------------------------------ the stress model (claim 2)
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


#: on the error prompts (third operand in ERROR_C) the SFT target is the systematic error with probability P_ERROR
P_ERROR = 0.9
ERROR_C = (7, 8, 9)
STRESS_SFT = dict(max_steps=600, learning_rate=2e-3, batch_size=24, max_length=160, warmup_ratio=0.0,
                  lr_scheduler_type="cosine")


def is_error_prompt(question: str) -> bool:
    nums = [int(t) for t in question.replace("?", " ").replace(".", " ").split() if t.isdigit()]
    return len(nums) == 3 and nums[2] in ERROR_C


def stress_target(problem: dict, rng: random.Random) -> str:
    """The stress model's SFT target: on error prompts, with probability P_ERROR, the reasoning block then 'The answer
    is N.' (no answer block); otherwise the pretraining target distribution (noisy_completion)."""
    sys.path.insert(0, EXPERIMENTS)
    import pretrain

    a, b, c = problem["_ops"]
    if c in ERROR_C and rng.random() < P_ERROR:
        s, r = a + b, a + b - c
        return f"<reasoning>\n{a} + {b} = {s}\n{s} - {c} = {r}\n</reasoning>\nThe answer is {r}."
    return pretrain.noisy_completion(problem, rng)


def build_stress(rep: Replicate) -> str:
    """The stress model of ``rep`` (see the module docstring), its start record measured by :func:`measure`; cached
    under ``rep.model``."""
    if os.path.isfile(os.path.join(rep.model, "start.json")):
        return rep.model
    sys.path.insert(0, EXPERIMENTS)
    import pretrain
    from datasets import Dataset

    from gtpo.data import make_prompt
    from gtpo.run.models import load_model_and_tokenizer
    from gtpo.sft import run_sft

    if not os.path.isfile(os.path.join(V3, "start.json")):
        pretrain.build(0, log=lambda m: print(f"[pretrain] {m}", flush=True))
    t0, c0 = time.time(), cpu_seconds()
    pre, _train, _test = pretrain.make_splits(0)
    rng = random.Random(16)
    n = STRESS_SFT["max_steps"] * STRESS_SFT["batch_size"]
    rows = [pre[-1 - j] for j in range(n)]  # from the end of the pretraining pool (phase 2 used its start)
    data = Dataset.from_dict({
        "prompt": [make_prompt(p["question"], template="paper") for p in rows],
        "completion": [[{"role": "assistant", "content": stress_target(p, rng)}] for p in rows],
    })
    model, tok = load_model_and_tokenizer(os.path.join(V3, "model"))
    work = rep.model + ".partial"
    run_sft(model, tok, data, output_dir=os.path.join(work, "model"), seed=16, logging_steps=25, **STRESS_SFT)
    start = measure(os.path.join(work, "model"))
    start.update(sft=STRESS_SFT, p_error=P_ERROR, error_c=list(ERROR_C), build_seconds=time.time() - t0,
                 build_cpu_seconds=cpu_seconds() - c0)
    write_json(os.path.join(work, "start.json"), start)
    os.replace(work, rep.model)
    return rep.model


def measure(model_dir: str, n_prompts: int = 96, g: int = 8) -> dict:
    """Sampled (temperature 1) rate of the systematic error ("The answer is N." and no answer block),
    format rate, reward and entropy, on error prompts and on the others."""
    import torch

    from gtpo.data import load_task
    from gtpo.run.models import load_model_and_tokenizer
    from gtpo.maths.ops import masked_mean
    from gtpo.sampling.policy import PolicyForward
    from gtpo.rewards import paper_format_score, paper_reward
    from gtpo.sampling.rollout import generate

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
