"""Claim 1, the mechanism measured directly: paired one-step updates (issue 16, item 1).

From one saved state (weights + AdamW moments) and one sampled group, every arm takes exactly one
update through the trainer's own code (``GTPOTrainer.gtpo_inputs`` + ``GTPOTrainer.update``), the
state is restored between arms, and the change of the log-probabilities of the group's own tokens
is measured (``Δ = log π_new − log π_old`` on the sampled tokens):

* ``conflict_pos``: mean Δ over the conflict-run tokens (prefix or suffix run,
  :func:`gtpo.maths.conflict.conflict_runs`, from the unshaped signs) of the positive completions: the
  tokens claim 1 says GRPO pushes down and GTPO protects;
* ``prefix_pos``: the same on the prefix run only (the shared opening);
* ``seq_pos`` / ``seq_neg``: mean over positive / negative completions of Σ_t Δ (sequence
  log-likelihood change; a negative ``seq_pos`` is likelihood displacement);
* ``seq_best``: the same over completions with the group's highest reward (correct ones when any);
* ``common_prefix``: mean Δ over the positions where all G completions share the same token
  (computed for zero-variance groups too, where no completion is positive or negative);
* ``kl``: KL(π_new‖π_old) on the group's tokens (``r log r − r + 1``), ``update_norm``.

Two step rules per arm: ``adam`` — the trainer's real step (AdamW with the saved moments, the
config's learning rate and gradient clipping: equal learning rate); ``unit`` — a plain gradient step
of one parameter-space norm for every arm, a tenth of GRPO's ``adam`` step on the same group
(equal step size, first-order regime: only the direction of the gradient differs between arms).

Variants: ``natural`` (the sampled group); ``short_neg`` (each negative completion replaced by a
positive completion of the same group cut after a random number of tokens and ended with EOS, then
rescored: wrong completions are then a shared prefix plus EOS, shorter than the positives, so
GRPO's 1/|o| weighting pushes the shared prefix down by Σ_i A_i/|o_i| < 0).

    python -m experiments.protocol.claim1 tiny --state start|CHECKPOINT --groups 250 --variant natural
    python -m experiments.protocol.claim1 smol --max-tries 100 [--seed 1]   # seeds >0: more groups, own file

A checkpoint state is named by its ``--label`` (``grpo150`` for the checkpoint run's step 150). The
checkpoint run's directory is not committed; a rerun of it (``prepare``) in another session need not
give the same weights, so its measurements go under a new label (``--state grpo150 --label grpo150b``)
and are reported as another state, never appended to the first one's file.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import sys
import time

from .common import DATA, ROOT, RUNS, cpu_seconds, now, read_jsonl_gz, setup_env, write_jsonl_gz

ONESTEP_RUNS = os.path.join(RUNS, "onestep")
TINY_DIR = "experiments/.cache/tiny-v3-s0"

#: arms: a preset plus fields (temperatures are set equal for all arms by the caller)
ARMS: dict[str, dict] = {
    "grpo": {"preset": "grpo"},
    "dr_grpo": {"preset": "dr_grpo"},
    "grpo_masks": {"preset": "grpo", "conflict_masks": True, "gtpo_ablation": True},  # a baseline + GTPO's masks
    "gtpo_paper": {"preset": "paper"},
    "gtpo_official": {"preset": "official"},
}
MODES = ("adam", "unit")
#: the ``unit`` step's parameter-space norm as a fraction of GRPO's Adam step on the same group: small,
#: so that the change stays first-order (a plain gradient step of the Adam step's norm is concentrated
#: on few parameters and moves the sampled tokens' log-probs 4-5x more than the Adam step)
UNIT_FRACTION = 0.1


def arm_config(base, arm: str, *, temperature: float, logprob_temperature: float):
    from gtpo import GTPOConfig

    spec = dict(ARMS[arm])
    preset = spec.pop("preset")
    values = {**base.to_dict(), **GTPOConfig.preset_values(preset), **spec}
    # the base config's algorithm fields that the preset does not set must not leak (e.g. gamma)
    for key in ("gamma", "entropy_filter", "conflict_masks", "scale_rewards", "loss_aggregation", "gamma_groups",
                "completion_sign", "entropy_rule", "entropy_threshold", "dynamic_sampling"):
        if key not in GTPOConfig.preset_values(preset) and key not in spec:
            values[key] = GTPOConfig.__dataclass_fields__[key].default
    values.update(temperature=temperature, logprob_temperature=logprob_temperature, num_iterations=1,
                  log_policy_change=False, micro_batch_size=None)
    return GTPOConfig.from_dict(values)


class UnitStep:
    """Optimizer stand-in: one plain gradient step of parameter-space norm ``eta``."""

    def __init__(self, params, eta: float):
        self.params, self.eta = params, eta

    def step(self):
        import torch

        grads = [p.grad for p in self.params if p.grad is not None]
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
        if float(norm) == 0:
            return
        with torch.no_grad():
            for p in self.params:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-self.eta / float(norm))

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


def build_trainer(model_name: str):
    """A GTPOTrainer on the tiny model or on SmolLM2 (the default run's task), output under runs/."""
    import yaml

    from gtpo import GTPOTrainer
    from gtpo.app import build_peft_config, default_config_text, load_dataset_spec, split_spec
    from gtpo.run.models import load_model_and_tokenizer
    from gtpo.rewards import resolve_reward

    if model_name == "tiny":
        with open(os.path.join(ROOT, "experiments/configs/tiny.yaml")) as f:
            spec = yaml.safe_load(f)
        spec.pop("probes", None)
        spec.update(eval_dataset=None, reward_funcs=["paper"], reward_weights=None, eval_reward=None)
        temps = (1.0, 1.0)
        best = 20.0
    else:
        spec = yaml.safe_load(default_config_text())
        spec.update(eval_dataset=None, eval_before_after=False)
        temps = (0.7, 0.7)
        best = 1.0
    out = os.path.join(ONESTEP_RUNS, "_trainer", model_name)
    spec.update(output_dir=out, overwrite_output_dir=True, save_steps=0, log_completions_steps=0, disable_tqdm=True)
    run, config = split_spec(spec, source=model_name)
    ds = load_dataset_spec(run.dataset, default_split="train")
    model, tok = load_model_and_tokenizer(str(run.model))
    trainer = GTPOTrainer(model, [resolve_reward(r) for r in run.reward_funcs], ds, args=config,
                          processing_class=tok, peft_config=build_peft_config(run.peft))
    return trainer, config, temps, best


def _short_neg(trainer, batch, rng: random.Random):
    """The ``short_neg`` variant of a scored group: negatives -> cut positives + EOS, rescored."""
    import torch

    from gtpo.maths.advantages import group_advantages
    from gtpo.sampling.rollout import Rollout

    r = batch.rollout
    adv = group_advantages(batch.rewards, len(batch.rewards), scale="none")
    pos = [i for i in range(len(adv)) if adv[i] > 0]
    ids, mask = r.completion_ids.clone(), r.completion_mask.clone()
    eos = trainer.eos_ids[0]
    lengths = r.completion_mask.sum(1).tolist()
    for i in range(len(adv)):
        if adv[i] >= 0:
            continue
        j = rng.choice(pos)
        n_j = int(lengths[j]) - (0 if bool(r.truncated[j]) else 1)  # tokens before its EOS
        cut = rng.randint(1, max(1, n_j - 1))
        row = torch.full_like(ids[i], trainer.tokenizer.pad_token_id)
        row[:cut] = r.completion_ids[j, :cut]
        row[cut] = eos
        ids[i] = row
        mask[i] = 0
        mask[i, :cut + 1] = 1
    texts = [trainer.tokenizer.decode(ids[i][mask[i].bool()], skip_special_tokens=True) for i in range(len(adv))]
    truncated = r.truncated.clone()
    truncated[adv < 0] = False
    roll = Rollout(r.prompt_ids, r.prompt_mask, ids, mask, truncated, texts)
    return trainer.score(batch.rows, roll)


def measure(trainer, roll, mask, old_logp, rewards, adv_signs, prefix, suffix, best: float) -> dict:
    import torch

    with torch.no_grad():
        new_logp, _ = trainer.forward(roll, slice(None), mask)
    m = mask.bool()
    d = torch.where(m, new_logp - old_logp, torch.zeros_like(new_logp)).double()
    pos, neg = adv_signs > 0, adv_signs < 0
    conflict = (prefix | suffix) & m & pos[:, None]
    pre = prefix & m & pos[:, None]
    seq = d.sum(1)
    top = rewards >= rewards.max() - 1e-6
    ids = roll.completion_ids
    same = (ids == ids[0:1]) & m.all(0, keepdim=True).expand_as(m)
    common_len = int(same.all(0).long().cumprod(0).sum())
    log_r = d
    r_ = log_r.exp()
    kl = float(((r_ * log_r - r_ + 1) * m).sum() / m.sum())

    def mean_over(sel):
        return float(d[sel].mean()) if bool(sel.any()) else None

    return {
        "conflict_pos": mean_over(conflict), "n_conflict_pos": int(conflict.sum()),
        "prefix_pos": mean_over(pre), "n_prefix_pos": int(pre.sum()),
        "nonconflict_pos": mean_over(m & pos[:, None] & ~conflict),
        "seq_pos": float(seq[pos].mean()) if bool(pos.any()) else None,
        "seq_neg": float(seq[neg].mean()) if bool(neg.any()) else None,
        "seq_best": float(seq[top].mean()) if rewards.max() >= best - 1e-6 else None,
        "seq_all": float(seq.mean()),
        "common_prefix": float(d[:, :common_len][m[:, :common_len]].mean()) if common_len else None,
        "common_len": common_len, "kl": kl,
    }


def state_fingerprint(model, optimizer) -> str:
    """sha256 (first 16 hex digits) of every tensor of ``model`` (frozen ones included) and of
    ``optimizer``'s state: the measured state, byte for byte."""
    import hashlib

    import torch

    h = hashlib.sha256()

    def add(name: str, t) -> None:
        h.update(name.encode())
        if torch.is_tensor(t):
            h.update(str(t.dtype).encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(t).encode())

    for name, t in model.state_dict().items():
        add(name, t)
    for k, st in optimizer.state_dict()["state"].items():
        for name, t in sorted(st.items()):
            add(f"opt.{k}.{name}", t)
    return h.hexdigest()[:16]


def check_resume(done: list[dict], fingerprint: str, out_path: str) -> None:
    """Refuse to append groups measured from another state to ``out_path``. A checkpoint run redone
    in another session need not give the same weights; its groups then go under a new ``--label``.
    Records written before fingerprints were kept (no ``state_fingerprint`` key) cannot be checked."""
    seen = sorted({r["state_fingerprint"] for r in done if "state_fingerprint" in r})
    if seen and seen != [fingerprint]:
        raise SystemExit(
            f"onestep: {out_path} holds groups measured from state {', '.join(seen)}, but the state loaded now "
            f"is {fingerprint} (weights or optimizer moments differ). Measure it under a new --label "
            f"(another state, reported apart) instead of appending.")


def run(model_name: str, state: str, variant: str, n_groups: int, seed: int, out_path: str,
        max_tries: int | None = None) -> None:
    import torch

    from gtpo.maths.advantages import group_advantages
    from gtpo.maths.conflict import conflict_runs
    from gtpo.maths.losses import POLICY_LOSSES

    done = read_jsonl_gz(out_path) if os.path.isfile(out_path) else []
    trainer, base, (t_sample, t_lp), best = build_trainer(model_name)
    if state != "start":
        trainer.load_checkpoint(state)
    if model_name == "tiny":
        with open(os.path.join(ROOT, TINY_DIR, "start.json")) as f:
            trainer.initial_entropy = json.load(f)["entropy_completion_mean"]  # <H>_ini of the run's start
    sample_cfg = base.replace(temperature=t_sample, logprob_temperature=t_lp)
    configs = {a: arm_config(base, a, temperature=t_sample, logprob_temperature=t_lp) for a in ARMS}
    params = [p for p in trainer.policy.parameters() if p.requires_grad]
    saved_params = [p.detach().clone() for p in params]
    saved_opt = copy.deepcopy(trainer.optimizer.state_dict())
    real_opt = trainer.optimizer
    fingerprint = state_fingerprint(trainer.policy, real_opt)
    check_resume(done, fingerprint, out_path)
    g = base.group_size
    rng = random.Random(seed)
    records = list(done)
    varying = sum(1 for r in records if r["varying"])
    tries = len(records) and max(r["try"] for r in records) + 1
    for _ in range(tries):  # a resumed run continues the uninterrupted sequence of prompts
        rng.randrange(len(trainer.train_dataset))
    t0, c0 = time.time(), cpu_seconds()
    print(f"[onestep] {now()} {model_name} {state} {variant}: {varying} varying groups done", flush=True)
    while varying < n_groups and (max_tries is None or tries < max_tries):
        row = rng.randrange(len(trainer.train_dataset))
        cut_rng = random.Random(seed * 100003 + tries)
        torch.manual_seed(seed * 1000003 + tries)
        trainer.args = sample_cfg
        with torch.no_grad():
            roll = trainer.sample_rollout([row])
        batch = trainer.score([row], roll)
        if variant == "short_neg":
            if not batch.group_varies(0, g):
                tries += 1
                continue
            batch = _short_neg(trainer, batch, cut_rng)
        roll, rewards = batch.rollout, batch.rewards.float()
        is_varying = batch.group_varies(0, g)
        mask = roll.completion_mask.float()
        adv_none = group_advantages(rewards, g, scale="none")
        prefix, suffix = conflict_runs(roll.completion_ids, mask, adv_none, g)
        with torch.no_grad():
            old_logp, old_ent = trainer.forward(roll, slice(None), mask)
        rec = {"model": model_name, "state": state, "state_fingerprint": fingerprint, "variant": variant,
               "seed": seed, "try": tries, "row": row,
               "varying": is_varying, "rewards": rewards.tolist(), "lengths": roll.completion_mask.sum(1).tolist(),
               "entropy": float((old_ent * mask).sum() / mask.sum()), "arms": {}}
        grpo_norm = None
        for mode in MODES:
            for arm in ARMS:
                cfg = configs[arm]
                trainer.args, trainer.loss_fn = cfg, POLICY_LOSSES[cfg.loss_type]
                with torch.no_grad():
                    for p, b in zip(params, saved_params):
                        p.copy_(b)
                real_opt.load_state_dict(copy.deepcopy(saved_opt))
                if mode == "unit":
                    trainer.optimizer = UnitStep(params, UNIT_FRACTION * grpo_norm)
                adv = group_advantages(rewards, g, scale=cfg.resolved_scale_rewards)
                inputs = trainer.gtpo_inputs(roll, adv)
                result = trainer.update(roll, adv, inputs)
                trainer.optimizer = real_opt
                norm = float(torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(params, saved_params))))
                if mode == "adam" and arm == "grpo":
                    grpo_norm = norm
                res = measure(trainer, roll, mask, old_logp, rewards, adv_none, prefix, suffix, best)
                res.update(update_norm=norm, grad_norm=float(result.grad_norm),
                           filtered=float(result.metrics.get("gtpo/filtered_frac", torch.tensor(0.0)).item()) / len(rewards)
                           if "gtpo/filtered_frac" in result.metrics else 0.0)
                rec["arms"][f"{arm}/{mode}"] = res
                if mode == "unit" and not grpo_norm:
                    break
            if not grpo_norm:
                break  # GRPO did not move (zero-variance group): no unit step to match
        with torch.no_grad():
            for p, b in zip(params, saved_params):
                p.copy_(b)
        real_opt.load_state_dict(copy.deepcopy(saved_opt))
        records.append(rec)
        varying += int(is_varying)
        tries += 1
        write_jsonl_gz(out_path, records)  # every group: a kill loses at most the group in progress
        if tries % 10 == 0:
            el = time.time() - t0
            print(f"[onestep] {now()} {tries} groups ({varying} varying) {el / 60:.1f} min", flush=True)
    write_jsonl_gz(out_path, records)
    print(f"[onestep] {now()} done: {len(records)} groups, {varying} varying, cpu {cpu_seconds() - c0:.0f} s", flush=True)


