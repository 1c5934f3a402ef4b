"""`accelerate launch` options in a YAML (TRL's documentation: `num_processes: 4`, `accelerate_config: zero2`):
`gtpo train` starts itself again under accelerate launch with them, as `trl grpo` does (gtpo.app.launch)."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from gtpo.app.launch import split_launch_options
from gtpo.errors import ConfigError
from helpers import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_launchers_keys_leave_the_spec_the_trainers_keep_theirs():
    spec = {"model": "m", "num_processes": 2, "main_process_port": 29999, "cpu": True, "tee": False,
            "gradient_accumulation_steps": 2, "debug": "", "learning_rate": 1e-5}
    rest, args = split_launch_options(spec, source="grpo.yaml")
    # gradient_accumulation_steps and debug are options of both accelerate launch and TRL's config: the trainer's
    assert rest == {"model": "m", "gradient_accumulation_steps": 2, "debug": "", "learning_rate": 1e-5}
    assert args == ["--num_processes", "2", "--main_process_port", "29999", "--cpu"]


def test_accelerate_config_is_a_file_or_one_of_trls_configs(tmp_path):
    pytest.importorskip("trl")
    path = tmp_path / "mine.yaml"
    path.write_text("num_processes: 1\n")
    assert split_launch_options({"accelerate_config": str(path)}, source="g.yaml")[1] == ["--config_file", str(path)]
    args = split_launch_options({"accelerate_config": "zero2", "num_processes": 1}, source="g.yaml")[1]
    assert args[0] == "--config_file" and args[1].endswith(os.path.join("accelerate_configs", "zero2.yaml"))
    assert args[2:] == ["--num_processes", "1"]
    with pytest.raises(ConfigError, match=r"g.yaml: accelerate_config 'zero9' is neither a file or one of TRL's "
                                          r"configs \(.*zero2.*\)"):
        split_launch_options({"accelerate_config": "zero9"}, source="g.yaml")


@pytest.mark.slow
@pytest.mark.launch
def test_a_yaml_with_an_accelerate_config_trains_on_two_processes(tiny_model_path, tmp_path):
    """`gtpo train --config run.yaml` where run.yaml names the repository's two-process CPU config: two processes
    train (run_config's num_processes), metrics and checkpoints are written once."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {a} + 1?", "answer": str(a + 1)}) + "\n"
                            for a in range(6)))
    out = tmp_path / "out"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": tiny_model_path, "dataset": {"name": str(data), "template": "plain"},
        "reward_funcs": ["last_number_correctness"], "output_dir": str(out), "group_size": 4, "prompts_per_step": 2,
        "max_steps": 2, "max_completion_length": 6, "save_steps": 2, "disable_tqdm": True,
        "accelerate_config": os.path.join(ROOT, "configs", "accelerate", "cpu_ddp_2proc.yaml"),
        "main_process_port": free_port(),
    }))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "gtpo.cli", "train", "--config", str(cfg)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((out / "run_config.json").read_text())["num_processes"] == 2
    assert [json.loads(line)["step"] for line in open(out / "metrics.jsonl")] == [1, 2]
    assert os.path.isdir(out / "checkpoint-2") and os.path.isfile(out / "model.safetensors")
