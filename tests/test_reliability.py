"""Fault tolerance of training runs (issue 7): kills, stop signals, non-finite steps, full disks, bad input.

The kill / signal / real-write-failure scenarios run in one helper process
(``tests/scripts/fault_driver.py``, shared by every test of that group through a module fixture):
each training attempt is the real ``gtpo train`` command line in a forked child; after every fault
the run is resumed until it finishes, and the result must be *bitwise* the uninterrupted run's:
final weights, every metrics.jsonl line (timings aside) and completions.jsonl. The other tests run
in this process on tiny random models (CPU, offline).
"""

import errno
import json
import math
import os
import re
import stat
import subprocess
import sys

import pytest
import torch
import yaml

from gtpo import GTPOConfig, GTPOTrainer
from gtpo.checkpoint import atomic_write, commit, list_checkpoints, read_state, remove_checkpoint, rotate, write_json_atomic
from gtpo.errors import CheckpointError
from gtpo.app import split_spec
from gtpo.cli import main
from gtpo.errors import ConfigError
from gtpo.errors import RewardFunctionError, TrainingStopped

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "scripts", "fault_driver.py")
PROMPTS = [f"What is {a} + {b}?" for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 1), (2, 2), (4, 5), (6, 3)]]
TIMING_KEYS = {"step_time", "gtpo/generation_time", "gtpo/update_time", "gtpo/tokens_per_s"}


def digit_reward(completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def rows(n=8):
    return [{"prompt": p, "answer": str(i)} for i, p in enumerate(PROMPTS[:n])]


def config(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "run"), group_size=4, prompts_per_step=2, max_steps=2,
                max_completion_length=6, learning_rate=1e-2, save_steps=0, log_completions_steps=0,
                disable_tqdm=True, seed=0, lr_scheduler_type="constant", entropy_filter=False)
    base.update(kw)
    return GTPOConfig(**base)


def weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def optimizer_state(trainer):
    return {k: {n: (v.clone() if torch.is_tensor(v) else v) for n, v in s.items()}
            for k, s in trainer.optimizer.state_dict()["state"].items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def metrics_lines(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


# ============================================================================= kills and signals
def load_final_weights(out):
    from safetensors.torch import load_file

    return load_file(os.path.join(out, "model.safetensors"))


@pytest.fixture(scope="module")
def faults(tiny_model_path, tmp_path_factory):
    """Run every scenario of the fault driver once (about 40 short training attempts)."""
    if not hasattr(os, "fork"):
        pytest.skip("the fault driver forks its training attempts (POSIX only)")
    work = tmp_path_factory.mktemp("faults")
    result = work / "result.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, DRIVER, tiny_model_path, str(work), "all", str(result)],
                          env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(result.read_text())
    ref = data["scenarios"]["reference"]
    assert "error" not in ref and ref["attempts"][0]["exitcode"] == 0, ref
    data["reference_weights"] = load_final_weights(ref["out"])
    return data


def scenario(faults, name):
    s = faults["scenarios"][name]
    assert "error" not in s, s["error"]
    return s


def assert_same_run_as_reference(faults, s):
    """Final weights, every metric (timings aside) and every logged completion equal the reference's."""
    last = s["attempts"][-1]
    assert last["exitcode"] == 0, last["output"]
    ref_out = faults["scenarios"]["reference"]["out"]
    got = load_final_weights(s["out"])
    assert same(got, faults["reference_weights"]), "final weights differ from the uninterrupted run"
    ref_lines, lines = metrics_lines(ref_out), metrics_lines(s["out"])
    assert [m["step"] for m in lines] == list(range(1, faults["max_steps"] + 1))  # one line per step
    for m, r in zip(lines, ref_lines):
        assert {k: v for k, v in m.items() if k not in TIMING_KEYS} == \
               {k: v for k, v in r.items() if k not in TIMING_KEYS}, m["step"]
    assert open(os.path.join(s["out"], "completions.jsonl")).read() == \
           open(os.path.join(ref_out, "completions.jsonl")).read()
    # nothing temporary is left, and rotation kept the newest save_total_limit=2 checkpoints
    assert not [e for e in os.listdir(s["out"]) if e.startswith(".tmp")]
    assert [step for step, _ in list_checkpoints(s["out"])] == [6, 8]


def assert_only_complete_checkpoints(attempt):
    """After a fault, every checkpoint-<step> that resume could pick holds all its files."""
    assert attempt["incomplete_checkpoints"] == [], attempt["entries"]


def resumed_step(attempt):
    path = attempt["resumed_from"]
    return None if path is None else int(os.path.basename(path).split("-")[1])


@pytest.mark.slow
def test_reference_run_trains(faults, tiny_model_path):
    """The comparison is not vacuous: the uninterrupted run changed every weight, at every step."""
    from safetensors.torch import load_file

    init = load_file(os.path.join(tiny_model_path, "model.safetensors"))
    final = faults["reference_weights"]
    assert all(not torch.equal(init[k], final[k]) for k in init)
    losses = [m["loss"] for m in metrics_lines(faults["scenarios"]["reference"]["out"])]
    assert len(set(losses)) == len(losses)


KILL_POINTS = ["step_end@1", "step_end@3", "rollout@5", "metrics_append@5", "model_write@4", "optimizer_write@6",
               "state_write@4", "after_rename@6", "rotation@6", "final_save"]


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
def test_sigkill_then_resume_is_bitwise_identical(faults, point):
    assert point in faults["kill_points"]
    s = scenario(faults, f"kill:{point}")
    killed, *resumed = s["attempts"]
    assert killed["exitcode"] == -9, f"the kill point was never reached:\n{killed['output']}"
    assert_only_complete_checkpoints(killed)
    expected = faults["kill_points"][point]
    assert resumed[0]["resumed_from"] is None if expected == 0 else resumed_step(resumed[0]) == expected
    assert len(resumed) == 1
    assert_same_run_as_reference(faults, s)


@pytest.mark.slow
def test_three_kills_in_a_row(faults):
    s = scenario(faults, "chain")
    attempts = s["attempts"]
    assert [a["exitcode"] for a in attempts] == [-9, -9, -9, 0]
    assert [resumed_step(a) for a in attempts] == faults["chain_resumes"]
    for a in attempts[:-1]:
        assert_only_complete_checkpoints(a)
    assert_same_run_as_reference(faults, s)


@pytest.mark.slow
@pytest.mark.parametrize("name, signame", [("sigterm", "SIGTERM"), ("sigint", "SIGINT")])
def test_stop_signal_finishes_the_step_saves_and_says_how_to_resume(faults, name, signame):
    s = scenario(faults, name)
    stopped, resumed = s["attempts"]
    assert stopped["exitcode"] == 0, stopped["output"]
    assert stopped["complete_checkpoints"] == ["checkpoint-2", "checkpoint-3"]  # step 3 (the current one) saved
    ckpt3 = os.path.join(s["out"], "checkpoint-3")
    assert f"training stopped by {signame} after step 3 of 8; checkpoint: {ckpt3}" in stopped["output"]
    assert f"stopped by {signame} after step 3 of 8; checkpoint saved in {ckpt3}" in stopped["output"]  # the log
    # the printed command is the one that was run to resume, and it resumed from that checkpoint
    assert stopped["printed_resume_argv"][-2:] == ["--resume_from_checkpoint", "true"]
    assert resumed["argv"] == stopped["printed_resume_argv"]
    assert resumed_step(resumed) == 3
    assert_same_run_as_reference(faults, s)


@pytest.mark.slow
@pytest.mark.parametrize("name, exitcode", [("sigterm_twice", -15), ("sigint_twice", 130)])
def test_second_signal_stops_at_once_and_the_run_stays_resumable(faults, name, exitcode):
    """The second signal arrives while checkpoint-3 is being written: the process stops there."""
    s = scenario(faults, name)
    stopped, resumed = s["attempts"]
    assert stopped["exitcode"] == exitcode, stopped["output"]
    assert stopped["complete_checkpoints"] == ["checkpoint-2"]  # the half-written checkpoint-3 is not one
    assert ".tmp-checkpoint-3" in stopped["entries"]
    if name == "sigint_twice":
        assert "interrupted;" in stopped["output"] and "resumable from" in stopped["output"]
    assert resumed_step(resumed) == 2
    assert_same_run_as_reference(faults, s)


@pytest.mark.slow
def test_real_write_failure_keeps_the_previous_checkpoint(faults):
    """The kernel refuses the writes of checkpoint-4 (RLIMIT_FSIZE): exit 1 with a clear message."""
    s = scenario(faults, "write_failure")
    failed, resumed = s["attempts"]
    assert failed["exitcode"] == 1, failed["output"]
    out = s["out"]
    assert (f"gtpo train: error: file too large while writing checkpoint-4 in {out}; "
            f"the previous checkpoint checkpoint-2 is intact") in failed["output"]
    assert "Traceback" not in failed["output"]
    assert failed["complete_checkpoints"] == ["checkpoint-2"]
    assert not [e for e in failed["entries"] if e.startswith(".tmp")]  # the temporary directory is removed
    assert resumed_step(resumed) == 2
    assert_same_run_as_reference(faults, s)


@pytest.mark.slow
def test_control_resume_without_rng_state_differs(faults):
    """Sensitivity of the comparison: a resume that loses one piece of state (the RNG) is caught."""
    s = scenario(faults, "control_no_rng")
    assert s["attempts"][-1]["exitcode"] == 0
    assert "has no rng_state_0.pth" in s["attempts"][-1]["output"]
    assert not same(load_final_weights(s["out"]), faults["reference_weights"])


# ============================================================================= non-finite values
def nan_forward_at(trainer, steps, *, calls=None):
    """Make the policy's training forward (the one with gradients) return NaN at ``steps``.

    ``calls``: only these 1-based training forwards within the step (e.g. the second update of
    num_iterations=2). Generation and no-grad forwards are untouched.
    """
    count = {"step": None, "n": 0}

    def hook(_module, _inputs, output):
        if not torch.is_grad_enabled():
            return None
        step = trainer.global_step + 1
        if count["step"] != step:
            count.update(step=step, n=0)
        count["n"] += 1
        if step in steps and (calls is None or count["n"] in calls):
            logp, entropy = output
            return logp * float("nan"), entropy
        return None

    # the trainer's policy forward (PolicyForward: logp (N, T), entropy (N, T)), called once per
    # training forward; the decoder inside may run more than once (shared-prompt prefix, then the rest)
    return trainer.accelerator.unwrap_model(trainer.policy).register_forward_hook(hook)


def record_steps(trainer):
    """Weights and AdamW state after each step, keyed by the step number (0: before training)."""
    seen = {0: (weights(trainer.unwrapped_model), optimizer_state(trainer))}
    step = trainer.step

    def recording_step():
        out = step()
        seen[trainer.global_step] = (weights(trainer.unwrapped_model), optimizer_state(trainer))
        return out

    trainer.step = recording_step
    return seen


def test_nan_step_is_skipped_and_training_continues(tiny_model_path, tmp_path):
    cfg = config(tmp_path, max_steps=5, max_consecutive_skips=2)
    trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg)
    nan_forward_at(trainer, {3})
    seen = record_steps(trainer)
    trainer.train()
    lines = metrics_lines(cfg.output_dir)
    assert [m["gtpo/skipped_steps"] for m in lines] == [0, 0, 1, 1, 1]
    assert math.isnan(lines[2]["loss"]) and math.isnan(lines[2]["grad_norm"])
    assert all(math.isfinite(m["loss"]) for i, m in enumerate(lines) if i != 2)
    assert same(seen[3][0], seen[2][0]), "a skipped step changed the weights"
    assert all(same(seen[3][1][k], seen[2][1][k]) for k in seen[2][1]), "a skipped step changed the AdamW state"
    assert not same(seen[4][0], seen[3][0]) and not same(seen[2][0], seen[1][0])
    assert trainer.consecutive_skips == 0 and trainer.skipped_steps == 1


def test_consecutive_nan_steps_stop_with_the_last_good_checkpoint(tiny_model_path, tmp_path):
    cfg = config(tmp_path, max_steps=8, max_consecutive_skips=2, save_steps=1, save_total_limit=2)
    trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg)
    handle = nan_forward_at(trainer, set(range(3, 9)))
    seen = record_steps(trainer)
    with pytest.raises(TrainingStopped) as info:
        trainer.train()
    out = cfg.output_dir
    newest = os.path.join(out, "checkpoint-3")
    message = str(info.value)
    assert "steps 3-4 (2 in a row; max_consecutive_skips=2)" in message
    assert "last updated at step 2" in message and f"The newest complete checkpoint is {newest}" in message
    assert [s for s, _ in list_checkpoints(out)] == [2, 3]  # nothing saved after the stop
    assert [m["step"] for m in metrics_lines(out)] == [1, 2, 3, 4]  # the failing step is logged too
    # the newest checkpoint holds the finite weights of step 2 (step 3's update was never applied)
    from safetensors.torch import load_file

    saved = load_file(os.path.join(newest, "model.safetensors"))
    assert all(torch.isfinite(v).all() for v in saved.values())
    assert same({k: saved[k] for k in seen[2][0]}, seen[2][0])
    # ... and the run resumes from it once the cause is gone
    handle.remove()
    again = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg.replace(max_steps=4))
    again.train(resume_from_checkpoint=True)
    assert again.global_step == 4 and again.consecutive_skips == 0 and again.skipped_steps == 1


