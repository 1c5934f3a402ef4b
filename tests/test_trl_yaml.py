"""A YAML written for `trl grpo --config` (issue 30, item 2): the same file runs with TRL's own CLI, with
`gtpo train --config FILE --engine trl` and with gtpo's own trainer, unchanged; TRL's names are aliases the same
way in the YAML and in Python on both engines."""

import json
import os
import shutil
import subprocess
import sys

import datasets
import pytest
import yaml

from gtpo import GTPOConfig
from gtpo.errors import ConfigValueError
from gtpo.app.spec import split_spec
from gtpo.cli import main
from gtpo.errors import ConfigError

pytest.importorskip("trl")

ROWS = [{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "solution": f"${2 * i}$"} for i in range(8)]
REWARDS = "def length_reward(completions, **kwargs):\n    return [len(c[0]['content']) / 10 for c in completions]\n"


def trl_yaml(tmp_path, model_path, **extra):
    """The YAML as a TRL user writes it for `trl grpo --config` (TRL's names only), with a tiny local model and a
    local dataset directory laid out as a hub dataset repository (parquet files named after their split)."""
    data = tmp_path / "tiny-math"
    if not data.exists():
        (data / "data").mkdir(parents=True)
        datasets.Dataset.from_list(ROWS).to_parquet(str(data / "data" / "train-00000-of-00001.parquet"))
        datasets.Dataset.from_list(ROWS[:4]).to_parquet(str(data / "data" / "test-00000-of-00001.parquet"))
        (tmp_path / "my_rewards.py").write_text(REWARDS)
    spec = {
        "model_name_or_path": model_path, "dataset_name": str(data), "dataset_train_split": "train",
        "reward_funcs": ["accuracy_reward", "think_format_reward", "my_rewards.length_reward"],
        "output_dir": str(tmp_path / "out"), "learning_rate": 1.0e-5, "num_generations": 4,
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "max_completion_length": 8,
        "max_steps": 2, "logging_steps": 1, "save_steps": 1, "use_peft": True, "lora_r": 4, "lora_alpha": 8,
        "lora_target_modules": "all-linear", "report_to": "none", "seed": 0, "beta": 0.0, "bf16": False,
        **extra,
    }
    path = tmp_path / "grpo.yaml"
    path.write_text("# trl grpo --config grpo.yaml\n" + yaml.safe_dump(spec, sort_keys=False))
    return path


def metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh]


