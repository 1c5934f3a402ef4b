"""TRL's schedule, epoch, evaluation and logging options on gtpo's own engine (issue 41): ``num_train_epochs`` with
``max_steps`` -1, ``lr_scheduler_kwargs``, ``eval_strategy`` / ``eval_steps`` / ``per_device_eval_batch_size`` /
``eval_on_start``, ``logging_first_step`` and ``log_completions``, each run as a user runs it (``gtpo train --config
x.yaml``) and, where TRL's engine takes the same YAML, compared with what TRL does."""

from __future__ import annotations

import json
import logging
import math
import os

import pytest
import torch
import yaml

from gtpo import GTPOConfig
from gtpo.app.spec import split_spec
from gtpo.cli import main
from gtpo.errors import ConfigError
from gtpo.sampling.rollout import PromptSampler

HERE = os.path.dirname(os.path.abspath(__file__))
QUESTIONS = [f"What is {a} + {b}?" for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 1)]]


def write_yaml(tmp_path, model, n=5, **fields) -> str:
    """A ``gtpo train`` YAML: ``n`` distinct addition prompts, 2 prompts x 4 completions of 4 tokens a step, the digit
    reward, every step's 8 completions in completions.jsonl; ``fields`` override."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "1"}) + "\n" for q in QUESTIONS[:n]))
    spec = {"model": model, "dataset": {"name": str(data), "template": "plain"},
            "reward_funcs": [os.path.join(HERE, "scripts", "fault_rewards.py") + ":digit_reward"],
            "output_dir": str(tmp_path / "out"), "group_size": 4, "prompts_per_step": 2,
            "max_completion_length": 4, "save_steps": 0, "disable_tqdm": True, "entropy_filter": False,
            "log_completions_steps": 1, "num_completions_to_print": 8, "seed": 0, "learning_rate": 1e-3}
    spec.update(fields)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def lines(path) -> list[dict]:
    with open(path) as fh:
        return [json.loads(line) for line in fh]


def step_records(out) -> list[dict]:
    return [m for m in lines(os.path.join(out, "metrics.jsonl")) if "reward" in m]


# ----------------------------------------------------------------------------------------------- epochs
def test_prompt_sampler_drops_the_incomplete_tail_of_each_epoch():
    sampler = PromptSampler(7, seed=3, batch_size=3)
    batches = [sampler.next(3) for _ in range(6)]
    for epoch in range(3):  # 2 batches an epoch, 6 distinct rows: the 7th row of the permutation is dropped
        rows = batches[2 * epoch] + batches[2 * epoch + 1]
        assert len(set(rows)) == 6
        assert rows == torch.randperm(7, generator=torch.Generator().manual_seed(3 + epoch)).tolist()[:6]
    # the state is the old one ({epoch, position}): an old checkpoint's state loads, and continues the same way
    state = PromptSampler(7, seed=3, batch_size=3)
    state.load_state_dict({"epoch": 1, "position": 3})
    assert state.next(3) == batches[3]
    # without batch_size (max_steps > 0): the old behaviour, a batch continues into the next permutation
    old = PromptSampler(7, seed=3)
    first = torch.randperm(7, generator=torch.Generator().manual_seed(3)).tolist()
    second = torch.randperm(7, generator=torch.Generator().manual_seed(4)).tolist()
    assert [old.next(3) for _ in range(3)] == [first[:3], first[3:6], [first[6]] + second[:2]]
    with pytest.raises(ValueError, match="batch_size"):
        PromptSampler(2, seed=0, batch_size=3)


def test_num_train_epochs_in_python_and_yaml(caplog):
    config = GTPOConfig(max_steps=-1, num_train_epochs=1.5)
    assert config.total_steps(steps_per_epoch=2) == 3  # ceil(1.5 * 2), transformers' rule
    assert GTPOConfig(max_steps=7, num_train_epochs=1.5).total_steps(2) == 7
    assert "max_steps=7 decides" in caplog.text  # set in Python with max_steps set: a warning, max_steps decides
    with pytest.raises(ValueError, match=r"max_steps must be an integer >= 1, or -1"):
        GTPOConfig(max_steps=0)
    with pytest.raises(ValueError, match=r"num_train_epochs must be > 0"):
        GTPOConfig(max_steps=-1, num_train_epochs=0)
    # a YAML that sets num_train_epochs and not max_steps: TRL's default max_steps -1, the epochs count
    _, config = split_spec({"num_train_epochs": 2}, source="x.yaml")
    assert (config.max_steps, config.num_train_epochs) == (-1, 2.0)
    _, config = split_spec({"num_train_epochs": 2, "max_steps": 5}, source="x.yaml")
    assert config.max_steps == 5


def test_num_train_epochs_trains_each_prompt_once_per_epoch(tiny_model_path, tmp_path):
    """5 prompts, 2 a step: 2 steps an epoch (the 5th prompt of each epoch dropped, as TRL's RepeatSampler does);
    1.5 epochs = 3 steps; the linear schedule decays over those 3 steps (the scheduler got the resolved count)."""
    path = write_yaml(tmp_path, tiny_model_path, num_train_epochs=1.5, lr_scheduler_type="linear")
    assert main(["train", "--config", path]) == 0
    out = tmp_path / "out"
    records = step_records(out)
    assert [m["step"] for m in records] == [1, 2, 3]
    prompts: dict[int, list[str]] = {}
    for row in lines(out / "completions.jsonl"):
        prompts.setdefault(row["step"], []).append(row["prompt"])
    per_step = {step: sorted(set(p)) for step, p in prompts.items()}
    assert all(len(p) == 2 for p in per_step.values())
    epoch1 = per_step[1] + per_step[2]
    assert len(set(epoch1)) == 4  # each prompt at most once in the first epoch
    # the rows are the epochs' seeded permutations without their 5th row (the dataset keeps the file's order)
    first, second = (torch.randperm(5, generator=torch.Generator().manual_seed(seed)).tolist() for seed in (0, 1))
    asked = {step: sorted(QUESTIONS.index(p.removeprefix("Question: ").removesuffix("\nAnswer:")) for p in ps)
             for step, ps in per_step.items()}
    assert asked == {1: sorted(first[:2]), 2: sorted(first[2:4]), 3: sorted(second[:2])}
    # the schedule over 3 steps: transformers' own linear schedule with num_training_steps=3
    from transformers import get_scheduler

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    sched = get_scheduler("linear", opt, num_warmup_steps=0, num_training_steps=3)
    expected = []
    for _ in range(3):  # the rate each step used (as TRL logs it)
        expected.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert [m["learning_rate"] for m in records] == pytest.approx(expected, abs=1e-15)
    assert expected == pytest.approx([1e-3, 2e-3 / 3, 1e-3 / 3], abs=1e-15)  # decays over 3 steps, not max_steps 100
    run_config = json.loads((out / "run_config.json").read_text())
    assert (run_config["max_steps"], run_config["num_train_epochs"]) == (-1, 1.5)


def test_fewer_prompts_than_a_step_is_refused_with_epochs(tiny_model_path, tmp_path, capsys):
    path = write_yaml(tmp_path, tiny_model_path, n=1, num_train_epochs=1)
    assert main(["train", "--config", path]) != 0
    assert "fewer than one step's prompts_per_step" in capsys.readouterr().err


def test_trl_engine_gets_epochs_and_trains_as_many_steps(tiny_model_path, tmp_path):
    """The same YAML on TRL's engine: max_steps -1 and num_train_epochs go through, and TRL's Trainer trains the same
    number of optimizer steps as gtpo's engine (its RepeatSampler drops the incomplete batch too)."""
    pytest.importorskip("trl")
    from gtpo.integrations.trl import TRLGTPOConfig

    config = GTPOConfig(max_steps=-1, num_train_epochs=1.5, warmup_ratio=0.5, num_iterations=2)
    args = TRLGTPOConfig.from_gtpo_config(config, use_cpu=True)
    assert (args.max_steps, args.num_train_epochs, args.warmup_steps) == (-1, 1.5, 0.5)
    path = write_yaml(tmp_path, tiny_model_path, num_train_epochs=1.5, engine="trl", logging_steps=1)
    assert main(["train", "--config", path]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["steps"] == 3  # TRL's trainer.state.global_step, = gtpo's 3 above
    assert [m["step"] for m in step_records(tmp_path / "out")] == [1, 2, 3]


# ----------------------------------------------------------------------------------------------- lr_scheduler_kwargs
def transformers_rates(name: str, steps: int, warmup: int, kwargs: dict, lr: float) -> list[float]:
    """The learning rate after each of ``steps`` steps of transformers' own schedule, as TRL's Trainer builds it."""
    from transformers import get_scheduler

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=steps,
                          scheduler_specific_kwargs=kwargs)
    rates = []
    for _ in range(steps):  # the rate each step uses, then the schedule's step
        rates.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return rates


def test_lr_scheduler_kwargs_end_to_end(tiny_model_path, tmp_path):
    """cosine_with_min_lr with min_lr_rate 0.25 and 2 warm-up steps over 6 steps: the learning rates in metrics.jsonl
    are transformers' schedule's, and the floor is min_lr_rate x the peak (not 0, as plain cosine would end)."""
    kwargs = {"min_lr_rate": 0.25}
    path = write_yaml(tmp_path, tiny_model_path, n=4, max_steps=6, lr_scheduler_type="cosine_with_min_lr",
                      lr_scheduler_kwargs=kwargs, warmup_steps=2, log_completions_steps=0)
    assert main(["train", "--config", path]) == 0
    rates = [m["learning_rate"] for m in step_records(tmp_path / "out")]
    assert rates == pytest.approx(transformers_rates("cosine_with_min_lr", 6, 2, kwargs, 1e-3), abs=1e-15)
    # golden: after 2 warm-up steps a cosine from the peak to 0.25 x the peak over 4 steps (step 6: 3/4 of the way)
    assert rates[-1] == pytest.approx(1e-3 * (0.25 + 0.75 * 0.5 * (1 + math.cos(math.pi * 0.75))), abs=1e-15)
    assert rates != pytest.approx(transformers_rates("cosine", 6, 2, {}, 1e-3), abs=1e-9)  # the kwargs mattered


def test_lr_scheduler_types_are_transformers(tmp_path, capsys):
    from transformers import SchedulerType

    from gtpo.config.declarations import LR_SCHEDULER_TYPES, METRIC_LR_SCHEDULERS

    assert set(LR_SCHEDULER_TYPES) | set(METRIC_LR_SCHEDULERS) == {t.value for t in SchedulerType}
    for name in LR_SCHEDULER_TYPES:  # each builds with the keywords it needs
        extra = {"min_lr_rate": 0.1} if "min_lr" in name else {}
        GTPOConfig(lr_scheduler_type=name, lr_scheduler_kwargs=extra)
    with pytest.raises(ValueError, match=r"lr_scheduler_type must be one of .*'reduce_lr_on_plateau' and 'greedy' "
                                         r"step on an evaluation metric"):
        GTPOConfig(lr_scheduler_type="reduce_lr_on_plateau")
    with pytest.raises(ValueError, match=r"lr_scheduler_kwargs must be a mapping"):
        GTPOConfig(lr_scheduler_kwargs=["min_lr_rate", 0.1])
    # a keyword the schedule does not take: an error naming the YAML field before the model loads (no model here)
    path = write_yaml(tmp_path, str(tmp_path / "no-such-model"), max_steps=2, lr_scheduler_type="cosine",
                      lr_scheduler_kwargs={"min_lr_rate": 0.1})
    assert main(["train", "--config", path]) != 0
    err = capsys.readouterr().err
    assert "lr_scheduler_type='cosine' with lr_scheduler_kwargs={'min_lr_rate': 0.1} cannot be used" in err
    assert "run.yaml" in err and "no-such-model" not in err
    pytest.importorskip("trl")
    from gtpo.integrations.trl import TRLGTPOConfig

    args = TRLGTPOConfig.from_gtpo_config(GTPOConfig(lr_scheduler_type="cosine_with_min_lr",
                                                     lr_scheduler_kwargs={"min_lr_rate": 0.1}), use_cpu=True)
    assert (args.lr_scheduler_type, args.lr_scheduler_kwargs) == ("cosine_with_min_lr", {"min_lr_rate": 0.1})


# ----------------------------------------------------------------------------------------------- evaluation
def eval_yaml(tmp_path, model, **fields) -> str:
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "1"}) + "\n" for q in QUESTIONS[:2]))
    return write_yaml(tmp_path, model, eval_dataset={"name": str(data), "template": "plain"}, eval_max_new_tokens=2,
                      log_completions_steps=0, **fields)