def test_nan_in_a_later_update_of_the_step(tiny_model_path, tmp_path):
    """num_iterations=2: a NaN in the second update skips that update only; the first one stands.

    The step counts as skipped (skipped_steps, and towards max_consecutive_skips); skipped_updates
    counts the updates that were not applied.
    """
    cfg = config(tmp_path, max_steps=3, num_iterations=2, max_consecutive_skips=2)
    trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg)
    nan_forward_at(trainer, {2}, calls={2})
    seen = record_steps(trainer)
    trainer.train()
    lines = metrics_lines(cfg.output_dir)
    assert [m["gtpo/skipped_steps"] for m in lines] == [0, 1, 1]
    assert [m["gtpo/skipped_updates"] for m in lines] == [0, 1, 1]
    adam_steps = [next(iter(seen[s][1].values()))["step"].item() for s in (1, 2, 3)]
    assert adam_steps == [2, 3, 5]  # 2 updates, then 1 (the second was skipped), then 2
    assert not same(seen[2][0], seen[1][0])
    assert trainer.consecutive_skips == 0


def test_huge_learning_rate_stops_the_cli_with_a_clear_error(tiny_model_path, tmp_path, capsys):
    """No injection: lr=1e30 gives NaN gradients from step 2 on; the CLI exits 1 naming the steps."""
    cfg = write_cli_inputs(tmp_path, tiny_model_path, learning_rate=1e30, max_steps=6, max_consecutive_skips=2,
                           save_steps=1)
    assert main(["train", cfg]) == 1
    err = capsys.readouterr().err
    assert "gtpo train: error: steps 2-3 (2 in a row; max_consecutive_skips=2) had a non-finite" in err
    assert "last updated at step 1" in err and "resume with: gtpo train" in err
    assert "Traceback" not in err


