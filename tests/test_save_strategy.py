"""TRL's checkpointing options on gtpo's engine, run as a user runs them (``gtpo train --config x.yaml``):
``save_strategy`` (no / steps / epoch; best refused before loading), ``save_total_limit`` with them, and
``save_only_model`` (checkpoints without optimizer, scheduler and RNG state, which a resume refuses)."""

import json
import os
import signal

import pytest
import yaml

from gtpo import GTPOConfig, GTPOTrainer
from gtpo.cli import main
from gtpo.run.checkpoint import STATE_FILE, list_checkpoints
from helpers import digit_reward, rows, tiny_config, write_cli_inputs

TRAINING_STATE = {"optimizer.pt", "scheduler.pt", "rng_state_0.pth"}


def steps_of(out):
    return [step for step, _ in list_checkpoints(out)]


def files(path):
    return set(os.listdir(path))


# write_cli_inputs: 4 prompts, prompts_per_step 2 -> an epoch is 2 steps
@pytest.mark.parametrize("fields, expected", [
    ({"save_strategy": "steps", "save_steps": 1, "save_total_limit": None}, [1, 2, 3]),
    ({"save_strategy": "steps", "save_steps": 2, "save_total_limit": None}, [2, 3]),  # and the last, as TRL
    ({"save_strategy": "steps", "save_steps": 1, "save_total_limit": 2}, [2, 3]),   # the limit still holds
    ({"save_strategy": "epoch", "save_steps": 1, "save_total_limit": None}, [2, 3]),  # save_steps is not read
    ({"save_strategy": "no", "save_steps": 1, "save_total_limit": None}, []),
], ids=["steps-1", "steps-2", "steps-limit-2", "epoch", "no"])
def test_save_strategy_decides_which_checkpoints_a_run_writes(tiny_model_path, tmp_path, fields, expected):
    path = write_cli_inputs(tmp_path, tiny_model_path, max_steps=3, log_completions_steps=0, **fields)
    assert main(["train", "--config", path]) == 0
    out = str(tmp_path / "out")
    assert steps_of(out) == expected
    assert {"config.json", "model.safetensors"} <= files(out)  # the final model, whatever the strategy
    with open(os.path.join(out, "run_config.json")) as fh:
        assert json.load(fh)["save_strategy"] == fields["save_strategy"]


def test_epoch_checkpoints_follow_the_epoch_length(tiny_model_path, tmp_path):
    """7 prompts, 2 a step: an epoch is 3 steps (an incomplete last batch makes no step, as in TRL); the last step
    is saved too."""
    cfg = tiny_config(tmp_path, max_steps=4, save_strategy="epoch", save_total_limit=None, entropy_filter=False)
    trainer = GTPOTrainer(tiny_model_path, [digit_reward], rows(7), args=cfg)
    assert trainer.steps_per_epoch == 3
    assert [s for s in range(1, 7) if trainer.saves_at(s)] == [3, 4, 6]  # 4: the last step
    trainer.train()
    assert steps_of(cfg.output_dir) == [3, 4]


def test_save_strategy_best_is_refused_before_the_model_loads(tmp_path, capsys):
    path = write_cli_inputs(tmp_path, str(tmp_path / "no-such-model"), save_strategy="best")
    assert main(["train", "--config", path]) == 2
    err = capsys.readouterr().err
    assert f"{path}: GTPOConfig.save_strategy='best' saves a checkpoint at each new best value of " \
           "metric_for_best_model" in err
    assert "engine: trl" in err and "no-such-model" not in err  # refused before anything looked at the model
    with pytest.raises(ValueError, match="save_strategy='best'"):
        GTPOTrainer(str(tmp_path / "no-such-model"), [digit_reward], rows(4),
                    args=GTPOConfig(save_strategy="best", output_dir=str(tmp_path / "run")))