#: the checkpoints of claim 1's tiny states: one GRPO run at the shared learning rate (1e-4), seed 0
CKPT_RUN = os.path.join(RUNS, "claim1_grpo_seed0")
CKPT_ARGV = ["experiments/configs/tiny.yaml", "--preset", "grpo", "--seed", "0", "--max_steps", "150",
             "--eval_steps", "0", "--save_steps", "50", "--save_total_limit", "10", "--log_completions_steps", "50"]


def prepare_checkpoints() -> None:
    from .tinyruns import execute

    execute(CKPT_ARGV, CKPT_RUN, "claim 1 GRPO checkpoint run")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", choices=["tiny", "smol", "prepare"])
    p.add_argument("--state", default="start", help="'start' or a checkpoint directory of a run")
    p.add_argument("--label", default=None, help="name of the state in the output file (default: from --state)")
    p.add_argument("--variant", default="natural", choices=["natural", "short_neg"])
    p.add_argument("--groups", type=int, default=250, help="groups with reward variance to measure")
    p.add_argument("--max-tries", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    os.chdir(ROOT)
    setup_env(args.threads)
    if args.model == "prepare":
        prepare_checkpoints()
        return 0
    if args.state.startswith("grpo") and args.state[4:].isdigit():  # grpo50 -> the run's checkpoint-50
        args.label = args.label or args.state
        args.state = os.path.join(CKPT_RUN, f"checkpoint-{args.state[4:]}")
    label = args.label or ("start" if args.state == "start" else os.path.basename(os.path.normpath(args.state)))
    # another seed is another, independent stream of groups in its own file (two processes can then share a
    # state's measurement); the report pools the files of one state and variant
    shard = "" if args.seed == 0 else f"-seed{args.seed}"
    out = os.path.join(DATA, "onestep", f"{args.model}-{label}-{args.variant}{shard}.jsonl.gz")
    run(args.model, args.state, args.variant, args.groups, args.seed, out, args.max_tries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