# ============================================================================= full disk
def enospc_on(monkeypatch, name, *, after=0):
    """``torch.save`` raises OSError(ENOSPC) when writing ``name`` after ``after`` successful writes of it."""
    real = torch.save
    count = {"n": 0}

    def save(obj, f, *args, **kwargs):
        if isinstance(f, str) and os.path.basename(f) == name:
            count["n"] += 1
            if count["n"] > after:
                with open(f, "wb") as fh:  # a part of the file made it to disk
                    fh.write(b"\0" * 100)
                raise OSError(errno.ENOSPC, "No space left on device", f)
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def test_disk_full_during_checkpoint_keeps_the_previous_one(tiny_model_path, tmp_path, monkeypatch):
    cfg = config(tmp_path, max_steps=4, save_steps=1)
    trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg)
    seen = record_steps(trainer)
    enospc_on(monkeypatch, "optimizer.pt", after=1)  # checkpoint-1 is written, checkpoint-2 is not
    with pytest.raises(CheckpointError) as info:
        trainer.train()
    out = cfg.output_dir
    assert str(info.value).startswith(
        f"no space left on device while writing checkpoint-2 in {out}; the previous checkpoint checkpoint-1 is intact")
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC
    assert sorted(os.listdir(out)) == ["checkpoint-1", "metrics.jsonl", "run_config.json"]  # no temporary dir
    assert read_state(os.path.join(out, "checkpoint-1"))["global_step"] == 1
    monkeypatch.undo()
    # the intact checkpoint loads: its weights are those after step 1
    again = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg.replace(max_steps=1))
    again.load_checkpoint(os.path.join(out, "checkpoint-1"))
    assert same(weights(again.unwrapped_model), seen[1][0])


