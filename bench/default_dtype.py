"""Benchmark: the default run (``gtpo train`` without arguments) in float32 against bfloat16, steps
interleaved in one process.

Two trainers are built exactly as ``gtpo train --demo --dtype D`` builds them (``gtpo.app``: the
default run's SmolLM2-135M-Instruct with its LoRA, data, reward and settings, P=4 x G=8, up to 40
tokens at temperature 0.7; ``--dtype float32`` and ``--dtype bfloat16``: the sampling and training
forward in bfloat16 with the frozen base in bfloat16, the adapter, optimizer, log-probs and loss in
float32, docs/gpu.md), from the same seed; their steps alternate (ABBA) in one process, so the
machine's load hits both alike. The first ``--warmup`` steps of each are dropped.

The two policies sample different completions (other rounding), so their steps do not process the
same tokens: printed are the paired ratio bf16/fp32 of the step time (median over rounds), of the
step time per sampled token (the fair one), of the generation and update parts, and each side's
roofline (``common.print_roofline``: the FLOPs of its real rollout, each prompt once and each row
at its length, over the time of each part, as a fraction of the matmul peak of its own dtype,
measured before each step). No goal: the bf16 decision (issue 33) reads these ratios.

Usage: ``python bench/default_dtype.py [--steps 8] [--warmup 1] [--threads 2] [--seed 0]
[--max-completion-length 40] [--prompts 4] [--group 8]`` (the last three: the default run's unless given;
the test suite's quick run shrinks them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

DTYPES = ("float32", "bfloat16")


def default_trainer(dtype: str, output_dir: str, seed: int, max_completion_length: int | None = None,
                    prompts: int | None = None, group: int | None = None):
    """``GTPOTrainer`` of ``gtpo train --demo --dtype DTYPE --seed SEED`` (no evaluation, checkpoints or
    sample logs), built with the app layer's own pieces."""
    import torch

    from gtpo import GTPOTrainer
    from gtpo.app import build_peft_config, resolve_train_spec
    from gtpo.app.training import load_run_inputs
    from gtpo.run.models import load_model_and_tokenizer
    from gtpo.run.build import policy_load_kwargs, run_precision

    overrides = dict(dtype=dtype, seed=seed, output_dir=output_dir, overwrite_output_dir=True, save_steps=0,
                     **({} if max_completion_length is None else {"max_completion_length": max_completion_length}),
                     **({} if prompts is None else {"prompts_per_step": prompts}),
                     **({} if group is None else {"group_size": group}),
                     log_completions_steps=0, eval_before_after=False, max_steps=10**6)
    spec, source, options = resolve_train_spec(None, overrides, demo=True)
    inputs = load_run_inputs(spec, source=source, options=options)
    run, config = inputs.run, inputs.config
    cpu = torch.device("cpu")
    precision = run_precision(config, inputs.model, adapter=run.peft is not None, device=cpu)
    model, tokenizer = load_model_and_tokenizer(inputs.model, **policy_load_kwargs(config.model_init_kwargs, precision, cpu))
    trainer = GTPOTrainer(model, inputs.reward_funcs, inputs.train_dataset, args=config, processing_class=tokenizer,
                          peft_config=build_peft_config(run.peft), precision=precision)
    return trainer, int(run.peft["r"]) if run.peft else 0