@pytest.mark.parametrize("fields, evaluated", [
    (dict(eval_strategy="steps", eval_steps=2, max_steps=5), [2, 4, 5]),  # every eval_steps, and the last step
    (dict(eval_strategy="steps", logging_steps=3, max_steps=4), [3, 4]),  # eval_steps unset: logging_steps (TRL)
    (dict(eval_steps=2, max_steps=3), [2, 3]),  # a gtpo YAML: eval_steps alone turns it on
    (dict(eval_strategy="no", eval_steps=2, max_steps=3), []),
    (dict(eval_strategy="epoch", num_train_epochs=1.5), [2, 3]),  # 2 steps an epoch; the partial last epoch's end
    (dict(eval_strategy="epoch", max_steps=5, eval_on_start=True), [0, 2, 4, 5]),
])
def test_eval_strategy_end_to_end(tiny_model_path, tmp_path, fields, evaluated):
    path = eval_yaml(tmp_path, tiny_model_path, **fields)
    assert main(["train", "--config", path]) == 0
    records = lines(tmp_path / "out" / "metrics.jsonl")
    assert [m["step"] for m in records if "eval/accuracy_greedy" in m] == evaluated
    assert [m["step"] for m in records if "reward" in m] == list(range(1, records[-1]["step"] + 1))


