"""Train a tiny model for a few steps; run under `accelerate launch` (1 or 2 CPU processes).

Usage: accelerate launch --cpu --num_processes N ddp_train.py MODEL_DIR OUTPUT_DIR
Writes the final weights (main process) and each process's first-step rows to OUTPUT_DIR.
"""

import json
import os
import sys

import torch

from gtpo import GTPOConfig, GTPOTrainer


def digit_reward(completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    rows = [{"prompt": f"What is {a} + {b}?"} for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 1), (2, 2)]]
    cfg = GTPOConfig(output_dir=out, group_size=4, prompts_per_step=2, max_steps=3, max_completion_length=6,
                     learning_rate=1e-2, save_steps=2, disable_tqdm=True, seed=0, entropy_filter=False,
                     lr_scheduler_type="constant", log_completions_steps=0)
    trainer = GTPOTrainer(model_dir, digit_reward, rows, args=cfg)
    trainer.train()
    rank = trainer.accelerator.process_index
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump({"rows": trainer.last_batch.rows, "world": trainer.accelerator.num_processes}, fh)
    weights = {n: p.detach().clone() for n, p in trainer.unwrapped_model.named_parameters()}
    torch.save(weights, os.path.join(out, f"weights{rank}.pt"))


if __name__ == "__main__":
    main()
