"""Evaluation in a multi-process run (issue 42 defect 4): every process decodes and scores its share of the held-out
problems (the before/after accuracy of `eval_before_after` and the trainer's `eval_steps` evaluation), the judged
problems are gathered, and the numbers are those one process measures. Before, the main process measured the
before/after accuracy alone while the others waited in the training loop's first collective: an evaluation longer
than the process group's timeout aborted the run."""

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from helpers import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_SCRIPT = os.path.join(ROOT, "tests", "scripts", "ddp_timeout_train.py")

# a scorer of the held-out problems that passes some replies and not others, by the parity of the reply's tokens and
# of the problem's answer (the tiny random model's replies are too alike for a correctness reward); SLEEP seconds a
# call: a slow verifier (code execution, a judge model)
SCORER = ("import time\n"
          "def parity(completions, completion_ids, answer, **kwargs):\n"
          "    time.sleep(SLEEP)\n"
          "    return [float((sum(ids) + int(a)) % 2 == 0) for ids, a in zip(completion_ids, answer)]\n")
SHARE = re.compile(r"evaluation: process (\d) of 2 generated and scored problems (\d+)-(\d+) \((\d+) of (\d+)\)")


def _config(model_path, tmp_path, name, *, sleep, problems, **extra):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
                            for a, b in [(1, 2), (3, 4), (5, 1), (2, 2), (7, 3), (4, 4), (6, 1), (9, 2)]))
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(json.dumps({"question": f"What is {a} + 3?", "answer": str(a + 3)}) + "\n"
                                for a in range(problems)))
    scorer = tmp_path / f"scorer_{name}.py"
    scorer.write_text(SCORER.replace("SLEEP", repr(sleep)))
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": model_path, "dataset": {"name": str(data), "template": "plain"},
        "eval_dataset": {"name": str(held_out), "template": "plain"}, "eval_before_after": True,
        "eval_reward": f"{scorer}:parity", "reward_funcs": ["last_number_correctness"],
        "output_dir": str(tmp_path / name), "group_size": 4, "prompts_per_step": 2, "max_completion_length": 8,
        "save_steps": 0, "disable_tqdm": True, "learning_rate": 1e-2, "entropy_filter": False,
        "log_completions_steps": 0, "lr_scheduler_type": "constant", **extra,
    }))
    return str(cfg)


def _launch(two_processes: bool, argv: list[str], *, script: list[str] | None = None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    target = script or ["-m", "gtpo.cli"]
    if two_processes:
        port = str(free_port())
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               os.path.join(ROOT, "configs", "accelerate", "cpu_ddp_2proc.yaml"), "--main_process_port", port,
               *target, *argv]
    else:
        cmd = [sys.executable, *target, *argv]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)


def _shares(log: str) -> list[tuple[int, int, int, int, int]]:
    return [tuple(map(int, m)) for m in SHARE.findall(log)]


@pytest.mark.slow
@pytest.mark.launch
def test_two_processes_measure_what_one_measures_each_its_share(tiny_model_path, tmp_path):
    """The before/after accuracy and the `eval_steps` metrics of a 2-process run equal a 1-process run's on the same
    data (greedy), and each process decoded and scored half of the 10 held-out problems at every evaluation."""
    one = _launch(False, ["train", _config(tiny_model_path, tmp_path, "one", sleep=0.0, problems=10, max_steps=2,
                                           eval_steps=1)])
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    assert not _shares(one.stderr)  # one process: nothing shared
    two = _launch(True, ["train", _config(tiny_model_path, tmp_path, "two", sleep=0.0, problems=10, max_steps=2,
                                          eval_steps=1)])
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert 0.0 < s1["accuracy_before"] < 1.0  # the scorer tells replies apart: the equality below can fail
    assert (s2["accuracy_before"], s2["accuracy_after"]) == (s1["accuracy_before"], s1["accuracy_after"])
    assert s2["eval_size"] == s1["eval_size"] == 10
    m1 = [json.loads(line) for line in open(tmp_path / "one" / "metrics.jsonl")]
    m2 = [json.loads(line) for line in open(tmp_path / "two" / "metrics.jsonl")]
    assert [m["step"] for m in m2] == [m["step"] for m in m1] == [1, 2]
    for a, b in zip(m1, m2):  # the eval_steps evaluation after each step
        e1 = {k: v for k, v in a.items() if k.startswith("eval/")}
        e2 = {k: v for k, v in b.items() if k.startswith("eval/")}
        assert "eval/accuracy_greedy" in e1 and e2 == pytest.approx(e1, rel=1e-6)
    # 4 evaluations (before, steps 1 and 2, after), each process problems 0-4 or 5-9 of 10
    shares = _shares(two.stderr)
    assert sorted(shares) == sorted([(0, 0, 4, 5, 10), (1, 5, 9, 5, 10)] * 4), two.stderr[-3000:]
    assert "held-out problems" in two.stdout and two.stdout.count("greedy accuracy before training") == 1


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.launch
@pytest.mark.parametrize("engine", ["gtpo", "trl"])
def test_an_evaluation_longer_than_the_process_group_timeout_does_not_abort_the_run(tiny_model_path, tmp_path,
                                                                                    engine):
    """10 held-out problems scored by a verifier taking 1.5 s each: 15 s on one process, longer than the 8 s
    process-group timeout of this run. Before, the main process measured the accuracy before training alone while
    the other waited in the first training step's collective, which timed out after 8 s and aborted the run; now
    each process scores its 5 problems (7.5 s) and the gather waits only for the slower share. Both engines."""
    cfg = _config(tiny_model_path, tmp_path, "slow", sleep=1.5, problems=10, max_steps=1, engine=engine)
    run = _launch(True, ["8", "train", cfg], script=[TIMEOUT_SCRIPT])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((tmp_path / "slow" / "summary.json").read_text())
    assert summary["eval_size"] == 10 and "accuracy_before" in summary and "accuracy_after" in summary
    assert sorted(_shares(run.stderr)) == sorted([(0, 0, 4, 5, 10), (1, 5, 9, 5, 10)] * 2)