def test_per_device_eval_batch_size_is_the_evaluation_batch(tiny_model_path, tmp_path, monkeypatch):
    from gtpo.config import resolved
    from gtpo.evaluation import api

    assert resolved(GTPOConfig(), "per_device_eval_batch_size") == 64
    assert resolved(GTPOConfig(generation_chunk_size=16), "per_device_eval_batch_size") == 16
    batches = []
    real = api.evaluate_during_training

    def spy(*args, **kwargs):
        batches.append(kwargs["batch_size"])
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "evaluate_during_training", spy)
    path = eval_yaml(tmp_path, tiny_model_path, eval_strategy="steps", eval_steps=1, max_steps=1,
                     per_device_eval_batch_size=3)
    assert main(["train", "--config", path]) == 0
    assert batches == [3]


def test_trl_yaml_test_split_is_the_eval_set_only_with_an_eval_strategy(tmp_path):
    base = {"model_name_or_path": "m", "dataset_name": "org/data", "dataset_test_split": "validation",
            "reward_funcs": ["accuracy_reward"], "eval_steps": 5}
    run, config = split_spec(dict(base), source="grpo.yaml")  # TRL's default eval_strategy 'no'
    assert run.eval_dataset is None and config.resolved_eval_strategy == "no"
    run, config = split_spec({**base, "eval_strategy": "epoch"}, source="grpo.yaml")
    assert run.eval_dataset == {"name": "org/data", "split": "validation"}
    assert (config.eval_strategy, config.resolved_eval_steps) == ("epoch", 5)
    with pytest.raises(ConfigError, match=r"eval_strategy must be None or one of \['no', 'steps', 'epoch'\]"):
        split_spec({**base, "eval_strategy": "best"}, source="grpo.yaml")
    pytest.importorskip("trl")
    from gtpo.integrations.trl import TRLGTPOConfig

    args = TRLGTPOConfig.from_gtpo_config(GTPOConfig(eval_strategy="epoch", per_device_eval_batch_size=16,
                                                     eval_on_start=True, num_iterations=2), use_cpu=True)
    assert (args.eval_strategy, args.per_device_eval_batch_size, args.eval_on_start) == ("epoch", 16, True)
    args = TRLGTPOConfig.from_gtpo_config(GTPOConfig(eval_strategy="steps", logging_steps=3, num_iterations=2),
                                          use_cpu=True)
    assert (args.eval_strategy, args.eval_steps) == ("steps", 6)  # logging_steps, in TRL's optimizer steps