def test_save_only_model_checkpoints_hold_the_model_and_refuse_a_resume(tiny_model_path, tmp_path, capsys):
    path = write_cli_inputs(tmp_path, tiny_model_path, max_steps=2, save_steps=1, save_only_model=True,
                            save_total_limit=None, log_completions_steps=0)
    assert main(["train", "--config", path]) == 0
    out = str(tmp_path / "out")
    assert steps_of(out) == [1, 2]
    for _step, ckpt in list_checkpoints(out):
        assert {"config.json", "model.safetensors", "tokenizer_config.json", STATE_FILE} <= files(ckpt)
        assert not TRAINING_STATE & files(ckpt), files(ckpt)
        with open(os.path.join(ckpt, STATE_FILE)) as fh:
            assert json.load(fh)["save_only_model"] is True
    ckpt1 = os.path.join(out, "checkpoint-1")
    # resuming from it: refused before the model loads, naming the checkpoint and save_only_model
    assert main(["train", "--config", path, "--output_dir", str(tmp_path / "more"), "--max_steps", "3",
                 "--resume_from_checkpoint", ckpt1]) == 2
    err = capsys.readouterr().err
    assert f"cannot resume from {ckpt1}: it was written with save_only_model: true, so it holds the model and " \
           "tokenizer but no optimizer, scheduler or RNG state" in err
    assert f"model: {ckpt1}" in err and not os.path.exists(tmp_path / "more")
    # the trainer refuses it too (resume_from_checkpoint=True picks the newest one)
    cfg = tiny_config(tmp_path, output_dir=out, max_steps=3, overwrite_output_dir=True)
    with pytest.raises(ValueError, match=r"cannot resume from .*checkpoint-2: it was written with save_only_model"):
        GTPOTrainer(tiny_model_path, [digit_reward], rows(4), args=cfg).train(resume_from_checkpoint=True)
    # what the message says works: a new run from its weights
    spec = yaml.safe_load(open(path))
    spec.update(model=ckpt1, output_dir=str(tmp_path / "from-weights"), save_steps=0)
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(spec))
    assert main(["train", "--config", str(again)]) == 0


def test_a_stop_checkpoint_is_complete_under_save_only_model(tiny_model_path, tmp_path):
    """SIGTERM during step 2 (after a model-only checkpoint-1): the stop checkpoint is a complete one, and resumes."""
    calls = []

    def reward_then_sigterm(completions, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return digit_reward(completions)

    cfg = tiny_config(tmp_path, max_steps=4, save_steps=1, save_only_model=True, save_total_limit=None,
                      entropy_filter=False)
    trainer = GTPOTrainer(tiny_model_path, [reward_then_sigterm], rows(4), args=cfg)
    trainer.train()
    assert trainer.stopped_by == "SIGTERM" and trainer.global_step == 2
    ckpt1, ckpt2 = (os.path.join(cfg.output_dir, f"checkpoint-{s}") for s in (1, 2))
    assert steps_of(cfg.output_dir) == [1, 2]
    assert not TRAINING_STATE & files(ckpt1) and TRAINING_STATE <= files(ckpt2)
    with open(os.path.join(ckpt2, STATE_FILE)) as fh:
        assert "save_only_model" not in json.load(fh)
    resumed = GTPOTrainer(tiny_model_path, [digit_reward], rows(4), args=cfg)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.global_step == 4


@pytest.mark.parametrize("fields", [{"save_strategy": "epoch"}, {"save_strategy": "steps", "save_steps": 2}],
                         ids=["epoch", "steps-2"])
def test_the_same_yaml_checkpoints_the_same_steps_on_both_engines(tiny_model_path, tmp_path, fields):
    """4 prompts, 2 a step: TRL's epoch is gtpo's (2 steps); both also write a checkpoint at the last step when it
    is not a save step (max_steps 5: transformers' rule)."""
    pytest.importorskip("trl")
    found = {}
    for engine in ("gtpo", "trl"):
        (tmp_path / engine).mkdir()
        path = write_cli_inputs(tmp_path / engine, tiny_model_path, max_steps=5, save_total_limit=None,
                                log_completions_steps=0, engine=engine, **fields)
        assert main(["train", "--config", path]) == 0
        out = tmp_path / engine / "out"
        found[engine] = sorted(int(n.split("-")[1]) for n in os.listdir(out) if n.startswith("checkpoint-"))
    assert found == {"gtpo": [2, 4, 5], "trl": [2, 4, 5]}
