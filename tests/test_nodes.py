"""Several nodes, on loopback (issue 43): two ``accelerate launch`` commands with ``--num_machines 2``, ``--machine_rank 0``
and ``1`` and ``--main_process_ip 127.0.0.1``, one CPU process each (gloo), as docs/gpu.md "Several GPUs, several nodes"
shows them with GPUs. Both engines train one run: every group split across the two processes, one run directory
written once (metrics and checkpoints from the main process only). Per-node output directories (no shared file
system) are refused on every process with the fix; on TRL's engine ``save_on_each_node: true`` saves each node's copy.
A port in use fails with the reason; a machine rank out of range is refused before any process starts.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from helpers import metrics_lines, write_cli_inputs
from test_launch import ACCELERATE, ROOT, checkpoint_dirs, env, port

pytestmark = [pytest.mark.slow, pytest.mark.launch]


def node_cmd(rank, main_port, yaml_path, *args, num_machines=2):
    """One node's command: docs/gpu.md's, with 1 CPU process per node instead of 8 GPUs."""
    return [ACCELERATE, "launch", "--multi_gpu", "--num_processes", str(num_machines), "--num_machines",
            str(num_machines), "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port",
            main_port, "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "gtpo.cli", "train", yaml_path, *args]


def run_nodes(yaml_path, *per_node_args, timeout=420):
    """Both nodes started together; (returncode, stdout, stderr) of each."""
    main_port = port()
    nodes = [subprocess.Popen(node_cmd(rank, main_port, yaml_path, *(per_node_args[rank] if per_node_args else ())),
                              env=env(), cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for rank in (0, 1)]
    results = []
    try:
        for n in nodes:
            out, err = n.communicate(timeout=timeout)  # a guard against a hung rendezvous, not a timing
            results.append((n.returncode, out, err))
    finally:
        for n in nodes:
            if n.poll() is None:
                n.kill()
                n.communicate()
    return results


@pytest.mark.parametrize("engine", ["gtpo", "trl"])
def test_two_loopback_nodes_train_one_run(tiny_model_path, tmp_path, engine):
    cfg = write_cli_inputs(tmp_path, tiny_model_path, engine=engine, max_steps=4, save_steps=2,
                           log_completions_steps=0)
    results = run_nodes(cfg)
    for rank, (code, _, err) in enumerate(results):
        assert code == 0, (rank, err[-3000:])
    out = tmp_path / "out"
    assert checkpoint_dirs(out) == ["checkpoint-2", "checkpoint-4"]
    if engine == "gtpo":
        lines = metrics_lines(out)
        assert [r["step"] for r in lines if "loss" in r] == [1, 2, 3, 4]  # written once: by the main process only
        with open(out / "run_config.json") as fh:
            assert json.load(fh)["num_processes"] == 2  # one process group across both nodes
        for ckpt in checkpoint_dirs(out):
            assert os.path.isfile(out / ckpt / "model.safetensors")
    else:
        with open(out / "checkpoint-4" / "trainer_state.json") as fh:
            state = json.load(fh)
        assert state["global_step"] == 4


@pytest.mark.parametrize("engine", ["gtpo", "trl"])
def test_per_node_output_dirs_are_refused_on_every_node(tiny_model_path, tmp_path, engine):
    """No shared file system: each node names its own output_dir. The main process locks its directory; the other
    node does not see that lock file, and both nodes refuse with the same reason and the fix before training."""
    cfg = write_cli_inputs(tmp_path, tiny_model_path, engine=engine, max_steps=2, save_steps=1,
                           log_completions_steps=0)
    node_dirs = [tmp_path / "node0", tmp_path / "node1"]
    results = run_nodes(cfg, ["--output_dir", str(node_dirs[0])], ["--output_dir", str(node_dirs[1])])
    for rank, (code, _, err) in enumerate(results):
        assert code != 0, (rank, err[-3000:])
        assert "output_dir is not shared by the run's processes" in err, (rank, err[-3000:])
        assert f"process 1 on {socket.gethostname()} writes to {str(node_dirs[1])!r}" in err
        assert "put it on a file system all nodes mount" in err
    for d in node_dirs:
        assert not any(n.startswith("checkpoint-") for n in os.listdir(d)) if d.exists() else True


def test_trl_engine_saves_on_each_node_with_per_node_output_dirs(tiny_model_path, tmp_path):
    """TRL's save_on_each_node: true: each node's main process saves its own complete copy of every checkpoint."""
    cfg = write_cli_inputs(tmp_path, tiny_model_path, engine="trl", max_steps=2, save_steps=1,
                           log_completions_steps=0, save_on_each_node=True)
    node_dirs = [tmp_path / "node0", tmp_path / "node1"]
    results = run_nodes(cfg, ["--output_dir", str(node_dirs[0])], ["--output_dir", str(node_dirs[1])])
    for rank, (code, _, err) in enumerate(results):
        assert code == 0, (rank, err[-3000:])
    for d in node_dirs:
        assert checkpoint_dirs(d) == ["checkpoint-1", "checkpoint-2"], d
        assert os.path.isfile(d / "checkpoint-2" / "trainer_state.json")


def test_gtpo_engine_refuses_save_on_each_node(tiny_model_path, tmp_path, capsys):
    from gtpo.cli import main

    cfg = write_cli_inputs(tmp_path, tiny_model_path, save_on_each_node=True)
    assert main(["train", cfg]) != 0
    err = capsys.readouterr().err
    assert "save_on_each_node" in err and "one output_dir that every node must see" in err and "engine: trl" in err
    assert not (tmp_path / "out").exists()


def test_a_port_in_use_fails_with_the_reason(tiny_model_path, tmp_path):
    """The main node's port is taken by another program: accelerate launch refuses before any process starts,
    naming the port (by hand, and from the YAML's launch keys through gtpo train, as a one-line error)."""
    cfg = write_cli_inputs(tmp_path, tiny_model_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = str(taken.getsockname()[1])
        proc = subprocess.run(node_cmd(0, busy, cfg), env=env(), cwd=ROOT, text=True, capture_output=True,
                              timeout=300)
        assert proc.returncode != 0
        assert f"Tried to launch distributed communication on port `{busy}`, but another process is utilizing it" \
            in proc.stderr, proc.stderr[-3000:]
        keyed = write_cli_inputs(tmp_path, tiny_model_path, num_processes=2, num_machines=2, machine_rank=0,
                                 main_process_ip="127.0.0.1", main_process_port=int(busy), multi_gpu=True)
        proc = subprocess.run([sys.executable, "-m", "gtpo.cli", "train", keyed], env=env(), cwd=ROOT, text=True,
                              capture_output=True, timeout=120)
    assert proc.returncode != 0
    assert f"another process is utilizing it" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "out").exists()


def test_a_machine_rank_out_of_range_is_refused(tiny_model_path, tmp_path):
    """machine_rank 2 of num_machines 2 in the YAML (ranks are 0 and 1): refused before any process starts (by hand,
    ``accelerate launch --machine_rank 2`` waits at the rendezvous for a main node that never answers)."""
    cfg = write_cli_inputs(tmp_path, tiny_model_path, num_processes=2, num_machines=2, machine_rank=2,
                           main_process_ip="127.0.0.1", main_process_port=int(port()), multi_gpu=True)
    proc = subprocess.run([sys.executable, "-m", "gtpo.cli", "train", cfg], env=env(), cwd=ROOT, text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode != 0
    assert "machine_rank 2 is out of range for num_machines 2: the machines are ranked 0 to 1" in proc.stderr, \
        proc.stderr[-3000:]
    assert not (tmp_path / "out").exists()
