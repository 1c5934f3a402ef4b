"""Quiet by default (issue 30, item 6): a `gtpo train` run prints its own progress and results, not third-party
warnings or progress bars it did not ask for (bitsandbytes' CPU-kernel warning without 4-bit, datasets' split
generation, "Writing model shards" inside the training bar)."""

import json
import os
import subprocess
import sys

import yaml


def test_a_training_run_prints_nothing_it_did_not_cause(tiny_model_path, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(4)))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": tiny_model_path, "dataset": {"name": str(data), "template": "plain"},
        "reward_funcs": ["last_number_correctness"], "output_dir": str(tmp_path / "out"), "group_size": 4,
        "prompts_per_step": 2, "max_steps": 2, "max_completion_length": 4, "save_steps": 1,  # checkpoints in the bar
        "peft": {"r": 4}, "entropy_rule": "initial", "entropy_threshold": 0.6931,  # no gtpo warning either
    }))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONWARNINGS": ""}
    out = subprocess.run([sys.executable, "-m", "gtpo.cli", "train", str(cfg)], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert "gtpo training" in text  # the training bar is there
    for noise in ("gemm_4bit", "bitsandbytes", "Writing model shards", "Generating train split", "Map:",
                  "Warning", "warn("):
        assert noise not in text, (noise, text[-3000:])
