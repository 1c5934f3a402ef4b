"""Journeys as users take them (issue 30, item 1): every file under configs/ and every command in README.md is
executed by a test, with a tiny local model and data swapped in and a step or two instead of a run.

The README is parsed, not copied: its ```yaml blocks are written to the files they name, its ```bash commands
and the commands in its inline code are run in order in one working directory (`gtpo ...` through
``gtpo.cli.main``, with the sizes swapped for tiny ones), its ```python block is executed. A command this module
does not know fails the test, so a README edit that adds a command must add its journey here. Commands that cannot
run inside the suite are checked to be what another test or CI runs (named in :data:`RUN_ELSEWHERE`)."""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import sys

import pytest
import yaml

from gtpo.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
README_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
TINY_RUN = ["--max_steps", "1", "--max_completion_length", "6", "--group_size", "4", "--prompts_per_step", "2",
            "--save_steps", "0"]
#: what the paper recipes need that a CPU test swaps: the model and data (hub downloads), the sizes
PAPER_SWAPS = ["--dataset.name", "data/train.jsonl", "--eval_dataset.name", "data/test.jsonl", "--eval_dataset.size",
               "4", "--max_steps", "1", "--max_completion_length", "6", "--max_prompt_length", "256", "--group_size",
               "4", "--micro_batch_size", "4", "--peft.r", "4", "--peft.lora_alpha", "4"]
#: README commands run outside this module, and where
RUN_ELSEWHERE = {
    "bash scripts/test.sh": ".ci/run (CI runs exactly this)",
    "accelerate launch --multi_gpu --num_processes 8 -m gtpo.cli train my.yaml":
        "tests/test_ddp.py::test_readme_accelerate_command (the same launch on two CPU processes)",
}
#: inline code that names a program without being a command
NOT_COMMANDS = {"gtpo eval", "gtpo report", "gtpo sft", "gtpo"}  # "gtpo": the loss name


