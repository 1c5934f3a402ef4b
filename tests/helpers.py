"""What many test files share and used to copy: the prompts, the dense digit rewards and the small config that
one or two training steps of the session's tiny random model (``tiny_model_path`` in conftest.py) run with.

Import from here (``from helpers import PROMPTS, digit_reward, rows, tiny_config``; pytest puts tests/ on ``sys.path``
as it does for ``reference_impl``); a file that needs other settings passes them as keywords, e.g.
``tiny_config(tmp_path, max_steps=1, entropy_filter=False)``."""

from __future__ import annotations

import json
import os

import yaml

from gtpo import GTPOConfig

HERE = os.path.dirname(os.path.abspath(__file__))

#: Eight addition prompts (a run of ``prompts_per_step=2`` takes two per step); ``PROMPTS[:4]`` is the short set.
PROMPTS = [f"What is {a} + {b}?" for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 1), (2, 2), (4, 5), (6, 3)]]


def free_port() -> int:
    """A TCP port on loopback that is free now (the OS picks it) for a multi-process run's rendezvous: not one derived
    from the pid, which another test session running at the same time on the machine (another venv's, another
    checkout's) could derive too."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rows(n=8):
    """The first ``n`` of :data:`PROMPTS` as dataset rows, each with its index as ``answer``."""
    return [{"prompt": p, "answer": str(i)} for i, p in enumerate(PROMPTS[:n])]


def digit_reward(completions, **kwargs):
    """The share of digit characters in each completion (a plain string): dense, so a tiny model learns it fast."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def digit_length_reward(completions, **kwargs):
    """:func:`digit_reward` plus 0.01 per character, so that the completions of a group (almost) never tie."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) + 0.01 * len(c) for c in completions]


def tiny_config(tmp_path, **kw) -> GTPOConfig:
    """Two steps of 2 prompts x 4 completions of at most 6 tokens into ``tmp_path/run``, at a constant learning rate
    of 1e-2, seed 0, with no checkpoints, no completion logs and no progress bar; ``kw`` overrides any field."""
    base = dict(output_dir=str(tmp_path / "run"), group_size=4, prompts_per_step=2, max_steps=2,
                max_completion_length=6, learning_rate=1e-2, save_steps=0, log_completions_steps=0,
                disable_tqdm=True, seed=0, lr_scheduler_type="constant")
    base.update(kw)
    return GTPOConfig(**base)


def metrics_lines(out):
    """The lines of ``out/metrics.jsonl``, one dict a step."""
    with open(os.path.join(out, "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh]


def write_cli_inputs(tmp_path, model, **fields):
    """A ``gtpo train`` YAML (returned: its path) for one step of ``model`` on four of :data:`PROMPTS` with
    tests/scripts/fault_rewards.py's digit reward, into ``tmp_path/out``; ``fields`` override the YAML's keys."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": p, "answer": "1"}) + "\n" for p in PROMPTS[:4]))
    spec = {"model": model, "dataset": {"name": str(data), "template": "plain"},
            "reward_funcs": [os.path.join(HERE, "scripts", "fault_rewards.py") + ":digit_reward"],
            "output_dir": str(tmp_path / "out"), "group_size": 4, "prompts_per_step": 2, "max_steps": 1,
            "max_completion_length": 4, "save_steps": 0, "disable_tqdm": True, "entropy_filter": False,
            "log_completions_steps": 1}
    spec.update(fields)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)
