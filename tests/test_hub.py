"""``push_to_hub`` and the ``hub_*`` options on gtpo's engine (gtpo.run.hub), as far as an offline machine allows:
huggingface_hub's ``HfApi.create_repo`` / ``upload_folder`` are replaced by recorders, and tiny ``gtpo train --config``
runs are checked for the calls transformers' Trainer would make (repository, privacy, folders and their files,
path_in_repo, commit messages), for what happens when an upload fails, for the refusal offline, and for the token
never reaching a file or the log. TRL's engine gets the same options unchanged (no TRL training here: it would need
the network)."""

import json
import logging
import os
import threading

import huggingface_hub
import pytest
import yaml

from gtpo import GTPOConfig, GTPOTrainer
from gtpo.cli import main
from gtpo.errors import ConfigValueError
from gtpo.run.checkpoint import list_checkpoints
from gtpo.run.hub import HubPusher
from helpers import digit_reward, rows, tiny_config, write_cli_inputs

TOKEN = "hf_secret_token_of_the_test_123"
MODEL = {"config.json", "model.safetensors", "generation_config.json", "tokenizer_config.json"}
LOGS = {"metrics.jsonl", "run_config.json"}
TRAINING_STATE = {"optimizer.pt", "scheduler.pt", "rng_state_0.pth", "gtpo_trainer_state.json"}


class Hub:
    """Records HfApi.create_repo / upload_folder calls (with the files each folder held when it was uploaded)."""

    def __init__(self, fail=None):
        self.repos, self.uploads, self.fail = [], [], fail or (lambda kwargs: False)

    def create_repo(self, api, repo_id, **kwargs):
        self.repos.append({"repo_id": repo_id, **kwargs})
        full = repo_id if "/" in repo_id else f"someone/{repo_id}"  # the Hub puts a bare name in your namespace
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{full}")

    def upload_folder(self, api, **kwargs):
        folder = kwargs["folder_path"]
        kwargs["files"] = {os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs}
        self.uploads.append(kwargs)
        if self.fail(kwargs):
            raise OSError("the Hub said no (test)")


@pytest.fixture
def hub(monkeypatch):
    recorder = Hub()
    monkeypatch.setattr(huggingface_hub, "is_offline_mode", lambda: False)  # this machine is offline: pretend not
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo",
                        lambda self, repo_id, **kw: recorder.create_repo(self, repo_id, **kw))
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", lambda self, **kw: recorder.upload_folder(self, **kw))
    return recorder


def run_yaml(tmp_path, model, **fields):
    base = dict(max_steps=2, save_steps=1, save_total_limit=1, push_to_hub=True, hub_token=TOKEN,
                hub_private_repo=True, hub_always_push=True, log_completions_steps=0)
    return write_cli_inputs(tmp_path, model, **{**base, **fields})


def all_bytes(out):
    for d, _, fs in os.walk(out):
        for f in fs:
            with open(os.path.join(d, f), "rb") as fh:
                yield os.path.join(d, f), fh.read()


@pytest.mark.parametrize("strategy", ["every_save", "checkpoint", "all_checkpoints", "end"])
def test_push_to_hub_makes_transformers_calls(tiny_model_path, tmp_path, hub, strategy, caplog, capsys):
    path = run_yaml(tmp_path, tiny_model_path, hub_strategy=strategy)
    with caplog.at_level(logging.DEBUG):
        assert main(["train", "--config", path]) == 0
    out = str(tmp_path / "out")
    # the repository: created once, named after output_dir, private, with the token
    assert hub.repos == [{"repo_id": "out", "token": TOKEN, "private": True, "exist_ok": True}]
    expected = []
    for step in (1, 2) if strategy != "end" else ():
        expected.append(("someone/out", None, f"Training in progress, step {step}"))
        if strategy in ("checkpoint", "all_checkpoints"):
            where = "last-checkpoint" if strategy == "checkpoint" else f"checkpoint-{step}"
            expected.append(("someone/out", where, f"Training in progress, step {step}, checkpoint"))
    expected.append(("someone/out", None, "End of training"))
    assert [(u["repo_id"], u.get("path_in_repo"), u["commit_message"]) for u in hub.uploads] == expected
    for u in hub.uploads:
        assert u["token"] == TOKEN and u.get("revision") is None
        if u["commit_message"] == "End of training":  # output_dir itself, without checkpoints and hidden files
            assert u["folder_path"] == out and {"checkpoint-*", ".*"} <= set(u["ignore_patterns"])
            assert MODEL | LOGS <= u["files"]
        elif u.get("path_in_repo") is None:  # the checkpoint's model and the logs, no training state
            assert MODEL | LOGS <= u["files"] and not TRAINING_STATE & u["files"], u["files"]
            assert u["folder_path"].startswith(os.path.join(out, ".tmp-checkpoint-upload-"))
        else:  # the whole checkpoint
            assert MODEL | TRAINING_STATE <= u["files"]
    # save_total_limit=1 removed checkpoint-1 during the run: its upload had its own links; no staging is left
    assert [s for s, _ in list_checkpoints(out)] == [2]
    assert not [n for n in os.listdir(out) if n.startswith(".tmp")]
    # the token is in no file of the run (run_config.json and the checkpoint's state say <HUB_TOKEN>), nor the log
    for name, data in all_bytes(out):
        assert TOKEN.encode() not in data, name
    with open(os.path.join(out, "run_config.json")) as fh:
        assert json.load(fh)["hub_token"] == "<HUB_TOKEN>"
    assert TOKEN not in caplog.text and TOKEN not in "".join(capsys.readouterr())


