"""The README's benchmark commands run as a user runs them (issue 33: results in the README with the command
that produced them): every ``python bench/...`` span of the README, in a fresh process, with the batch and the
step counts shrunk so it finishes in CI. Tests never assert on time: ``--check`` (a timing goal) is left out,
and what is asserted is that the command ran to its summary line."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

#: the smallest run of each benchmark the README shows (appended: argparse keeps the last value of an option), on one
#: torch thread as every test process (scripts/test.sh): a second thread beside the other test worker stalls
#: (measured, trainer_vs_trl's SmolLM2 run alone: 64 s wall on 2 threads, 35 s on 1; 221 s on 2 beside a worker)
QUICK = {
    "trainer_vs_trl.py": ["--steps", "1", "--warmup", "0", "--prompts", "1", "--group", "2", "--length", "4",
                          "--memory-steps", "0", "--threads", "1"],
    "gtpo_overhead.py": ["--steps", "1", "--warmup", "0", "--replays", "1", "--prompts", "1", "--group", "2",
                         "--length", "4", "--threads", "1"],
    "default_dtype.py": ["--steps", "1", "--warmup", "0", "--max-completion-length", "4", "--prompts", "1", "--group",
                         "2", "--threads", "1"],
    "decode_loop.py": ["--settings", "tiny", "--rounds", "1", "--threads", "1"],
    "gpu_check.py": ["--cpu", "--quick"],  # a GPU's parts on toy sizes (the README quotes what a GPU measured)
}
#: what each prints at the end of a complete run
SUMMARY = {"trainer_vs_trl.py": r"step time ours/TRL, GTPO mode", "gtpo_overhead.py": r"GTPO overhead",
           "default_dtype.py": r"bfloat16 / float32 \(median of paired ratios\)",
           "decode_loop.py": r"loop-compiled / loop: \S+ \(median of paired wall ratios\)",
           "gpu_check.py": r"parts: .*passed"}


def readme_bench_commands() -> list[str]:
    """The README's inline ``python bench/<script>.py ...`` commands, in order."""
    text = open(README, encoding="utf-8").read()
    return [span for span in re.findall(r"`([^`\n]+)`", text) if span.startswith("python bench/")]


def test_the_readme_shows_each_benchmark_it_quotes():
    commands = readme_bench_commands()
    assert {c.split()[1] for c in commands} >= {"bench/trainer_vs_trl.py", "bench/default_dtype.py"}
    for c in commands:
        assert os.path.isfile(os.path.join(ROOT, c.split()[1])), c
        assert os.path.basename(c.split()[1]) in QUICK, f"no quick run for the README's command {c!r}"


@pytest.mark.parametrize("command", readme_bench_commands())
def test_readme_benchmark_command_runs(command):
    argv = [a for a in command.split()[1:] if a != "--check"]
    script = os.path.basename(argv[0])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, *argv, *QUICK[script]], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, (command, proc.stdout[-3000:], proc.stderr[-3000:])
    assert re.search(SUMMARY[script], proc.stdout), (command, proc.stdout[-3000:])
