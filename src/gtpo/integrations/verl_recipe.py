"""The paper recipe's data and reward for verl (``configs/verl/``), without importing verl.

* :func:`compute_score` -- verl's custom reward signature (``reward.custom_reward_function.path=
  pkg://gtpo.integrations.verl_recipe``, ``name=compute_score``): the GTPO paper's reward in [0, 20]
  (:func:`gtpo.rewards.paper_score`, format plus correctness as the reference ``final_reward``).
* :func:`write_parquet` / ``python -m gtpo.integrations.verl_recipe OUT_DIR [--task gsm8k]`` -- the task's train and
  test splits as verl's RL parquet files (``prompt`` chat messages with the paper's system prompt,
  ``reward_model.ground_truth``), from :func:`gtpo.data.load_task`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..rewards import paper_score

DATA_SOURCE = "gtpo/paper"


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **kwargs: Any) -> float:
    """The paper's reward of one completion ``solution_str`` against ``ground_truth`` (verl's custom reward
    function signature; ``data_source`` and ``extra_info`` are not used)."""
    return float(paper_score(solution_str, str(ground_truth)))


def verl_rows(examples, split: str) -> list[dict[str, Any]]:
    """verl's RL dataset rows of gtpo examples (``prompt`` messages and ``answer``; :func:`gtpo.data.load_task`)."""
    rows = []
    for i, ex in enumerate(examples):
        rows.append({"data_source": DATA_SOURCE, "prompt": list(ex["prompt"]), "ability": "math",
                     "reward_model": {"style": "rule", "ground_truth": str(ex["answer"])},
                     "extra_info": {"split": split, "index": i}})
    return rows


def write_parquet(out_dir: str, *, task: str = "gsm8k", template: str = "paper",
                  splits: tuple[str, ...] = ("train", "test"), path: str | None = None) -> dict[str, str]:
    """Write ``OUT_DIR/{split}.parquet`` for each split (verl's ``data.train_files`` / ``data.val_files``); returns
    split -> file. ``path``: a local file instead of the hub task (gtpo.data.load_task's ``path``)."""
    import datasets

    from ..data import load_task

    os.makedirs(out_dir, exist_ok=True)
    files = {}
    for split in splits:
        examples = load_task(task, split=split, template=template, path=path)
        target = os.path.join(out_dir, f"{split}.parquet")
        datasets.Dataset.from_list(verl_rows(examples, split)).to_parquet(target)
        files[split] = target
    return files


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a task as verl's RL parquet files (the paper's prompts).")
    parser.add_argument("out_dir")
    parser.add_argument("--task", default="gsm8k")
    parser.add_argument("--template", default="paper")
    args = parser.parse_args(argv)
    for split, target in write_parquet(args.out_dir, task=args.task, template=args.template).items():
        print(f"{split}: {target}")


if __name__ == "__main__":
    main()