def test_disk_full_while_saving_the_final_model_or_metrics(tiny_model_path, tmp_path, monkeypatch):
    import gtpo.checkpoint as checkpoint_module

    cfg = config(tmp_path, max_steps=1, save_steps=1)
    trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg)
    real = trainer.tokenizer.save_pretrained

    def save_pretrained(directory, *args, **kwargs):
        if directory.endswith(".tmp-final"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(directory, *args, **kwargs)

    monkeypatch.setattr(trainer.tokenizer, "save_pretrained", save_pretrained)
    with pytest.raises(CheckpointError, match=r"^no space left on device while writing the final model to .*"
                                              r"The newest complete checkpoint is .*checkpoint-1"):
        trainer.train()
    assert not os.path.exists(os.path.join(cfg.output_dir, ".tmp-final"))

    def append(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_module, "append_jsonl", append)
    trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg.replace(overwrite_output_dir=True))
    with pytest.raises(CheckpointError, match=r"^no space left on device while appending step 1 to .*metrics.jsonl"):
        trainer.train()


def test_commit_replaces_and_rotation_renames_before_deleting(tmp_path):
    """The file-level protocol: a checkpoint of the same step is replaced whole; deleting goes
    through a temporary name, so no half-deleted checkpoint-<step> ever exists."""
    out = tmp_path / "out"
    for step, text in [(1, "a"), (2, "b"), (2, "c"), (3, "d")]:
        tmp = out / f".tmp-checkpoint-{step}"
        tmp.mkdir(parents=True)
        (tmp / "w.txt").write_text(text)
        commit(str(tmp), str(out / f"checkpoint-{step}"), {"global_step": step})
    assert (out / "checkpoint-2" / "w.txt").read_text() == "c"
    rotate(str(out), 2)
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-3"]
    remove_checkpoint(str(out / "checkpoint-2"))
    assert sorted(os.listdir(out)) == ["checkpoint-3"]


def test_atomic_write_content_permissions_and_failure(tmp_path, monkeypatch):
    """checkpoint.atomic_write: the content, no temporary file left, the umask's permissions
    (0o644 under umask 022), and a failure during the write leaves the old file intact."""
    path = tmp_path / "out.json"
    umask = os.umask(0o022)
    try:
        atomic_write(str(path), "gr\u00fcn\n")
        assert path.read_bytes() == "gr\u00fcn\n".encode("utf-8")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
        atomic_write(path, b"\x00new")
        assert path.read_bytes() == b"\x00new"
        write_json_atomic(str(path), {"b": 1, "a": [1.5]})
        assert path.read_text() == json.dumps({"b": 1, "a": [1.5]}, indent=2, sort_keys=True)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    finally:
        os.umask(umask)
    assert os.listdir(tmp_path) == ["out.json"]

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)  # the data is written, its fsync fails
    with pytest.raises(OSError, match="No space left"):
        atomic_write(str(path), "new content")
    assert json.loads(path.read_text()) == {"b": 1, "a": [1.5]}
    assert os.listdir(tmp_path) == ["out.json"]


# ============================================================================= bad input
def write_cli_inputs(tmp_path, model, **fields):
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