# ----------------------------------------------------------------------------------------------- logging
def tensorboard_events(out):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (logdir,) = [os.path.join(out, d) for d in os.listdir(out) if os.path.isdir(os.path.join(out, d))
                 and any(f.startswith("events.") for f in os.listdir(os.path.join(out, d)))]
    return EventAccumulator(logdir, size_guidance={"tensors": 0, "scalars": 0}).Reload()


@pytest.mark.parametrize("first", [False, True])
def test_logging_first_step_and_log_completions_to_tensorboard(tiny_model_path, tmp_path, first):
    """logging_steps 2 over 3 steps: the trackers get steps 2 (and 1 with logging_first_step), each with the
    completions table of log_completions (num_completions_to_print rows); completions.jsonl is as before."""
    pytest.importorskip("tensorboard")
    path = write_yaml(tmp_path, tiny_model_path, n=4, max_steps=3, logging_steps=2, logging_first_step=first,
                      log_completions=True, num_completions_to_print=3, report_to="tensorboard", run_name="tb",
                      log_completions_steps=3)
    assert main(["train", "--config", path]) == 0
    out = tmp_path / "out"
    events = tensorboard_events(str(out))
    logged = [1, 2] if first else [2]
    assert [e.step for e in events.Scalars("reward")] == logged
    records = {m["step"]: m for m in step_records(out)}
    assert [e.value for e in events.Scalars("reward")] == pytest.approx([records[s]["reward"] for s in logged],
                                                                         rel=1e-6)
    texts = events.Tensors("completions/text_summary")
    assert [t.step for t in texts] == logged
    table = texts[-1].tensor_proto.string_val[0].decode()
    header, rule, *rows = table.splitlines()
    assert header == "| step | prompt | completion | digit_reward | reward | advantage |"
    assert len(rows) == 3 and all(row.startswith("| 2 | Question: ") for row in rows)
    assert [json.loads(line)["step"] for line in open(out / "completions.jsonl")] == [3, 3, 3]  # as before


