"""TRL users' YAMLs on both engines (issue 41, item 3): the GRPO configs of TRL's documentation and YAMLs of the
shapes TRL users write (standard and conversational datasets, dataset directories with splits, a reward model,
several rewards with weights, LoRA, schedules, save and evaluation strategies), each trained by `gtpo train --config
FILE` on gtpo's engine and with `--engine trl` on TRL's, with a tiny local model and data swapped in. The same file
must give the same batch (the completions each reward call scores), schedule (the learning rate of every step),
checkpoint steps, evaluation steps and reward weighting on both, read from what each engine logs."""

import json
import os
import sys

import datasets
import pytest
import yaml

from gtpo.cli import main

pytest.importorskip("trl")

CONVERSATIONAL = [{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "solution": f"${2 * i}$"}
                  for i in range(8)]
STANDARD = [{"prompt": f"What is {i} + {i}?", "solution": f"${2 * i}$"} for i in range(8)]

# a user's reward module (imported by its dotted path, as `trl grpo` does): it writes down how many completions each
# call scores (the batch) and scores them by length
USER_REWARDS = '''
import os

def _text(c):
    return c if isinstance(c, str) else c[0]["content"]

def length_reward(completions, **kwargs):
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "reward_calls.txt"), "a") as fh:
        fh.write(f"{len(completions)}\\n")
    return [len(_text(c)) / 10 for c in completions]

def short_reward(completions, **kwargs):
    return [float(len(_text(c)) < 20) for c in completions]

def has_digit_reward(completions, **kwargs):
    return [float(any(ch.isdigit() for ch in _text(c))) for c in completions]
'''


def dataset_dir(root, rows, layout):
    """A local dataset directory as `trl grpo` loads it (``load_dataset(dir)``): parquet files named after their split
    under ``data/`` (as a hub repository), or ``train.jsonl`` / ``test.jsonl``."""
    path = root / f"data-{layout}"
    if path.exists():
        return str(path)
    if layout == "parquet":
        (path / "data").mkdir(parents=True)
        datasets.Dataset.from_list(rows).to_parquet(str(path / "data" / "train-00000-of-00001.parquet"))
        datasets.Dataset.from_list(rows[:4]).to_parquet(str(path / "data" / "test-00000-of-00001.parquet"))
    else:
        path.mkdir(parents=True)
        for split, part in (("train", rows), ("test", rows[:4])):
            with open(path / f"{split}.jsonl", "w") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in part)
    return str(path)


def tiny(**fields):
    """What every journey adds to make a tiny run: short completions, a few steps, no trackers."""
    return {"max_completion_length": 8, "report_to": "none", "seed": 0, "bf16": False, **fields}


# name -> (the file's keys; the tiny model, data and output_dir are swapped in)
JOURNEYS = {
    # TRL's documentation (docs/source/clis.md, "Using Configuration Files", GRPO): model, dataset, a reward
    "trl-docs-grpo-config": {"reward_funcs": ["accuracy_reward"], **tiny(
        num_generations=4, per_device_train_batch_size=4, max_steps=2)},
    # TRL's examples/cli_configs/example_config.yaml (report_to, learning_rate, lr_scheduler_type) made a GRPO file
    "trl-example-config": {"reward_funcs": ["accuracy_reward", "think_format_reward"], "learning_rate": 0.0001,
                           "lr_scheduler_type": "cosine", **tiny(num_generations=4, per_device_train_batch_size=4,
                                                                 max_steps=3, warmup_ratio=0.34)},
    # a standard-format dataset directory with jsonl splits, evaluation every step on the test split
    "standard-jsonl-eval": {"layout": "jsonl", "rows": "standard",
                            "reward_funcs": ["my_rewards.short_reward", "my_rewards.has_digit_reward"],
                            "reward_weights": [1.0, 0.5], "dataset_test_split": "test", "eval_strategy": "steps",
                            "eval_steps": 1, "per_device_eval_batch_size": 4, **tiny(
                                num_generations=4, per_device_train_batch_size=8, max_steps=2,
                                lr_scheduler_type="linear", learning_rate=1.0e-5)},
    # the ordinary shape of issue 41: conversational splits, several weighted rewards, LoRA, accumulation, cosine
    # with warmup, step checkpoints
    "conversational-lora-weighted": {"reward_funcs": ["accuracy_reward", "think_format_reward",
                                                      "my_rewards.length_reward"],
                                     "reward_weights": [1.0, 0.5, 0.25], "use_peft": True, "lora_r": 4,
                                     "lora_alpha": 8, "lora_target_modules": ["q_proj", "v_proj"], **tiny(
                                         num_generations=4, per_device_train_batch_size=2,
                                         gradient_accumulation_steps=4, max_steps=4, lr_scheduler_type="cosine",
                                         warmup_ratio=0.25, learning_rate=5.0e-5, save_strategy="steps",
                                         save_steps=2, save_total_limit=3, logging_steps=1)},
    # epochs instead of max_steps, checkpoints and evaluation at each epoch's end
    "epochs-save-eval-per-epoch": {"reward_funcs": ["accuracy_reward", "my_rewards.short_reward"],
                                   "num_train_epochs": 2, "save_strategy": "epoch", "eval_strategy": "epoch",
                                   "dataset_test_split": "test", **tiny(num_generations=4,
                                                                        per_device_train_batch_size=8,
                                                                        lr_scheduler_type="linear")},
    # intervals as fractions of the run (TRL's floats below 1): checkpoints every half, evaluation every quarter
    "fractional-intervals": {"reward_funcs": ["accuracy_reward"], "save_steps": 0.5, "eval_strategy": "steps",
                             "eval_steps": 0.25, "logging_steps": 0.5, "dataset_test_split": "test",
                             **tiny(num_generations=4, per_device_train_batch_size=8, max_steps=4)},
    # a reward model first (TRL's reward_model_name_or_path), a QLoRA base, a weighted rule reward
    "reward-model-qlora": {"reward_model_name_or_path": "REWARD_MODEL", "reward_funcs": ["think_format_reward"],
                           "reward_weights": [1.0, 2.0], "load_in_4bit": True, "use_peft": True, "lora_r": 4,
                           "lora_alpha": 8, **tiny(num_generations=4, per_device_train_batch_size=4, max_steps=2)},
}