def readme_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block, in order."""
    return re.findall(r"```(\w*)\n(.*?)```", text, flags=re.DOTALL)


def readme_commands(text: str) -> list[str]:
    """The commands of the README in order: each line of a ```bash block (comments stripped), then the inline code
    spans that are commands (``gtpo ...``, ``accelerate launch ...``, ``bash ...``)."""
    out = []
    for lang, body in readme_blocks(text):
        if lang == "bash":
            out += [line.split("#")[0].strip() for line in body.splitlines() if line.split("#")[0].strip()]
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    for span in re.findall(r"`([^`\n]+)`", prose):
        if re.match(r"(gtpo( |$)|accelerate launch |bash )", span) and span not in NOT_COMMANDS:
            out.append(span)
    return out


def write_data(cwd, n=8):
    os.makedirs(cwd / "data", exist_ok=True)
    for name, rows in (("train", range(n)), ("test", range(100, 104))):
        with open(cwd / "data" / f"{name}.jsonl", "w") as fh:
            fh.writelines(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n" for i in rows)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_model_path):
    """A user's working directory: the README's YAML files (the model swapped), data files, configs/ and scripts/."""
    cwd = tmp_path_factory.mktemp("journey")
    write_data(cwd)
    for lang, body in readme_blocks(open(README, encoding="utf-8").read()):
        first = body.splitlines()[0] if body.strip() else ""
        if lang == "yaml" and re.match(r"# [\w.-]+\.yaml$", first):
            (cwd / first[2:]).write_text(body.replace(README_MODEL, tiny_model_path))
    for name in ("configs", "scripts"):
        os.symlink(os.path.join(ROOT, name), cwd / name)
    from test_trl_yaml import trl_yaml  # the TRL user's file of tests/test_trl_yaml.py

    trl = trl_yaml(cwd / "trl", tiny_model_path)
    (cwd / "grpo.yaml").write_text(trl.read_text())
    return cwd


_DEMO_RUNS = iter(range(1000))


def run_gtpo(args: list[str], tiny_model_path: str, capsys, *, output_dir: str | None = None) -> str:
    """One ``gtpo`` command of the README with the tiny swaps; returns its stdout (asserts exit 0)."""
    command, rest = args[0], args[1:]
    if command == "train":
        if "--help" in rest:
            pass
        elif not rest or rest[0].startswith("--demo"):  # the offline default run, on the tiny model
            rest = ["--demo", *[a for a in rest if a != "--demo"]]
            if "--print_config" not in rest:  # each in a directory of its own (the README runs it several times)
                rest += ["--model", tiny_model_path, "--dataset.size", "8", "--eval_dataset.size", "4", "--peft.r",
                         "2", "--output_dir", f"runs/default-{next(_DEMO_RUNS)}"] + TINY_RUN
        elif rest[0].startswith("configs/paper/"):
            rest += ["--model", tiny_model_path, "--output_dir",
                     output_dir or f"runs/readme-{os.path.basename(rest[0])[:-5]}"] + PAPER_SWAPS
        elif rest[:2] == ["--config", "grpo.yaml"]:
            pass  # TRL's own file, already tiny (tests/test_trl_yaml.py)
        else:
            rest += TINY_RUN
    elif command == "eval":
        rest = [tiny_model_path if a == README_MODEL else a for a in rest] + ["--max-new-tokens", "8"]
    code = main([command, *rest])
    out = capsys.readouterr().out
    assert code == 0, (args, out[-2000:])
    return out


def test_readme_is_short_and_keeps_its_two_setup_commands():
    text = open(README, encoding="utf-8").read()
    assert len(text.splitlines()) <= 200
    commands = readme_commands(text)
    assert commands[:2] == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    for section in ("One GPU", "TRL engine", "vLLM", "GTPO on verl", "Performance", "Results"):
        assert f"\n## {section}\n" in text, section


def test_every_readme_command_runs(workdir, tiny_model_path, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    monkeypatch.syspath_prepend(str(workdir / "trl"))  # the dotted reward path of TRL's file (`trl grpo` imports it
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)  # from the file's directory, the cwd there)
    text = open(README, encoding="utf-8").read()
    done = []
    for command in readme_commands(text):
        if command in RUN_ELSEWHERE:
            where = RUN_ELSEWHERE[command]
            path, _, name = where.split(" ")[0].partition("::")
            source = open(os.path.join(ROOT, path)).read()
            assert (name and f"def {name}(" in source) or (not name and command in source), (command, where)
            done.append(command)
            continue
        args = shlex.split(command)
        if args == ["bash", "scripts/demo.sh"]:
            # the script installs (scripts/install.sh, which CI runs for the tests) and then trains this command:
            script = open(os.path.join(ROOT, "scripts", "demo.sh")).read().strip().splitlines()
            assert script[-1] == 'gtpo train --demo "$@"', script[-1]
            out = run_gtpo(["train", "--demo"], tiny_model_path, capsys)
            assert "greedy accuracy before training" in out and "greedy accuracy after training" in out
        elif args[0] == "gtpo":
            out = run_gtpo(args[1:], tiny_model_path, capsys)
            if "--print_config" in args:
                assert yaml.safe_load(out)["model"] == "smollm2-135m-instruct"
            if "--help" in args:
                assert "[P] the GTPO paper" in out and "--group_size INT" in out
        else:
            pytest.fail(f"README command without a journey in tests/test_journeys.py: {command!r}")
        done.append(command)
    # what the commands left: the runs, the comparison report, the evaluation
    for run in ("runs/mine", "runs/gtpo", "runs/grpo", "runs/trl", "runs/default-0", "trl/out"):
        assert os.path.isfile(os.path.join(run, "summary.json")), run
    assert os.path.isfile("runs/compare/report.md") and os.path.isfile("runs/mine/report/report.md")
    from gtpo import GTPOConfig

    grpo = json.load(open("runs/grpo/run_config.json"))  # the README's comparison trains pure GRPO
    grpo = GTPOConfig.from_dict({k: v for k, v in grpo.items() if k in GTPOConfig.field_names()})
    assert grpo.loss_type == "grpo" and grpo.gtpo_switches_on() == [] and grpo.resolved_gamma == 0.0
    assert not grpo.resolved_entropy_filter and not grpo.resolved_conflict_masks
    assert len(done) >= 12


def test_the_readme_python_runs(workdir, tiny_model_path, monkeypatch):
    monkeypatch.chdir(workdir)
    (code,) = [body for lang, body in readme_blocks(open(README, encoding="utf-8").read()) if lang == "python"]
    code = code.replace(README_MODEL, tiny_model_path).replace("max_steps=200", "max_steps=1, max_completion_length=6")
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    assert os.path.isfile(workdir / "runs" / "py" / "metrics.jsonl")


def test_every_file_under_configs_has_a_journey():
    """Each config is run here (the paper recipes) or by the test that names it."""
    covered = {
        "configs/accelerate/cpu_ddp_2proc.yaml": "tests/test_ddp.py",
        "configs/agents/calculator.yaml": "tests/test_tools.py",
        "configs/agents/calculator_tools.py": "tests/test_tools.py",
        "configs/accelerate/deepspeed_zero3.yaml": "tests/test_dtype_device.py",
        "configs/verl/qwen2.5-3b-gsm8k-gtpo.yaml": "tests/verl/test_verl_configs.py",
        "configs/verl/qwen2.5-3b-gsm8k-grpo.yaml": "tests/verl/test_verl_configs.py",
    }
    files = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "configs", "**", "*.*"),
                                                                recursive=True)
                   if "__pycache__" not in p.split(os.sep))  # Python's bytecode of configs/agents/*.py, not a config
    for path in files:
        if path.startswith("configs/paper/"):
            assert path in PAPER_CONFIGS
            continue
        assert path in covered, f"{path} is run by no test: add it here with the test that runs it"
        source = open(os.path.join(ROOT, covered[path])).read()
        assert os.path.basename(path) in source or os.path.dirname(path).split("/")[-1] in source, (path, covered[path])


