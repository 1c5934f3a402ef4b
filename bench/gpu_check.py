"""The project's one short GPU check: our trainer in bf16 (and QLoRA) and GTPO on TRL's engine, on CUDA.

Run it whenever a GPU is at hand (about 2-4 minutes on one H100/H200; nothing is downloaded: the
models are random Llamas built here) and record what it prints in docs/performance.md with the
date and the GPU::

    python bench/gpu_check.py                 # on a CUDA machine
    python bench/gpu_check.py --cpu --quick   # smoke run of the same code on CPU (tests/test_bench.py)

For each variant it runs ``--warmup`` + ``--steps`` optimisation steps of ``P`` prompts x ``G``
completions of exactly ``T`` tokens (the bench model's generation config forces the length, as in
bench/common.py) and prints the median step time, sampled tokens per second (P*G*T / step time)
and the peak GPU memory of a step (``torch.cuda.max_memory_allocated``):

* ``gtpo bf16``: ``GTPOTrainer``, GTPO loss, full fine-tuning, weights loaded in bfloat16
  (``model_init_kwargs.dtype``), sampling with gtpo's decoding loop;
* ``gtpo bf16 + LoRA``: the same with a LoRA adapter (r=16, all linear layers);
* ``gtpo QLoRA 4-bit``: a 4-bit NF4 base (bitsandbytes) with the LoRA adapter (skipped without
  bitsandbytes);
* ``trl engine bf16``: ``gtpo.integrations.trl.TRLGTPOTrainer`` (TRL's ``GRPOTrainer`` with GTPO's
  loss), bf16 (skipped without trl or the integration).

A JSON line with every number is printed last (and written to ``$OUT/gpu_check.json`` when the
environment variable ``OUT`` names a directory, as on the project's lent GPU machines).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def _variants(args) -> list[dict]:
    lora = {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}
    quant = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": "bfloat16",
             "bnb_4bit_use_double_quant": True}
    return [
        {"name": "gtpo bf16", "engine": "gtpo", "lora": None, "model_init_kwargs": {"dtype": "bfloat16"}},
        {"name": "gtpo bf16 + LoRA", "engine": "gtpo", "lora": lora, "model_init_kwargs": {"dtype": "bfloat16"}},
        {"name": "gtpo QLoRA 4-bit", "engine": "gtpo", "lora": lora,
         "model_init_kwargs": {"dtype": "bfloat16", "quantization_config": quant}},
        {"name": "trl engine bf16", "engine": "trl", "lora": None, "model_init_kwargs": {"dtype": "bfloat16"}},
    ]


def _skip_reason(variant: dict) -> str | None:
    import importlib.util

    if "quantization_config" in variant["model_init_kwargs"] and importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed"
    if variant["engine"] == "trl":
        if importlib.util.find_spec("trl") is None:
            return "trl is not installed"
        try:
            import gtpo.integrations.trl  # noqa: F401
        except ImportError as err:
            return f"gtpo.integrations.trl is not available ({err})"
    return None


def _run_variant(path: str, variant: dict, spec: dict, out_dir: str, device: str) -> dict:
    import torch

    cuda = device == "cuda"
    rows = common.dataset_rows(spec)
    if variant["engine"] == "gtpo":
        from peft import LoraConfig

        from gtpo import GTPOConfig, GTPOTrainer

        cfg = GTPOConfig(
            output_dir=out_dir, overwrite_output_dir=True, group_size=spec["G"], prompts_per_step=spec["P"],
            max_steps=10**6, max_completion_length=spec["length"], learning_rate=1e-5, lr_scheduler_type="constant",
            save_steps=0, log_completions_steps=0, disable_tqdm=True, seed=0, entropy_threshold=100.0,
            model_init_kwargs=variant["model_init_kwargs"],
        )
        peft = None if variant["lora"] is None else LoraConfig(task_type="CAUSAL_LM", **variant["lora"])
        trainer = GTPOTrainer(path, common.bench_reward, rows, args=cfg, peft_config=peft)
        step = trainer.step
    else:
        from gtpo.integrations.trl import TRLGTPOConfig, TRLGTPOTrainer

        # TRL's batch for P prompts x G completions per step (bench/common.py), GTPO's loss, bf16 weights
        trainer = common.trl_trainer(
            path, spec, out_dir, spec["warmup"] + spec["steps"], config_cls=TRLGTPOConfig, trainer_cls=TRLGTPOTrainer,
            loss_type="gtpo", scale_rewards="none", use_cpu=not cuda, bf16=cuda, entropy_threshold=100.0,
            model_init_kwargs={"dtype": "bfloat16"},
        )
        times: list[float] = []
        from transformers import TrainerCallback

        class Timer(TrainerCallback):
            def on_step_begin(self, *a, **k):
                if cuda:
                    torch.cuda.synchronize()
                    if len(times) == spec["warmup"]:
                        torch.cuda.reset_peak_memory_stats()
                self.t0 = time.perf_counter()

            def on_step_end(self, *a, **k):
                if cuda:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - self.t0)

        trainer.add_callback(Timer())
        trainer.train()
        measured = times[spec["warmup"]:]
        peak = torch.cuda.max_memory_allocated() if cuda else 0
        return {"step_s": common.median(measured), "peak_bytes": peak, "steps": len(measured)}
    measured = []
    for i in range(spec["warmup"] + spec["steps"]):
        if cuda:
            torch.cuda.synchronize()
            if i == spec["warmup"]:
                torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        if i >= spec["warmup"]:
            measured.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    return {"step_s": common.median(measured), "peak_bytes": peak, "steps": len(measured)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on CPU (a smoke test of this script)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and 1 + 1 steps (smoke test)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args(argv)

    import torch

    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine (or --cpu for a smoke run)")
        return 2
    if args.quick:
        args.steps, args.warmup, args.prompts, args.group, args.length = 1, 1, 2, 4, 8
        args.hidden, args.layers, args.vocab = 64, 2, 512
    spec = {"P": args.prompts, "G": args.group, "length": args.length, "steps": args.steps, "warmup": args.warmup,
            "hidden": args.hidden, "layers": args.layers, "vocab": args.vocab, "threads": os.cpu_count() or 1}
    work = common.scratch_dir()
    path = common.build_bench_model(os.path.join(work, "model"), hidden_size=args.hidden, num_layers=args.layers,
                                    num_heads=max(4, args.hidden // 128), vocab_size=args.vocab,
                                    completion_length=args.length)
    where = torch.cuda.get_device_name(0) if device == "cuda" else common.machine()
    print(f"gpu_check on {where}; torch {torch.__version__}; model: Llama {common.n_params(path) / 1e6:.1f} M "
          f"parameters (hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}); P={args.prompts} x "
          f"G={args.group} x T={args.length}; {args.warmup} warm-up + {args.steps} measured steps")
    results = {}
    rows = []
    for variant in _variants(args):
        reason = _skip_reason(variant)
        if reason:
            results[variant["name"]] = {"skipped": reason}
            rows.append([variant["name"], "skipped: " + reason, "", ""])
            continue
        res = _run_variant(path, variant, spec, os.path.join(work, variant["name"].replace(" ", "_")), device)
        tokens = args.prompts * args.group * args.length
        res["tokens_per_s"] = tokens / res["step_s"]
        results[variant["name"]] = res
        rows.append([variant["name"], f"{res['step_s']:.3f}", f"{res['tokens_per_s']:.0f}",
                     f"{res['peak_bytes'] / 2**30:.2f}" if device == "cuda" else "-"])
        if device == "cuda":
            torch.cuda.empty_cache()
    print(common.table(["variant", "median step s", "sampled tokens/s", "peak GiB"], rows))
    line = json.dumps({"device": where, "spec": spec, "results": results})
    print(line)
    out = os.environ.get("OUT")
    if out and os.path.isdir(out):
        with open(os.path.join(out, "gpu_check.json"), "w") as fh:
            fh.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