def run_in_a_process(path, env):
    import subprocess
    import sys

    code = f"from gtpo.cli import main; raise SystemExit(main(['train', '--config', {path!r}]))"
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_log_completions_to_wandb_offline(tiny_model_path, tmp_path):
    pytest.importorskip("wandb")
    path = write_yaml(tmp_path, tiny_model_path, n=4, max_steps=2, logging_steps=1, log_completions=True,
                      num_completions_to_print=5, report_to="wandb", log_completions_steps=0)
    run_in_a_process(path, {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"})
    tables = sorted(glob_files(tmp_path / "wandb", "offline-run-*/files/media/table/completions_*.table.json"))
    assert len(tables) == 2  # one table a logging step
    contents = [json.loads(open(t).read()) for t in tables]
    steps = sorted(c["data"][0][0] for c in contents)
    assert steps == [1, 2]
    table = contents[0]
    assert table["columns"] == ["step", "prompt", "completion", "digit_reward", "reward", "advantage"]
    assert len(table["data"]) == 5
    assert all(row[3] == pytest.approx(row[4]) for row in table["data"])  # one reward of weight 1
    assert all(0 <= row[4] <= 1 for row in table["data"])  # digit shares
    # the advantages of a group are its rewards minus the group's mean (scale_rewards 'none' for gtpo)
    group = table["data"][:4]
    mean = sum(r[4] for r in group) / 4
    assert [r[5] for r in group] == pytest.approx([r[4] - mean for r in group], abs=1e-6)


def test_log_completions_to_trackio(tiny_model_path, tmp_path):
    pytest.importorskip("trackio")
    import sqlite3

    path = write_yaml(tmp_path, tiny_model_path, n=4, max_steps=1, log_completions=True, num_completions_to_print=2,
                      report_to="trackio", log_completions_steps=0)
    run_in_a_process(path, {"TRACKIO_DIR": str(tmp_path / "tio")})
    (db,) = glob_files(tmp_path / "tio", "*.db")
    blobs = [json.loads(b) for (b,) in sqlite3.connect(db).execute("select metrics from metrics").fetchall()]
    tables = [b["completions"] for b in blobs if "completions" in b]
    assert len(tables) == 1
    assert tables[0]["_type"] == "trackio.table"
    rows = tables[0]["_value"]
    assert len(rows) == 2 and all(r["step"] == 1 and r["prompt"].startswith("Question: ") for r in rows)
    assert list(rows[0]) == ["step", "prompt", "completion", "digit_reward", "reward", "advantage"]


def glob_files(root, pattern):
    import glob

    return glob.glob(os.path.join(str(root), pattern))


# ----------------------------------------------------------------------------------------------- TRL's engine
def test_trl_engine_carries_the_new_fields_unchanged():
    pytest.importorskip("trl")
    from gtpo.config import fields_where
    from gtpo.integrations.trl import TRLGTPOConfig

    values = dict(num_train_epochs=2.5, lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": 0.2},
                  eval_on_start=True, logging_first_step=True, log_completions=True, num_completions_to_print=None)
    assert set(values) - {"lr_scheduler_type"} <= set(fields_where("trl", "same"))
    args = TRLGTPOConfig.from_gtpo_config(GTPOConfig(max_steps=-1, **values), use_cpu=True)
    for name, value in values.items():
        assert getattr(args, name) == value, name
    assert args.max_steps == -1


@pytest.mark.parametrize("fields", [dict(eval_strategy="epoch", num_train_epochs=1.5),
                                    dict(eval_strategy="steps", eval_steps=2, max_steps=3)])
def test_both_engines_evaluate_at_the_same_steps(tiny_model_path, tmp_path, fields):
    """The same YAML on TRL's engine: its Trainer evaluates (eval_* logs) after the same steps as gtpo's engine."""
    pytest.importorskip("trl")
    steps = {}
    for engine in ("gtpo", "trl"):
        work = tmp_path / engine
        work.mkdir()
        path = eval_yaml(work, tiny_model_path, engine=engine, logging_steps=1, **fields)
        assert main(["train", "--config", path]) == 0
        records = lines(work / "out" / "metrics.jsonl")
        steps[engine] = [m["step"] for m in records if any(k.startswith("eval") for k in m)]
    assert steps["gtpo"] == steps["trl"] == [2, 3]


def test_an_epoch_run_resumes_exactly(tiny_model_path, tmp_path):
    """max_steps -1 over 1.5 epochs of 5 prompts: resumed from checkpoint-2 into a new directory, step 3 takes the
    same prompts (the sampler's epoch and position) at the same learning rate and ends at the same weights."""
    from safetensors.torch import load_file

    from gtpo import GTPOTrainer
    from helpers import digit_reward

    data = [{"prompt": q, "answer": "1"} for q in QUESTIONS]
    cfg = GTPOConfig(output_dir=str(tmp_path / "a"), group_size=4, prompts_per_step=2, max_steps=-1,
                     num_train_epochs=1.5, max_completion_length=4, learning_rate=1e-2, save_steps=1,
                     save_total_limit=None, log_completions_steps=0, disable_tqdm=True, seed=0, entropy_filter=False,
                     lr_scheduler_type="linear")
    full = GTPOTrainer(tiny_model_path, [digit_reward], data, args=cfg)
    full.train()
    assert full.global_step == 3
    rows_full = list(full.last_batch.rows)
    resumed = GTPOTrainer(tiny_model_path, [digit_reward], data, args=cfg.replace(output_dir=str(tmp_path / "b")))
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-2"))
    assert resumed.global_step == 3 and list(resumed.last_batch.rows) == rows_full
    last = {k: v for k, v in step_records(tmp_path / "a")[-1].items() if "time" not in k and not k.endswith("_s")}
    again = {k: v for k, v in step_records(tmp_path / "b")[-1].items() if "time" not in k and not k.endswith("_s")}
    assert again == last
    weights_a, weights_b = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("a", "b"))
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


@pytest.mark.parametrize("engine", ["gtpo", "trl"])
def test_a_trl_yaml_with_epochs_trains_as_many_steps_on_both_engines(tiny_model_path, tmp_path, monkeypatch, engine):
    """tests/test_trl_yaml.py's `trl grpo` YAML (8 prompts; TRL's batch: 4 completions x 2 accumulation steps = 2
    prompts of 4 a step, so 4 steps an epoch) with num_train_epochs 0.75 and no max_steps: 3 steps on each engine."""
    pytest.importorskip("trl")
    import sys

    from test_trl_yaml import trl_yaml

    spec = yaml.safe_load(trl_yaml(tmp_path, tiny_model_path).read_text())
    spec.pop("max_steps")
    spec.update(num_train_epochs=0.75, save_steps=0, lr_scheduler_type="linear")
    path = tmp_path / "epochs.yaml"
    path.write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    assert main(["train", "--config", str(path), "--engine", engine]) == 0
    records = step_records(tmp_path / "out")
    assert [m["step"] for m in records] == [1, 2, 3]
    # the same schedule logged the same way: the rate of each step, linear over the 3 steps
    assert [m["learning_rate"] for m in records] == pytest.approx([1e-5, 2e-5 / 3, 1e-5 / 3], rel=1e-6)
