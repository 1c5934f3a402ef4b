"""The command line: YAML + overrides, errors, shipped configs, an end-to-end train on a tiny model."""

import glob
import json
import os

import pytest
import yaml

from gtpo.app import apply_overrides, default_config_text, parse_overrides, split_spec
from gtpo.cli import main
from gtpo.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_parse_overrides_types():
    got = parse_overrides(["--learning_rate", "1e-3", "--group_size=4", "--peft.r", "8", "--bf16",
                           "--eval_k", "[1, 4]", "--model", "x/y", "--scale_rewards", "null"])
    assert got == {"learning_rate": 1e-3, "group_size": 4, "peft.r": 8, "bf16": True, "eval_k": [1, 4],
                   "model": "x/y", "scale_rewards": None}


def test_apply_overrides_nested_and_string_dataset():
    spec = {"dataset": "gsm8k", "peft": None}
    out = apply_overrides(spec, {"dataset.size": 10, "peft.r": 4})
    assert out == {"dataset": {"name": "gsm8k", "size": 10}, "peft": {"r": 4}}
    assert spec == {"dataset": "gsm8k", "peft": None}  # not mutated


def test_unknown_field_suggests_closest(capsys):
    assert main(["train", "--grup_size", "4"]) == 2
    err = capsys.readouterr().err
    assert "unknown option --grup_size" in err and "did you mean 'group_size'" in err


def test_unknown_yaml_key_and_bad_values(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown config field 'learnig_rate'; did you mean 'learning_rate'"):
        split_spec({"learnig_rate": 1e-3}, source="x.yaml")
    with pytest.raises(ConfigError, match="group_size must be an integer, got 'four'"):
        split_spec({"group_size": "four"}, source="x.yaml")
    with pytest.raises(ConfigError, match="temperature must be > 0"):
        split_spec({"temperature": 0}, source="x.yaml")
    with pytest.raises(ConfigError, match=r"unknown key 'peft.lora_alph'; did you mean 'lora_alpha'"):
        split_spec({"peft": {"lora_alph": 4}}, source="x.yaml")
    with pytest.raises(ConfigError, match="bf16 must be true or false"):
        split_spec({"bf16": "yes please"}, source="x.yaml")


def test_yaml_syntax_error_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: x\ngroup_size: [1, 2\nmax_steps: 3\n")
    assert main(["train", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "YAML syntax error in" in err and "bad.yaml, line" in err


def test_missing_config_file(capsys):
    assert main(["train", "/nonexistent/cfg.yaml"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_help_lists_every_field(capsys):
    from gtpo import GTPOConfig

    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for name in GTPOConfig.field_names():
        assert f"--{name}" in out, name
    assert "conflict-token" in out  # documentation text, not just names


def shipped_configs():
    found = glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True)
    # configs/accelerate/ holds `accelerate launch --config_file` files, configs/verl/ verl's hydra configs (checked
    # against verl's own schema in tests/verl/), not gtpo run configs
    return sorted(p for p in found if not any(os.sep + d + os.sep in p for d in ("accelerate", "verl")))


def test_default_config_validates():
    run, config = split_spec(yaml.safe_load(default_config_text()), source="default")
    assert run.model == "smollm2-135m-instruct"
    assert run.eval_before_after and run.eval_dataset


@pytest.mark.parametrize("path", shipped_configs(), ids=lambda p: os.path.relpath(p, ROOT))
def test_shipped_configs_validate(path):
    from gtpo.app import build_peft_config, load_yaml
    from gtpo.app.common import dataset_spec as _dataset_spec

    run, config = split_spec(load_yaml(path), source=path)
    assert run.model
    _dataset_spec(run.dataset, default_split="train")
    build_peft_config(run.peft)


def test_train_end_to_end_from_yaml_then_report(tiny_model_path, tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    with open(data, "w") as fh:
        for a, b in [(1, 2), (3, 4), (5, 1), (2, 2)]:
            fh.write(json.dumps({"question": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n")
    cfg = tmp_path / "run.yaml"
    out_dir = tmp_path / "out"
    cfg.write_text(yaml.safe_dump({
        "model": tiny_model_path,
        "dataset": {"name": str(data), "template": "plain"},
        "eval_dataset": {"name": str(data), "template": "plain"},
        "eval_before_after": True,
        "reward_funcs": ["last_number_correctness", "format_soft"],
        "eval_reward": "last_number_correctness",
        "output_dir": str(out_dir),
        "group_size": 4, "prompts_per_step": 2, "max_steps": 2, "max_completion_length": 6,
        "save_steps": 1, "disable_tqdm": True, "entropy_rule": "initial", "entropy_threshold": 0.6931,
    }))
    assert main(["train", str(cfg), "--learning_rate", "1e-3", "--peft.r", "4"]) == 0
    out = capsys.readouterr().out
    assert "greedy accuracy before training" in out and "greedy accuracy after training" in out
    assert os.path.isfile(out_dir / "adapter_model.safetensors")
    assert os.path.isdir(out_dir / "checkpoint-2")
    summary = json.loads((out_dir / "summary.json").read_text())
    assert 0.0 <= summary["accuracy_before"] <= 1.0 and summary["steps"] == 2
    assert os.path.isfile(out_dir / "report" / "report.md")
    run_config = json.loads((out_dir / "run_config.json").read_text())
    assert run_config["learning_rate"] == 1e-3 and run_config["entropy_rule"] == "initial"
    # the paper's <H>_ini rule recorded the initial entropy (a random model: far above ln 2)
    lines = [json.loads(l) for l in open(out_dir / "metrics.jsonl")]
    assert lines[0]["gtpo/initial_entropy"] > 0.6931
    assert lines[0]["gtpo/filtered_frac"] == 0.0  # <H>_ini > threshold: nothing is dropped
    # gtpo report on the run
    assert main(["report", str(out_dir), "--out", str(tmp_path / "rep")]) == 0
    assert os.path.isfile(tmp_path / "rep" / "entropy.png")
    # a rerun into the same directory is refused with a clear message
    assert main(["train", str(cfg)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    # ... resuming the finished run in place is refused (its final model stays), with the command that continues it
    assert main(["train", str(cfg), "--resume_from_checkpoint", "true", "--max_steps", "3", "--peft.r", "4"]) == 2
    err = capsys.readouterr().err
    assert "holds a finished run" in err and f"--resume_from_checkpoint {out_dir / 'checkpoint-2'}" in err
    more = tmp_path / "more"
    assert main(["train", str(cfg), "--output_dir", str(more), "--resume_from_checkpoint",
                 str(out_dir / "checkpoint-2"), "--max_steps", "3", "--peft.r", "4"]) == 0
    lines = [json.loads(l) for l in open(more / "metrics.jsonl") if "\"reward\":" in l]
    assert [l["step"] for l in lines] == [3]


def test_config_reference_is_up_to_date():
    import subprocess
    import sys

    script = os.path.join(ROOT, "scripts", "gen_config_docs.py")
    result = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True)
    assert result.returncode == 0, "docs/config.md is stale: run python scripts/gen_config_docs.py"