def write_journey(tmp_path, name, model_path, engine):
    keys = dict(JOURNEYS[name])
    rows = STANDARD if keys.pop("rows", "conversational") == "standard" else CONVERSATIONAL
    data = dataset_dir(tmp_path, rows, keys.pop("layout", "parquet"))
    (tmp_path / "my_rewards.py").write_text(USER_REWARDS)
    if keys.get("reward_model_name_or_path") == "REWARD_MODEL":
        from test_scoring import build_reward_model

        keys["reward_model_name_or_path"] = str(build_reward_model(tmp_path / "tiny-rm"))
    spec = {"model_name_or_path": model_path, "dataset_name": data, **keys,
            "output_dir": str(tmp_path / f"out-{engine}")}
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"# trl grpo --config {name}.yaml\n" + yaml.safe_dump(spec, sort_keys=False))
    return path


def logged(out):
    """Per-step lines of metrics.jsonl (both engines write it, TRL's names)."""
    with open(os.path.join(out, "metrics.jsonl")) as fh:
        lines = [json.loads(line) for line in fh]
    return [m for m in lines if "reward" in m], [m for m in lines if any(k.startswith("eval/") for k in m)]


def train(tmp_path, monkeypatch, name, model_path, engine):
    path = write_journey(tmp_path, name, model_path, engine)
    monkeypatch.chdir(tmp_path)  # `trl grpo` imports dotted reward paths from the current directory
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    calls = tmp_path / "reward_calls.txt"
    if calls.exists():
        calls.unlink()
    argv = ["train", "--config", str(path)] + (["--engine", "trl"] if engine == "trl" else [])
    assert main(argv) == 0
    out = tmp_path / f"out-{engine}"
    steps, evals = logged(out)
    return {
        "steps": [m["step"] for m in steps],
        "learning_rate": [m["learning_rate"] for m in steps],
        "checkpoints": sorted(int(d.split("-")[1]) for d in os.listdir(out) if d.startswith("checkpoint-")),
        "eval_steps": [m["step"] for m in evals],
        "batch": [int(x) for x in calls.read_text().split()] if calls.exists() else [],
        "lines": steps,
        "out": out,
    }


def reward_weights_hold(lines, spec):
    """``reward`` is the weighted sum of the functions' means on every step (no function returned None here); a
    reward model comes first, logged under its directory's name."""
    names = [f.split(".")[-1] for f in spec["reward_funcs"]]
    if spec.get("reward_model_name_or_path"):
        names = ["tiny-rm"] + names
    weights = spec.get("reward_weights") or [1.0] * len(names)
    for m in lines:
        expected = sum(w * m[f"rewards/{n}/mean"] for n, w in zip(names, weights))
        assert m["reward"] == pytest.approx(expected, rel=1e-5, abs=1e-6), (m["step"], m["reward"], expected)


@pytest.mark.parametrize("name", list(JOURNEYS))
def test_a_trl_users_yaml_means_the_same_on_both_engines(tiny_model_path, tmp_path, monkeypatch, name):
    runs = {engine: train(tmp_path, monkeypatch, name, tiny_model_path, engine) for engine in ("gtpo", "trl")}
    gtpo, trl = runs["gtpo"], runs["trl"]
    spec = JOURNEYS[name]
    # gtpo's metrics.jsonl has every step, TRL's the logging steps (logging_steps; every step by default)
    assert gtpo["steps"] == list(range(1, len(gtpo["steps"]) + 1))
    every = spec.get("logging_steps", 1)
    every = -(-len(gtpo["steps"]) * every // 1) if isinstance(every, float) else every
    assert trl["steps"] == [s for s in gtpo["steps"] if s % every == 0]
    rates = dict(zip(gtpo["steps"], gtpo["learning_rate"]))
    assert [rates[s] for s in trl["steps"]] == pytest.approx(trl["learning_rate"], rel=1e-9, abs=1e-15)  # schedule
    assert gtpo["checkpoints"] == trl["checkpoints"]
    assert gtpo["eval_steps"] == trl["eval_steps"]
    if gtpo["batch"] or trl["batch"]:  # the user's reward saw the same completions per training call
        assert gtpo["batch"] == trl["batch"]
    for run in runs.values():
        reward_weights_hold(run["lines"], spec)
        saved = os.listdir(run["out"])
        assert ("adapter_model.safetensors" if spec.get("use_peft") else "model.safetensors") in saved
