"""Metric names (issue 30, item 2): TRL's on both engines, GTPO's own under gtpo/, every key written documented in
docs/metrics.md's table, and the earlier names still read."""

import json
import os
import re

import pytest

from gtpo import GTPOConfig, GTPOTrainer
from gtpo.run.metric_names import RENAMED, canonical_name, canonical_record, legacy_name, legacy_record

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "metrics.md")
ROWS = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]


def documented():
    """(name pattern, engines) of every row of docs/metrics.md's table; ``<x>`` matches one or more characters."""
    out = []
    for line in open(DOC, encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`"):
            continue
        for name in re.findall(r"`([^`]+)`", cells[0]):
            pattern = re.escape(name).replace(re.escape("<"), "<").replace(re.escape(">"), ">")
            out.append((re.compile("^" + re.sub(r"<[a-z]+>", ".+", pattern) + "$"), cells[1]))
    return out


def undocumented(keys, engine):
    table = documented()
    return sorted(k for k in keys if not any(p.match(k) and e in ("both", engine) for p, e in table))


def keys_of(output_dir):
    with open(os.path.join(output_dir, "metrics.jsonl")) as fh:
        return {k for line in fh for k in json.loads(line)}


def digits(completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def test_renames_are_one_to_one_and_invertible():
    assert len(set(RENAMED.values())) == len(RENAMED)
    for old, new in RENAMED.items():
        assert canonical_name(old) == new and canonical_name(new) == new and legacy_name(new) == old
    record = {"step": 3, "reward/mean": 0.5, "reward/paper/mean": 1.0, "no_signal/masked": 2.0, "eval/pass@1": 0.3,
              "gtpo/conflict_frac": 0.1, "vllm/sync_time_s": 0.2}
    assert canonical_record(record) == {"step": 3, "reward": 0.5, "rewards/paper/mean": 1.0,
                                        "gtpo/no_signal/masked": 2.0, "eval/pass@1": 0.3, "gtpo/conflict_frac": 0.1,
                                        "vllm/sync_time_s": 0.2}
    assert legacy_record(canonical_record(record)) == record


@pytest.mark.parametrize("settings", [
    dict(loss_type="gtpo", log_policy_change=True, eval_steps=1),
    dict(loss_type="grpo", beta=0.04, num_iterations=2),
    dict(loss_type="dapo", dynamic_sampling=True),
], ids=["gtpo", "grpo-kl", "dapo"])
def test_gtpo_trainer_writes_documented_trl_names(tiny_model_path, tmp_path, settings):
    cfg = GTPOConfig(output_dir=str(tmp_path / "run"), group_size=4, prompts_per_step=2, max_steps=1,
                     max_completion_length=6, save_steps=0, disable_tqdm=True, log_completions_steps=0, **settings)
    GTPOTrainer(tiny_model_path, [digits], ROWS, args=cfg, eval_dataset=ROWS[:2],
                probe_texts={"answer": ("What is 1 + 1?", " 2")}).train()
    keys = keys_of(cfg.output_dir)
    assert {"reward", "entropy", "completions/mean_length", "learning_rate", "step_time"} <= keys
    assert not [k for k in keys if canonical_name(k) != k]  # no earlier name: nothing to rename
    assert not undocumented(keys, "gtpo")
    if settings.get("beta"):
        assert "kl" in keys


def test_trl_engine_writes_documented_trl_names(tiny_model_path, tmp_path):
    pytest.importorskip("trl")
    from datasets import Dataset

    from gtpo.integrations.trl import TRLGTPOConfig, TRLGTPOTrainer, metrics_file_callback

    args = TRLGTPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                         max_completion_length=6, max_steps=2, logging_steps=1, use_cpu=True, report_to="none",
                         bf16=False, save_strategy="no", disable_tqdm=True, eval_strategy="steps", eval_steps=2,
                         per_device_eval_batch_size=4, num_generations_eval=2)
    data = Dataset.from_dict({"prompt": [r["prompt"] for r in ROWS]})
    trainer = TRLGTPOTrainer(model=tiny_model_path, reward_funcs=digits, args=args, train_dataset=data,
                             eval_dataset=data.select(range(2)), callbacks=[metrics_file_callback(str(tmp_path))])
    trainer.train()
    keys = keys_of(str(tmp_path))
    assert {"reward", "entropy", "completions/mean_length", "learning_rate", "gtpo/conflict_frac"} <= keys
    assert not [k for k in keys if canonical_name(k) != k]  # the same names as gtpo's trainer: no mix
    assert not undocumented(keys, "trl")
