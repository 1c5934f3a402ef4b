"""Fault tolerance of training runs: kills, stop signals, non-finite steps, full disks, atomic writes.

The kill / signal / real-write-failure scenarios run in one helper process
(``tests/scripts/fault_driver.py``, shared by every test of that group through a module fixture):
each training attempt is the real ``gtpo train`` command line in a forked child; after every fault
the run is resumed until it finishes, and the result must be *bitwise* the uninterrupted run's:
final weights, every metrics.jsonl line (timings aside) and completions.jsonl. The other tests run
in this process on tiny random models (CPU, offline). (Bad input and the messages that name it:
tests/test_errors.py; reward functions that raise or return unusable values: tests/test_scoring.py.)
"""

import errno
import json
import math
import os
import stat
import subprocess
import sys

import pytest
import torch

from gtpo import GTPOTrainer
from gtpo.cli import main
from gtpo.errors import CheckpointError, TrainingStopped
from gtpo.run.checkpoint import atomic_write, commit, list_checkpoints, read_state, remove_checkpoint, rotate, write_json_atomic
from helpers import digit_reward, metrics_lines, rows, tiny_config, write_cli_inputs

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "scripts", "fault_driver.py")
TIMING_KEYS = {"step_time", "gtpo/generation_time", "gtpo/update_time", "gtpo/tokens_per_s"}


def config(tmp_path, **kw):
    return tiny_config(tmp_path, **{"entropy_filter": False, **kw})


def weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def optimizer_state(trainer):
    return {k: {n: (v.clone() if torch.is_tensor(v) else v) for n, v in s.items()}
            for k, s in trainer.optimizer.state_dict()["state"].items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


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
    # no temporary dir (the run's lock file, gtpo.run.lock, stays: it holds no lock once the process lets go)
    assert sorted(os.listdir(out)) == [".gtpo-run.lock", "checkpoint-1", "metrics.jsonl", "run_config.json"]
    assert read_state(os.path.join(out, "checkpoint-1"))["global_step"] == 1
    monkeypatch.undo()
    # the intact checkpoint loads: its weights are those after step 1
    again = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg.replace(max_steps=1))
    again.load_checkpoint(os.path.join(out, "checkpoint-1"))
    assert same(weights(again.unwrapped_model), seen[1][0])


def test_disk_full_while_saving_the_final_model_or_metrics(tiny_model_path, tmp_path, monkeypatch):
    import gtpo.run.checkpoint as checkpoint_module

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
