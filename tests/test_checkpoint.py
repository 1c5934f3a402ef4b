"""Checkpoints and the run directory: an attempt that completed no step is not a run; a finished run is never
resumed over its final model; the checkpoint state file does not take Hugging Face's trainer_state.json name;
checkpoint files load with ``torch.load(weights_only=True)`` and a pickled object in one is refused."""

import hashlib
import json
import os

import pytest
import torch

from gtpo import GTPOTrainer
from gtpo.errors import RewardFunctionError
from gtpo.run.checkpoint import LEGACY_STATE_FILE, STATE_FILE, completed_a_step, list_checkpoints
from helpers import digit_reward, rows, tiny_config

ROWS = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]


digits = digit_reward


def broken(completions, **kwargs):
    raise KeyError("solution")


def config(tmp_path, **kw):
    return tiny_config(tmp_path, **{"save_steps": 1, "entropy_filter": False, **kw})


def digest(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def test_an_attempt_that_completed_no_step_is_rerun_without_overwrite(tiny_model_path, tmp_path):
    cfg = config(tmp_path)
    with pytest.raises(RewardFunctionError, match="reward function 'broken' raised KeyError"):
        GTPOTrainer(tiny_model_path, [broken], ROWS, args=cfg).train()
    left = sorted(os.listdir(cfg.output_dir))
    assert "run_config.json" in left and not completed_a_step(cfg.output_dir)
    trainer = GTPOTrainer(tiny_model_path, [digits], ROWS, args=cfg)  # no overwrite_output_dir
    trainer.train()
    assert trainer.global_step == 2
    with open(os.path.join(cfg.output_dir, "run_config.json")) as fh:
        assert json.load(fh)["reward_funcs"] == ["digit_reward"]


def test_a_run_that_completed_a_step_is_still_refused(tiny_model_path, tmp_path):
    cfg = config(tmp_path, max_steps=1, save_steps=0)
    GTPOTrainer(tiny_model_path, [digits], ROWS, args=cfg).train()
    for name in ("model.safetensors", "config.json"):  # no final model, no checkpoint: only metrics of step 1
        os.remove(os.path.join(cfg.output_dir, name))
    assert completed_a_step(cfg.output_dir)
    with pytest.raises(ValueError, match=r"already holds a run \(.*metrics.jsonl"):
        GTPOTrainer(tiny_model_path, [digits], ROWS, args=cfg).train()


def test_resuming_a_finished_run_is_refused_and_its_final_model_kept(tiny_model_path, tmp_path):
    cfg = config(tmp_path)
    GTPOTrainer(tiny_model_path, [digits], ROWS, args=cfg).train()
    final = os.path.join(cfg.output_dir, "model.safetensors")
    before = digest(final)
    newest = os.path.join(cfg.output_dir, "checkpoint-2")
    more = GTPOTrainer(tiny_model_path, [digits], ROWS, args=cfg.replace(max_steps=3, learning_rate=5e-2))
    with pytest.raises(ValueError, match=rf"holds a finished run \(its final model: .*config.json\); resuming would "
                                         rf"train it again from a checkpoint and replace that model\. To train it "
                                         rf"further, resume into a new output_dir from its checkpoint: --output_dir "
                                         rf"<new dir> --resume_from_checkpoint {newest}"):
        more.train(resume_from_checkpoint=True)
    assert digest(final) == before and [s for s, _ in list_checkpoints(cfg.output_dir)] == [1, 2]
    # what the message says works: the finished run continues in a new directory, the old one is untouched
    elsewhere = str(tmp_path / "more")
    more = GTPOTrainer(tiny_model_path, [digits], ROWS, args=cfg.replace(max_steps=3, output_dir=elsewhere))
    more.train(resume_from_checkpoint=newest)
    assert more.global_step == 3 and os.path.isfile(os.path.join(elsewhere, "model.safetensors"))
    with open(os.path.join(elsewhere, "metrics.jsonl")) as fh:
        assert [json.loads(line)["step"] for line in fh] == [3]
    assert digest(final) == before
    # an explicit overwrite replaces it
    again = GTPOTrainer(tiny_model_path, [digits], ROWS,
                        args=cfg.replace(max_steps=3, overwrite_output_dir=True))
    again.train(resume_from_checkpoint=True)
    assert again.global_step == 3 and digest(final) != before


def test_state_file_is_gtpos_own_and_older_checkpoints_still_resume(tiny_model_path, tmp_path):
    cfg = config(tmp_path, max_steps=1)
    GTPOTrainer(tiny_model_path, [digits], ROWS, args=cfg).train()
    ckpt = os.path.join(cfg.output_dir, "checkpoint-1")
    assert STATE_FILE == "gtpo_trainer_state.json"
    assert os.path.isfile(os.path.join(ckpt, STATE_FILE)) and not os.path.exists(os.path.join(ckpt, LEGACY_STATE_FILE))
    # a checkpoint written before the rename resumes (into a new directory: this run is finished)
    os.rename(os.path.join(ckpt, STATE_FILE), os.path.join(ckpt, LEGACY_STATE_FILE))
    assert [s for s, _ in list_checkpoints(cfg.output_dir)] == [1]
    trainer = GTPOTrainer(tiny_model_path, [digits], ROWS,
                          args=cfg.replace(max_steps=2, output_dir=str(tmp_path / "next")))
    trainer.train(resume_from_checkpoint=ckpt)
    assert trainer.global_step == 2
    # Hugging Face's TrainerState (TRL's engine) under that name is not gtpo's: the message names the engine
    with open(os.path.join(ckpt, LEGACY_STATE_FILE), "w") as fh:
        json.dump({"global_step": 1, "log_history": [], "max_steps": 2}, fh)
    assert list_checkpoints(cfg.output_dir) == []
    with pytest.raises(ValueError, match=r"is a checkpoint of TRL's engine \(Hugging Face's trainer_state.json\), not "
                                         r"of gtpo's trainer: resume it with the same engine \(engine: trl"):
        GTPOTrainer(tiny_model_path, [digits], ROWS,
                    args=cfg.replace(output_dir=str(tmp_path / "third"))).train(resume_from_checkpoint=ckpt)


def test_resuming_a_finished_run_on_trls_engine_is_refused_too(tiny_model_path, tmp_path, capsys):
    pytest.importorskip("trl")
    import yaml

    from gtpo.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in
                            [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)]))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"model": tiny_model_path, "dataset": str(data), "reward_funcs": ["format"],
                                   "engine": "trl", "output_dir": str(tmp_path / "out"), "group_size": 4,
                                   "prompts_per_step": 1, "max_steps": 1, "max_completion_length": 4, "save_steps": 1,
                                   "entropy_filter": False}))
    assert main(["train", str(cfg)]) == 0
    final = tmp_path / "out" / "model.safetensors"
    before = digest(final)
    assert main(["train", str(cfg), "--resume_from_checkpoint", "true", "--max_steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "holds a finished run" in err and f"--resume_from_checkpoint {tmp_path / 'out' / 'checkpoint-1'}" in err
    assert digest(final) == before


class Payload:
    """A pickled object that is not data (unpickling it would import and construct this class)."""


def test_checkpoint_files_load_with_weights_only_and_a_pickled_object_is_refused(tiny_model_path, tmp_path):
    cfg = config(tmp_path, max_steps=2, save_steps=1, entropy_filter=False)
    GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg).train()
    ckpt = os.path.join(cfg.output_dir, "checkpoint-2")
    # what gtpo writes loads with weights_only=True (optimizer, scheduler, RNG incl. numpy's state)
    for name in ("optimizer.pt", "scheduler.pt"):
        assert torch.load(os.path.join(ckpt, name), weights_only=True)
    from gtpo.run.checkpoint import load_torch_file

    state = load_torch_file(os.path.join(ckpt, "rng_state_0.pth"))  # numpy arrays allowed, nothing else
    assert set(state) >= {"python", "numpy", "torch"}
    # a checkpoint whose optimizer file holds a pickled object is refused, naming the file
    torch.save({"state": {}, "param_groups": [], "extra": Payload()}, os.path.join(ckpt, "optimizer.pt"))
    trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(),  # the run is finished: continued in a new directory
                          args=cfg.replace(max_steps=3, output_dir=str(tmp_path / "more")))
    with pytest.raises(ValueError, match=r"optimizer\.pt holds pickled Python objects .*Payload.*weights_only=True"):
        trainer.train(resume_from_checkpoint=ckpt)