def test_the_file_is_trls_own(tiny_model_path, tmp_path):
    """Sensitivity: TRL's CLI itself trains this YAML (so what gtpo accepts below is a TRL user's file)."""
    path = trl_yaml(tmp_path, tiny_model_path)
    trl = shutil.which("trl") or os.path.join(os.path.dirname(sys.executable), "trl")
    out = subprocess.run([trl, "grpo", "--config", str(path)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert os.path.isfile(tmp_path / "out" / "adapter_model.safetensors")


@pytest.mark.parametrize("engine", ["trl", "gtpo"])
def test_a_trl_yaml_trains_unchanged_on_both_engines(tiny_model_path, tmp_path, monkeypatch, engine):
    path = trl_yaml(tmp_path, tiny_model_path)
    monkeypatch.chdir(tmp_path)  # `trl grpo` imports dotted reward paths from the current directory
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    argv = ["train", "--config", str(path)] + (["--engine", "trl"] if engine == "trl" else [])
    assert main(argv) == 0
    out = tmp_path / "out"
    assert os.path.isfile(out / "adapter_model.safetensors")  # use_peft + lora_*: LoRA
    steps = [m for m in metrics(out) if "reward" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for key in ("reward", "rewards/accuracy_reward/mean", "rewards/think_format_reward/mean",
                "rewards/length_reward/mean", "entropy", "completions/mean_length", "learning_rate"):
        assert key in steps[0], key
    assert steps[0]["rewards/length_reward/mean"] > 0  # the dotted reward path was called
    run_config = json.loads((out / "run_config.json").read_text())
    assert run_config["group_size"] == 4  # num_generations
    if engine == "gtpo":  # TRL's batch: 4 completions x 2 accumulation steps = 2 prompts of 4, micro-batches of 4
        assert (run_config["prompts_per_step"], run_config["micro_batch_size"]) == (2, 4)
    else:
        assert run_config["trl"]["per_device_train_batch_size"] == 4


def test_trl_names_map_onto_the_spec(tiny_model_path, tmp_path):
    spec = yaml.safe_load(trl_yaml(tmp_path, tiny_model_path, load_in_4bit=True, dtype="bfloat16",
                                   reward_model_name_or_path="org/rm", eval_strategy="steps", eval_steps=5,
                                   dataset_config="main").read_text())
    run, config = split_spec(spec, source="grpo.yaml")
    assert run.model == tiny_model_path
    assert run.dataset == {"name": str(tmp_path / "tiny-math"), "split": "train", "config": "main"}
    assert run.eval_dataset == {"name": str(tmp_path / "tiny-math"), "split": "test", "config": "main"}
    assert run.reward_funcs[0] == "org/rm"  # first, as `trl grpo` puts the reward model
    assert run.peft == {"r": 4, "lora_alpha": 8, "lora_dropout": 0.05, "target_modules": "all-linear"}
    assert config.model_init_kwargs["quantization_config"] == {
        "load_in_4bit": True, "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": False}
    assert (config.group_size, config.eval_steps) == (4, 5)
    # without use_peft the lora_* settings do nothing, as in trl grpo: full fine-tuning
    spec.pop("use_peft")
    assert split_spec(spec, source="grpo.yaml")[0].peft is None


def test_what_does_not_mean_the_same_is_refused_naming_it(tiny_model_path, tmp_path):
    spec = yaml.safe_load(trl_yaml(tmp_path, tiny_model_path).read_text())
    with pytest.raises(ConfigError, match=r"unknown config field 'vllm_server_host'.*it is an option of TRL's "
                                          r"GRPOConfig: set `engine: trl`"):
        split_spec({**spec, "vllm_server_host": "10.0.0.1"}, source="grpo.yaml")
    split_spec({**spec, "vllm_server_host": "10.0.0.1", "engine": "trl"}, source="grpo.yaml")  # TRL's engine takes it
    with pytest.raises(ConfigError, match=r"num_iterations > 1, TRL's batch fields .* count optimizer updates"):
        split_spec({**spec, "num_iterations": 2}, source="grpo.yaml")
    with pytest.raises(ConfigError, match=r"dataset mixtures \(datasets:\) are not supported"):
        split_spec({**spec, "datasets": [{"path": "x"}]}, source="grpo.yaml")
    with pytest.raises(ConfigError, match=r"model_name_or_path is TRL's name of model, which is also set"):
        split_spec({**spec, "model": "other"}, source="grpo.yaml")


def test_group_size_and_num_generations_in_python_on_both_engines():
    from gtpo.integrations.trl import TRLGTPOConfig

    assert GTPOConfig(num_generations=4).group_size == 4  # TRL's name on gtpo's config
    with pytest.raises(ValueError, match=r"num_generations=4 is TRL's name of group_size, which is 6: set one"):
        GTPOConfig(num_generations=4, group_size=6)
    for bad in (0, [], "8"):  # an invalid value given under TRL's name is reported under that name
        with pytest.raises(ConfigValueError, match=r"\(given as num_generations, TRL's name of group_size\)") as err:
            GTPOConfig(num_generations=bad)
        assert err.value.field == "num_generations"
    args = TRLGTPOConfig(output_dir="x", group_size=4, per_device_train_batch_size=4, use_cpu=True)
    assert (args.num_generations, args.group_size) == (4, None)  # gtpo's name on TRL's config
    with pytest.raises(ValueError, match=r"group_size=4 is gtpo's name of num_generations, which is 6"):
        TRLGTPOConfig(output_dir="x", group_size=4, num_generations=6, per_device_train_batch_size=12, use_cpu=True)


def test_yaml_num_generations_on_both_engines(tiny_model_path):
    for engine in ("gtpo", "trl"):  # the YAML's TRL name was refused on TRL's engine before
        spec = {"model": tiny_model_path, "dataset": "x.jsonl", "reward_funcs": ["format"], "engine": engine,
                "num_generations": 4}
        assert split_spec(spec, source="y.yaml")[1].group_size == 4, engine
