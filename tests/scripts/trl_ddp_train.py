"""Train a tiny model for 2 steps with TRLGTPOTrainer on a fixed group (4 completions of one prompt per step);
run as one process or under `accelerate launch --multi_gpu --num_processes 2` (CPU, gloo), where each process
holds 2 of the group's 4 completions (the conflict weights need the whole, gathered group).

Usage: trl_ddp_train.py MODEL_DIR OUTPUT_DIR. Writes (main process) result.json, initial.pt, weights.pt.
"""

import json
import os
import sys

import torch
from datasets import Dataset

from gtpo.integrations.trl import TRLGTPOConfig, TRLGTPOTrainer

G = 4
EOS = 2
PROMPT_IDS = {"p0": [30, 31, 32], "p1": [33, 34]}
C = {  # shared prefixes / suffixes across signs: conflict runs
    "p0": [[10, 11, 12, 40, 41, EOS], [10, 11, 13, 42, EOS], [10, 11, 12, 43, 44, 45, 46, EOS], [10, 50, 41, EOS]],
    "p1": [[20, 21, 22, 23, EOS], [20, 21, 60, 61, 62, 23, EOS], [20, 70, EOS], [21, 21, 22, 23, EOS]],
}
R = {tuple(c): r for p in C for c, r in zip(C[p], ([2.0, 0.0, 1.0, 0.0] if p == "p0" else [1.0, 1.0, 0.0, 3.0]))}


def rollout(prompts, trainer):
    rank, n = trainer.accelerator.process_index, len(prompts)
    rows = [(rank * n + k) % G for k in range(n)]  # position in the group (one group per generation batch)
    return {"prompt_ids": [PROMPT_IDS[p] for p in prompts],
            "completion_ids": [list(C[p][g]) for p, g in zip(prompts, rows)], "logprobs": None}


def reward(completion_ids, **kwargs):
    return [R[tuple(c)] for c in completion_ids]


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = TRLGTPOConfig(
        output_dir=out, use_cpu=True, report_to="none", bf16=False, gradient_checkpointing=False, save_strategy="no",
        disable_tqdm=True, seed=0, num_generations=G, per_device_train_batch_size=G // (2 * world),
        gradient_accumulation_steps=2, steps_per_generation=2, max_completion_length=16, max_steps=2,
        logging_steps=1, learning_rate=0.05, optim="sgd", lr_scheduler_type="constant", entropy_threshold=100.0,
    )
    trainer = TRLGTPOTrainer(model=model_dir, reward_funcs=reward, args=args,
                             train_dataset=Dataset.from_dict({"prompt": ["p0", "p1"] * 4}), rollout_func=rollout)
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    if trainer.accelerator.is_main_process:
        first = trainer.state.log_history[0]
        with open(os.path.join(out, "result.json"), "w") as fh:
            json.dump({"world": trainer.accelerator.num_processes, "rows_per_process": args.per_device_train_batch_size
                       * args.steps_per_generation, "step1_loss": first["loss"],
                       "conflict_frac": first["gtpo/conflict_frac"]}, fh)
        torch.save(initial, os.path.join(out, "initial.pt"))
        torch.save({n: p.detach() for n, p in trainer.model.named_parameters()}, os.path.join(out, "weights.pt"))


if __name__ == "__main__":
    main()
