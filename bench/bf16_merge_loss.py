"""Measurement: the share of a LoRA update that merging into bfloat16 weights drops (issue 42, defect 5).

vLLM receives a bf16 LoRA policy as merged bf16 weights (``gtpo.sampling.vllm_engine.dense_weights``):
``round_bf16(W + scale * B @ A)``. An entry of the delta below half of bf16's spacing at ``W``
(2^-8 |W| up to a factor 2) rounds back to ``W``: the sampler does not see it. This script counts,
with gtpo's own merge (``gtpo.sampling.lora_merge.lora_merged_weight`` and ``MergeRounding``), the
share of non-zero delta entries (and of the delta's norm) lost, on SmolLM2-135M-Instruct in bfloat16.

The adapter (an assumption, stated in the output): peft's default initialization (A Kaiming-uniform,
B = 0) and then B after ``k`` AdamW steps at learning rate ``lr``: Adam's first steps move each
element by about ``lr`` (its update is ~ sign(gradient) early on), so B's entries are ``+-k * lr``
with random signs (an upper bound on their size for steps whose signs do not all agree). The paper
configs' adapter: r = 128, lora_alpha = 128, all linear layers (configs/paper/*.yaml).

Usage: ``python bench/bf16_merge_loss.py [--rank 128] [--alpha 128] [--lrs 1e-5 1e-6] [--steps 1 10 100]``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, default=128)
    parser.add_argument("--alpha", type=float, default=128)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-5, 1e-6])
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer
    from transformers import AutoModelForCausalLM

    from gtpo.sampling.lora_merge import MergeRounding, lora_merged_weight

    torch.manual_seed(args.seed)
    base = AutoModelForCausalLM.from_pretrained(common.smollm2_model(), dtype=torch.bfloat16)
    model = get_peft_model(base, LoraConfig(r=args.rank, lora_alpha=args.alpha, target_modules="all-linear"))
    layers = [m for m in model.modules() if isinstance(m, LoraLayer) and "default" in getattr(m, "lora_B", {})]
    signs = {id(m): torch.randint(0, 2, m.lora_B["default"].weight.shape).float() * 2 - 1 for m in layers}
    print(f"SmolLM2-135M-Instruct, bf16 base, LoRA r={args.rank} alpha={args.alpha} on {len(layers)} layers; "
          f"assumption: B = +-(steps * lr), A peft's Kaiming init")
    print("| lr | steps | median abs(delta) | entries lost | delta norm lost |")
    print("|---|---|---|---|---|")
    with torch.no_grad():
        for lr in args.lrs:
            for k in args.steps:
                rounding = MergeRounding("bench")
                sample = []
                for m in layers:
                    b = m.lora_B["default"].weight
                    b.copy_(signs[id(m)] * (k * lr))
                    lora_merged_weight(m, rounding)
                    sample.append(m.get_delta_weight("default").abs().flatten()[:4096])
                median = float(torch.cat(sample).median())
                print(f"| {lr:g} | {k} | {median:.2e} | {100 * rounding.lost_fraction:.1f} % | "
                      f"{100 * rounding.lost_norm_fraction:.1f} % |")


if __name__ == "__main__":
    main()