PAPER_CONFIGS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "configs", "paper", "*.yaml")))


@pytest.mark.parametrize("path", PAPER_CONFIGS)
def test_paper_config_trains_a_step(workdir, tiny_model_path, capsys, monkeypatch, path):
    """Every field of the recipe is accepted and acts (4-bit base, LoRA r, tensorboard, the optimizer); only the
    model, the data and the sizes are swapped."""
    from gtpo import GTPOConfig

    monkeypatch.chdir(workdir)
    spec = yaml.safe_load(open(os.path.join(ROOT, path)))
    out = workdir / "runs" / os.path.basename(path)[:-5]
    run_gtpo(["train", path], tiny_model_path, capsys, output_dir=str(out))
    config = json.load(open(out / "run_config.json"))
    swapped = ("output_dir", "max_steps", "max_completion_length", "max_prompt_length", "group_size",
               "micro_batch_size", "model_init_kwargs")
    for key, value in spec.items():  # every config field of the file reached the run as written
        if key in GTPOConfig.field_names() and key not in swapped:
            want = [value] if key == "report_to" and isinstance(value, str) else value
            assert config[key] == pytest.approx(want) if isinstance(want, float) else config[key] == want, key
    assert config["model_init_kwargs"]["quantization_config"]["load_in_4bit"] is True
    assert glob.glob(str(out / "*" / "events.out.tfevents.*")), "report_to tensorboard wrote nothing"
    line = json.loads(open(out / "metrics.jsonl").readline())
    assert line["step"] == 1 and "reward" in line and "rewards/paper_reward/mean" in line
    assert os.path.isfile(out / "adapter_model.safetensors")


if __name__ == "__main__":  # print the README's commands as the journeys see them
    print("\n".join(readme_commands(open(README, encoding="utf-8").read())), file=sys.stderr)