def test_hub_model_id_revision_and_epoch_messages(tiny_model_path, tmp_path, hub):
    path = run_yaml(tmp_path, tiny_model_path, max_steps=4, save_strategy="epoch", hub_model_id="org/name",
                    hub_private_repo=None, hub_revision="dev", hub_token=None)
    assert main(["train", "--config", path]) == 0
    assert hub.repos == [{"repo_id": "org/name", "token": None, "private": None, "exist_ok": True}]
    assert [(u["commit_message"], u["revision"]) for u in hub.uploads] == [
        ("Training in progress, epoch 1", "dev"), ("Training in progress, epoch 2", "dev"), ("End of training", "dev")]


def test_a_failed_upload_at_a_save_keeps_the_checkpoint_and_training_goes_on(tiny_model_path, tmp_path, hub, caplog):
    hub.fail = lambda kwargs: kwargs["commit_message"] == "Training in progress, step 1"
    path = run_yaml(tmp_path, tiny_model_path, save_total_limit=None)
    with caplog.at_level(logging.INFO, logger="gtpo"):
        assert main(["train", "--config", path]) == 0
    out = str(tmp_path / "out")
    assert [s for s, _ in list_checkpoints(out)] == [1, 2]  # saved locally first
    assert [u["commit_message"] for u in hub.uploads] == [
        "Training in progress, step 1", "Training in progress, step 2", "End of training"]
    failed = [r for r in caplog.records if r.levelno == logging.ERROR and "FAILED" in r.getMessage()]
    assert len(failed) == 1 and "checkpoint-1" in failed[0].getMessage()
    assert "the Hub said no" in failed[0].getMessage() and "training continues" in failed[0].getMessage()
    assert not [n for n in os.listdir(out) if n.startswith(".tmp")]


def test_a_failed_final_upload_is_an_error_naming_the_local_model(tiny_model_path, tmp_path, hub, capsys):
    hub.fail = lambda kwargs: kwargs["commit_message"] == "End of training"
    path = run_yaml(tmp_path, tiny_model_path, save_steps=0)
    assert main(["train", "--config", path]) == 1
    out = str(tmp_path / "out")
    err = capsys.readouterr().err
    assert f"push_to_hub: uploading the final model from {out} to the Hub repository someone/out failed: " \
           "OSError: the Hub said no (test). The model is saved locally" in err
    assert f"hf upload someone/out {out}" in err and TOKEN not in err
    assert os.path.isfile(os.path.join(out, "model.safetensors"))


def test_a_repository_that_cannot_be_created_stops_before_the_first_step(tiny_model_path, tmp_path, monkeypatch,
                                                                         hub, capsys):
    def refuse(self, repo_id, **kwargs):
        raise PermissionError("403 Forbidden: you cannot write to org")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", refuse)
    path = run_yaml(tmp_path, tiny_model_path, hub_model_id="org/name")
    assert main(["train", "--config", path]) == 1
    err = capsys.readouterr().err
    assert "push_to_hub: could not create or reach the Hub repository 'org/name' (PermissionError: 403 " in err
    assert not os.path.exists(tmp_path / "out" / "metrics.jsonl") or not open(tmp_path / "out" / "metrics.jsonl").read()
    assert hub.uploads == []