def worker(spec: dict) -> dict:
    from gtpo.run.metric_names import canonical_record
    from gtpo.run.models import unwrap_peft

    common.set_threads(spec["threads"])
    tmp = common.scratch_dir()
    trainers = {d: default_trainer(d, os.path.join(tmp, d), spec["seed"], spec.get("max_completion_length"),
                                   spec.get("prompts"), spec.get("group"))
                for d in DTYPES}
    keys = ("step", "generation", "update", "tokens", "flops_rollout", "flops_update", "peak")
    out = {d: {k: [] for k in keys} for d in DTYPES}
    for r in range(spec["warmup"] + spec["steps"]):
        for d in (DTYPES if r % 2 == 0 else DTYPES[::-1]):
            trainer, rank = trainers[d]
            peak = common.matmul_peak(d)
            metrics = canonical_record(trainer.step())
            rollout = trainer.last_batch.rollout
            flops = common.rollout_flops(unwrap_peft(trainer.unwrapped_model).config, rollout,
                                         trainer.args.group_size, lora_rank=rank)
            row = out[d]
            row["step"].append(metrics["step_time"])
            row["generation"].append(metrics["gtpo/generation_time"])
            row["update"].append(metrics["gtpo/update_time"])
            row["tokens"].append(float(rollout.lengths.sum()))
            row["flops_rollout"].append(flops["rollout"])
            row["flops_update"].append(flops["update"])
            row["peak"].append(peak)
            common.progress(f"{d} step {r}: {metrics['step_time']:.1f} s, {row['tokens'][-1]:.0f} tokens")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="measured steps per dtype (after warm-up)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up steps per dtype (not measured)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-completion-length", type=int,
                        help="sampled tokens per completion (default: the default run's, 40)")
    parser.add_argument("--prompts", type=int, help="prompts per step (default: the default run's, 4)")
    parser.add_argument("--group", type=int, help="completions per prompt (default: the default run's, 8)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    print(common.machine())
    res = common.run_worker(__file__, dict(steps=args.steps, warmup=args.warmup, threads=args.threads,
                                           seed=args.seed, max_completion_length=args.max_completion_length,
                                           prompts=args.prompts, group=args.group),
                            timeout=8 * 3600, progress=True)
    w = args.warmup
    m = {d: {k: v[w:] for k, v in res[d].items()} for d in DTYPES}
    print(f"the default run (gtpo train --demo, seed {args.seed}) in float32 and bfloat16, {args.threads} threads, "
          f"{args.warmup} warm-up + {args.steps} measured steps each, interleaved")
    for d in DTYPES:
        print(f"  {d:8s} step times (s): " + " ".join(f"{x:.2f}" for x in res[d]["step"])
              + "; sampled tokens: " + " ".join(f"{x:.0f}" for x in res[d]["tokens"]))
    fp, bf = m["float32"], m["bfloat16"]

    def paired(key, per_token=False):
        a = [x / t if per_token else x for x, t in zip(bf[key], bf["tokens"])]
        b = [x / t if per_token else x for x, t in zip(fp[key], fp["tokens"])]
        return common.median(x / y for x, y in zip(a, b))

    rows = [[d, f"{common.median(m[d]['step']):.2f}", f"{common.median(m[d]['generation']):.2f}",
             f"{common.median(m[d]['update']):.2f}", f"{common.median(m[d]['tokens']):.0f}",
             f"{common.median(s / t * 1000 for s, t in zip(m[d]['step'], m[d]['tokens'])):.1f}"] for d in DTYPES]
    print(common.table(["dtype", "median step s", "generation s", "update s", "sampled tokens",
                        "step ms per sampled token"], rows))
    print(f"bfloat16 / float32 (median of paired ratios): step {paired('step'):.3f}, per sampled token "
          f"{paired('step', True):.3f}; generation {paired('generation'):.3f} (per token "
          f"{paired('generation', True):.3f}); update {paired('update'):.3f} (per token {paired('update', True):.3f})")
    for d in DTYPES:  # each dtype against its own peak; its FLOPs are those of its own rollouts
        flops = {"rollout": common.median(m[d]["flops_rollout"]), "update": common.median(m[d]["flops_update"]),
                 "head": 0.0}
        rates = {part: [f / x for f, x in zip(m[d][f"flops_{part}"], m[d][key])]
                 for part, key in (("rollout", "generation"), ("update", "update"))}
        fracs = {part: common.median(r / p for r, p in zip(v, m[d]["peak"])) for part, v in rates.items()}
        print(f"  {d}: rollout {common.median(rates['rollout']) / 1e9:.1f} GFLOP/s = {fracs['rollout']:.3f} of the "
              f"{d} matmul peak (median {common.median(m[d]['peak']) / 1e9:.1f} GFLOP/s); update "
              f"{common.median(rates['update']) / 1e9:.1f} GFLOP/s = {fracs['update']:.3f}; median GFLOP per step: "
              f"rollout {flops['rollout'] / 1e9:.0f}, update {flops['update'] / 1e9:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