def test_cli_overwrite_alias_replaces_the_run(tiny_model_path, tmp_path, capsys):
    cfg = write_cli_inputs(tmp_path, tiny_model_path, max_steps=2)
    assert main(["train", cfg]) == 0
    assert main(["train", cfg, "--max_steps", "1"]) == 2
    assert "--overwrite" in capsys.readouterr().err  # the refusal names the option
    assert main(["train", cfg, "--max_steps", "1", "--overwrite"]) == 0
    out = tmp_path / "out"
    assert [m["step"] for m in metrics_lines(out)] == [1]  # the old run's lines are gone
    assert {json.loads(line)["step"] for line in open(out / "completions.jsonl")} == {1}
    assert [s for s, _ in list_checkpoints(str(out))] == []
    assert main(["train", cfg, "--overwrite", "maybe"]) == 2
    assert "--overwrite takes no value" in capsys.readouterr().err


@pytest.mark.parametrize("model, expected, hub", [
    ("/nonexistent/model", "model directory '/nonexistent/model' does not exist (and it is not a hub id", False),
    ("./runs/model", "model directory './runs/model' does not exist (and it is not a hub id", False),
    ("someone/not-a-model", "could not load the model from 'someone/not-a-model' (a hub id or a path)", True),
])
def test_cli_missing_model_or_unreachable_hub(tiny_model_path, tmp_path, capsys, model, expected, hub):
    cfg = write_cli_inputs(tmp_path, model)
    assert main(["train", cfg]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert ("not reachable offline" in err) == hub  # the hub hint only for what can be a hub id
    assert "Repo id must" not in err  # huggingface_hub's validation of a path it took for a repo id


def test_cli_model_directory_without_tokenizer(tiny_model_path, tmp_path, capsys):
    import shutil

    model = tmp_path / "weights-only"
    shutil.copytree(tiny_model_path, model)
    for name in os.listdir(model):
        if name.startswith(("tokenizer", "special_tokens", "chat_template")):
            os.remove(model / name)
    cfg = write_cli_inputs(tmp_path, str(model))
    assert main(["train", cfg]) == 2
    err = capsys.readouterr().err
    assert f"the local directory {str(model)!r} has no tokenizer files (one of ['tokenizer.json'" in err
    assert "not reachable offline" not in err and "backend tokenizer" not in err


def test_conversational_prompts_need_a_chat_template(tiny_model_path, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    tok.chat_template = None
    chats = [{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS]
    with pytest.raises(ValueError, match=r"^train_dataset row 0: a conversational prompt .* needs a tokenizer with "
                                         r"a chat template"):
        GTPOTrainer(tiny_model_path, digit_reward, chats, args=config(tmp_path), processing_class=tok)


def test_tokenizer_with_neither_pad_nor_eos(tiny_model_path, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    tok.pad_token = None
    tok.eos_token = None
    with pytest.raises(ValueError, match="neither a pad token nor an EOS token"):
        GTPOTrainer(tiny_model_path, digit_reward, rows(), args=config(tmp_path), processing_class=tok)


@pytest.mark.parametrize("data, pattern", [
    ([{"prompt": "What is 1 + 2?"}, {"prompt": None}], r"^train_dataset row 1: a prompt must be a string or a list"),
    ([{"prompt": "What is 1 + 2?"}, {"prompt": [{"role": "user", "content": "hi"}]}],
     r"^train_dataset: cannot build a dataset from these rows"),
    ([{"prompt": "What is 1 + 2?"}, "What is 3 + 4?"], r"^train_dataset as a list must hold dicts .* row 1 is str"),
    ([{"question": "What is 1 + 2?"}], r"has no 'prompt' column \(columns: \['question'\]\) \(rename the question column to 'prompt'\)"),
])
def test_malformed_datasets_name_the_row(tiny_model_path, tmp_path, data, pattern):
    with pytest.raises(ValueError, match=pattern):
        GTPOTrainer(tiny_model_path, digit_reward, data, args=config(tmp_path))


def picky(prompts, completions, **kwargs):
    out = []
    for p, c in zip(prompts, completions):
        if "5 + 6" in p:
            raise ZeroDivisionError("no reward for this one")
        out.append(float(len(c)))
    return out


def test_reward_that_raises_names_function_prompt_index_and_line(tiny_model_path, tmp_path):
    trainer = GTPOTrainer(tiny_model_path, picky, rows(), args=config(tmp_path, prompts_per_step=8, max_steps=1))
    with pytest.raises(RewardFunctionError) as info:
        trainer.train()
    message = str(info.value)
    assert message.startswith("reward function 'picky' raised ZeroDivisionError: no reward for this one at "
                              "test_reliability.py:")
    assert " in picky (step 1, dataset rows [" in message
    step_rows = json.loads(re.search(r"dataset rows (\[[\d, ]+\])", message).group(1))
    row = PROMPTS.index("What is 5 + 6?")
    assert sorted(step_rows) == list(range(8))  # prompts_per_step=8: every row, in the sampler's order
    assert f"it fails on prompt index {step_rows.index(row)} (dataset row {row}: 'What is 5 + 6?')" in message
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_reward_without_kwargs_gets_a_hint(tiny_model_path, tmp_path):
    def positional_only(completions):
        return [1.0] * len(completions)

    trainer = GTPOTrainer(tiny_model_path, positional_only, rows(), args=config(tmp_path, max_steps=1))
    with pytest.raises(RewardFunctionError, match=r"'positional_only' raised TypeError: .*give the function a "
                                                  r"\*\*kwargs parameter"):
        trainer.train()


def test_reward_outputs_accepted_as_in_trl(tiny_model_path, tmp_path):
    """numpy arrays and scalars, tensors, bools (as 0/1) and None are accepted, like TRL does."""
    import numpy as np

    def as_numpy(completions, **kw):
        return np.array([1.0 if i % 2 else 0.0 for i in range(len(completions))], dtype=np.float32)

    def as_scalars(completions, **kw):
        return [np.float32(0.5), np.int64(1), torch.tensor(0.25), True, False, None, np.float64(2.0), 3][:len(completions)]

    def as_tensor(completions, **kw):
        return torch.full((len(completions),), 0.5)

    cfg = config(tmp_path, max_steps=1, prompts_per_step=2, group_size=4)
    GTPOTrainer(tiny_model_path, [as_numpy, as_scalars, as_tensor], rows(), args=cfg).train()
    m = metrics_lines(cfg.output_dir)[0]
    assert m["rewards/as_numpy/mean"] == 0.5
    assert m["rewards/as_scalars/mean"] == pytest.approx((0.5 + 1 + 0.25 + 1 + 0 + 2 + 3) / 7, abs=1e-6)
    assert m["rewards/as_tensor/mean"] == 0.5


@pytest.mark.parametrize("outputs, pattern", [
    (lambda n: [1e39] * n, r"'r' returned 1e\+39 for completion 0 .* beyond the float32 range"),
    (lambda n: torch.zeros(n, 1), r"'r' returned a Tensor of shape \(8, 1\) at step 1"),
    (lambda n: [[0.5]] * n, r"'r' returned \[0.5\] \(list\) for completion 0 \(prompt index 0, dataset row \d+, step 1\)"),
    (lambda n: [3e38, 3e38] * (n // 2), None),  # fine alone; the weighted sum overflows with weights [1, 1]
])
def test_reward_values_out_of_range_or_shape(tiny_model_path, tmp_path, outputs, pattern):
    def r(completions, **kw):
        return outputs(len(completions))

    funcs = [r] if pattern else [r, r]
    trainer = GTPOTrainer(tiny_model_path, funcs, rows(), args=config(tmp_path, max_steps=1))
    with pytest.raises(RewardFunctionError, match=pattern or r"the weighted sum of the rewards of completion 0 .* "
                                                             r"overflows float32"):
        trainer.train()


def test_output_dir_that_is_a_file(tiny_model_path, tmp_path):
    (tmp_path / "taken").write_text("x")
    trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=config(tmp_path, output_dir=str(tmp_path / "taken")))
    with pytest.raises(ValueError, match="exists and is not a directory"):
        trainer.train()


def test_resume_errors_name_the_checkpoint_and_the_alternatives(tiny_model_path, tmp_path, caplog):
    cfg = config(tmp_path, max_steps=2, save_steps=1)
    GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg).train()
    out = cfg.output_dir
    os.remove(os.path.join(out, "model.safetensors"))  # as if killed before its final save (a finished run is
    os.remove(os.path.join(out, "config.json"))        # not resumed: test_resuming_a_finished_run_is_refused)
    trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg)
    with pytest.raises(ValueError, match=r"'/nowhere' is not a directory; the newest complete checkpoint of "
                                         r"output_dir is .*checkpoint-2"):
        trainer.train(resume_from_checkpoint="/nowhere")
    with pytest.raises(ValueError, match=r"is not a complete checkpoint \(no gtpo_trainer_state.json\)\. It holds "
                                         r"checkpoints; the newest complete one is .*checkpoint-2"):
        trainer.train(resume_from_checkpoint=out)
    # a damaged newest checkpoint (e.g. a disk error after it was written): the message names the other one
    with open(os.path.join(out, "checkpoint-2", "model.safetensors"), "r+b") as fh:
        fh.truncate(64)
    with pytest.raises(ValueError, match=r"cannot load checkpoint .*checkpoint-2: .* Other complete checkpoints: "
                                         r".*checkpoint-1; resume from one of them"):
        trainer.train(resume_from_checkpoint=True)
    # a changed config is allowed, with a warning naming what changed; resuming from the older
    # checkpoint abandons the later one, which must not be picked by a later resume=True
    changed = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg.replace(learning_rate=2e-2, max_steps=1))
    with caplog.at_level("WARNING", logger="gtpo"):
        changed.train(resume_from_checkpoint=os.path.join(out, "checkpoint-1"))
    assert "changed config (learning_rate: 0.01 -> 0.02)" in caplog.text
    assert "removing the checkpoints of later steps checkpoint-2" in caplog.text
    assert [s for s, _ in list_checkpoints(out)] == [1]


def test_config_errors_name_the_field():
    cases = [
        (dict(seed="a"), "GTPOConfig.seed must be an integer, got 'a'"),
        (dict(reward_weights=3), "GTPOConfig.reward_weights must be a list of numbers or null (None), got 3"),
        (dict(report_to=5), "GTPOConfig.report_to must be a list of strings or a string, got 5"),
        (dict(logging_steps=0), "GTPOConfig.logging_steps must be an integer >= 1, got 0"),
        (dict(learning_rate=float("nan")), "GTPOConfig.learning_rate must be a number, got nan"),
        (dict(learning_rate=float("inf")), "GTPOConfig.learning_rate must be a finite number, got inf"),
        (dict(generation_batch_size=-1), "GTPOConfig.generation_batch_size must be None or an integer >= 1"),
        (dict(adam_beta2=1.0), "GTPOConfig.adam_beta2 must be in [0, 1), got 1.0"),
        (dict(max_completion_length=8, overlong_buffer_length=16), "GTPOConfig.overlong_buffer_length (16) must be"),
        (dict(max_consecutive_skips=0), "GTPOConfig.max_consecutive_skips must be an integer >= 1, got 0"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError) as info:
            GTPOConfig(**kwargs)
        assert str(info.value).startswith(message), (kwargs, str(info.value))


def test_unknown_scheduler_is_named(tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match=r"GTPOConfig.lr_scheduler_type='cosine_forever' cannot be used"):
        GTPOTrainer(tiny_model_path, digit_reward, rows(), args=config(tmp_path, lr_scheduler_type="cosine_forever"))


@pytest.mark.parametrize("spec, message", [
    ({"reward_funcs": 3}, "x.yaml: reward_funcs must be a non-empty list of reward names"),
    ({"reward_funcs": []}, "x.yaml: reward_funcs must be a non-empty list"),
    ({"model": 7}, "x.yaml: model must be a hub id, a local path or a .gguf file"),
    ({"dataset": [1, 2]}, "x.yaml: dataset must be a task name, a file path, or a mapping"),
    ({"log_level": "loud"}, "x.yaml: log_level must be one of"),
    ({"probes": {"tag": "<answer>"}}, "x.yaml: probes must be a mapping {name: [prefix, target]}"),
    ({"eval_before_after": "yes"}, "x.yaml: eval_before_after must be true or false"),
])
def test_run_keys_are_type_checked(spec, message):
    with pytest.raises(ConfigError) as info:
        split_spec(spec, source="x.yaml")
    assert str(info.value).startswith(message)
