"""Two CPU processes through `accelerate launch` (gloo DDP): groups split across processes,
gradients averaged, every process ends with identical weights, metrics and checkpoints written once."""

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import free_port

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "ddp_train.py")


def launch(num_processes, model_dir, out):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port())}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(num_processes),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", env["MASTER_PORT"], SCRIPT, model_dir, out]
    if num_processes == 1:
        cmd = [sys.executable, SCRIPT, model_dir, out]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.launch
def test_two_process_ddp(tiny_model_path, tmp_path):
    out = str(tmp_path / "ddp")
    launch(2, tiny_model_path, out)
    r0 = json.load(open(os.path.join(out, "rank0.json")))
    r1 = json.load(open(os.path.join(out, "rank1.json")))
    assert r0["world"] == r1["world"] == 2
    assert len(r0["rows"]) == len(r1["rows"]) == 1  # prompts_per_step=2 split as one group each
    assert r0["rows"] != r1["rows"]
    w0 = torch.load(os.path.join(out, "weights0.pt"))
    w1 = torch.load(os.path.join(out, "weights1.pt"))
    for name in w0:
        assert torch.equal(w0[name], w1[name]), f"processes diverged on {name}"
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    assert [l["step"] for l in lines] == [1, 2, 3]  # written once, by the main process
    assert os.path.isfile(os.path.join(out, "checkpoint-2", "gtpo_trainer_state.json"))
    assert os.path.isfile(os.path.join(out, "model.safetensors"))
    # the weights moved away from the initial model
    from transformers import AutoModelForCausalLM

    init = dict(AutoModelForCausalLM.from_pretrained(tiny_model_path).named_parameters())
    assert any(not torch.equal(init[n], w0[n]) for n in w0 if n in init)


@pytest.mark.slow
@pytest.mark.launch
def test_readme_accelerate_command(tiny_model_path, tmp_path):
    """`accelerate launch --config_file configs/accelerate/cpu_ddp_2proc.yaml -m gtpo.cli train CONFIG.yaml`,
    exactly as the README writes it: two processes, groups split across them, one run directory."""
    import yaml

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {a} + 1?", "answer": str(a + 1)}) + "\n" for a in range(6)))
    out = tmp_path / "out"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": tiny_model_path, "dataset": {"name": str(data), "template": "plain"},
        "reward_funcs": ["last_number_correctness", "format_soft"], "output_dir": str(out), "group_size": 4,
        "prompts_per_step": 2, "max_steps": 2, "max_completion_length": 6, "save_steps": 1, "disable_tqdm": True,
        "entropy_threshold": 100.0, "learning_rate": 1e-3,
    }))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    port = str(free_port())
    cmd = [os.path.join(os.path.dirname(sys.executable), "accelerate"), "launch", "--config_file",
           os.path.join(root, "configs", "accelerate", "cpu_ddp_2proc.yaml"), "--main_process_port", port,
           "-m", "gtpo.cli", "train", str(cfg)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [line["step"] for line in lines] == [1, 2]  # written once, by the main process
    config = json.loads((out / "run_config.json").read_text())
    assert config["num_processes"] == 2
    assert os.path.isfile(out / "model.safetensors") and os.path.isdir(out / "checkpoint-2")