def test_a_push_is_skipped_while_the_previous_one_uploads_unless_hub_always_push(tmp_path, monkeypatch):
    release, started = threading.Event(), threading.Event()
    calls = []

    def slow_upload(self, **kwargs):
        calls.append(kwargs["commit_message"])
        started.set()
        release.wait(30)

    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", slow_upload)
    for always, expected in ((False, ["Training in progress, step 1"]),
                             (True, ["Training in progress, step 1", "Training in progress, step 2"])):
        calls.clear(), release.clear(), started.clear()
        out = tmp_path / f"always-{always}"
        for step in (1, 2):
            (out / f"checkpoint-{step}").mkdir(parents=True)
            (out / f"checkpoint-{step}" / "model.safetensors").write_text("weights")
        pusher = HubPusher(GTPOConfig(output_dir=str(out), push_to_hub=True, hub_always_push=always))
        pusher.repo_id = "someone/x"
        assert pusher.push_checkpoint(str(out / "checkpoint-1"), step=1)
        started.wait(30)
        assert pusher.push_checkpoint(str(out / "checkpoint-2"), step=2) is always
        release.set()
        pusher.wait()
        assert calls == expected


def test_push_to_hub_offline_is_refused_before_the_model_loads(tmp_path, capsys):
    assert huggingface_hub.is_offline_mode()  # HF_HUB_OFFLINE=1 in this environment
    path = write_cli_inputs(tmp_path, str(tmp_path / "no-such-model"), push_to_hub=True)
    assert main(["train", "--config", path]) == 2
    err = capsys.readouterr().err
    assert f"{path}: push_to_hub: true uploads the model to the Hugging Face Hub, but HF_HUB_OFFLINE is set" in err
    assert "no-such-model" not in err  # nothing was loaded
    assert main(["train", "--config", write_cli_inputs(tmp_path, "x"), "--push_to_hub", "true"]) == 2
    assert "--push_to_hub: push_to_hub: true" in capsys.readouterr().err
    with pytest.raises(ConfigValueError, match="HF_HUB_OFFLINE is set") as err:
        GTPOTrainer(str(tmp_path / "no-such-model"), [digit_reward], rows(4),
                    args=tiny_config(tmp_path, push_to_hub=True))
    assert err.value.field == "push_to_hub"


def test_the_hub_token_is_never_written_or_printed(tmp_path, capsys):
    config = GTPOConfig(hub_token=TOKEN)
    assert config.to_dict()["hub_token"] == "<HUB_TOKEN>" and config.hub_token == TOKEN
    assert GTPOConfig().to_dict()["hub_token"] is None
    path = write_cli_inputs(tmp_path, "some-model", hub_token=TOKEN)
    assert main(["train", "--config", path, "--print_config"]) == 0
    printed = capsys.readouterr().out
    assert TOKEN not in printed and yaml.safe_load(printed)["hub_token"] == "<HUB_TOKEN>"


def test_trl_engine_gets_the_checkpoint_and_hub_options_unchanged(tmp_path):
    pytest.importorskip("trl")
    from gtpo.integrations.trl import TRLGTPOConfig

    values = dict(save_strategy="epoch", save_only_model=True, save_total_limit=3, push_to_hub=True,
                  hub_model_id="org/name", hub_strategy="checkpoint", hub_token=TOKEN, hub_private_repo=True,
                  hub_revision="dev", hub_always_push=True)
    args = TRLGTPOConfig.from_gtpo_config(GTPOConfig(output_dir=str(tmp_path), **values), use_cpu=True)
    assert {name: getattr(args, name) for name in values} == values
    assert args.to_dict()["hub_token"] == "<HUB_TOKEN>"  # transformers hides it too
    steps = TRLGTPOConfig.from_gtpo_config(GTPOConfig(output_dir=str(tmp_path), save_steps=5, num_iterations=2),
                                           use_cpu=True)
    assert (steps.save_strategy, steps.save_steps) == ("steps", 10)  # TRL counts optimizer steps
    none = TRLGTPOConfig.from_gtpo_config(GTPOConfig(output_dir=str(tmp_path), save_steps=0), use_cpu=True)
    assert none.save_strategy == "no"  # gtpo's save_steps 0: no checkpoints


def test_the_printed_resume_command_hides_the_hub_token():
    from gtpo.app.training import resume_command

    for argv in (["run.yaml", "--hub_token", TOKEN, "--max_steps", "3"], ["run.yaml", f"--hub_token={TOKEN}",
                                                                           "--max_steps", "3"]):
        assert resume_command(argv, source="run.yaml", output_dir="out") == \
            "gtpo train run.yaml --hub_token '<HUB_TOKEN>' --max_steps 3 --resume_from_checkpoint true"
