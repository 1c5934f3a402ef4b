"""Trackers (report_to): one training step with each of TensorBoard, W&B (offline) and trackio, reading back
what each wrote; a tracker that is named but not installed is an error before any model is loaded."""

import glob
import json
import os
import struct
import subprocess
import sys
import textwrap

import pytest

from gtpo import GTPOConfig, GTPOTrainer
from gtpo.run.trackers import check_trackers, tracker_config


def reward_len(completions, **kwargs):
    return [len(c) / 10.0 for c in completions]


DATA = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)]


def train_one_step(model_path, tmp_path, report_to):
    cfg = GTPOConfig(output_dir=str(tmp_path / "run"), group_size=2, prompts_per_step=2, max_steps=1,
                     max_completion_length=4, save_steps=0, disable_tqdm=True, report_to=report_to,
                     gamma=0.1, entropy_rule="initial")  # gamma and the rule set: a float and a str in the config
    GTPOTrainer(model_path, [reward_len], DATA, args=cfg).train()
    with open(tmp_path / "run" / "metrics.jsonl") as fh:
        return cfg, [json.loads(line) for line in fh]


def test_tracker_config_is_flat_scalars():
    flat = tracker_config({"a": None, "b": [1, 8], "c": {"r": 16, "t": ["q", "v"]}, "d": 0.5, "e": True, "f": {}})
    assert flat == {"a": "None", "b": "[1, 8]", "c.r": 16, "c.t": '["q", "v"]', "d": 0.5, "e": True, "f": "{}"}


def test_tensorboard_gets_the_metrics_and_the_config(tiny_model_path, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg, records = train_one_step(tiny_model_path, tmp_path, "tensorboard")
    # accelerate's tracker writes to <output_dir>/<run name>; the config (with lists and None) as hparams
    logdir = tmp_path / "run" / "run"
    events = EventAccumulator(str(logdir)).Reload()
    tags = set(events.Tags()["scalars"])
    step = records[-1]
    for key in ("reward", "entropy", "loss", "gtpo/conflict_frac"):
        assert key in tags, (key, sorted(tags))
        (scalar,) = events.Scalars(key)
        assert scalar.step == 1
        assert scalar.value == pytest.approx(step[key], rel=1e-6, abs=1e-7)
    hparams = glob.glob(str(logdir / "*" / "hparams.yml"))
    assert hparams, os.listdir(logdir)
    text = open(hparams[0]).read()
    assert "gamma: 0.1" in text and "report_to: '[\"tensorboard\"]'" in text and "epsilon_high: None" in text


def _wandb_records(path):
    """The protobuf records of a .wandb file (LevelDB log format: 32 KiB blocks of chunks with 7-byte headers)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    block, pos, out, pending = 32768, 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0:
            pos += left - 7
            continue
        chunk, pos = data[pos:pos + n], pos + n
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
    records = []
    for raw in out:
        rec = pb.Record()
        rec.ParseFromString(raw)
        records.append(rec)
    return records


def train_one_step_in_a_process(model_path, tmp_path, report_to, env):
    """:func:`train_one_step` in a fresh interpreter whose environment holds ``env`` from the start (trackers read
    their settings, e.g. TRACKIO_DIR, when imported): the records of its metrics.jsonl."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_trackers import train_one_step
        import pathlib
        train_one_step({model_path!r}, pathlib.Path({str(tmp_path)!r}), {report_to!r})
    """)
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(tmp_path / "run" / "metrics.jsonl") as fh:
        return [json.loads(line) for line in fh]


def test_wandb_offline_gets_the_metrics_and_the_config(tiny_model_path, tmp_path):
    pytest.importorskip("wandb")
    records = train_one_step_in_a_process(tiny_model_path, tmp_path, "wandb", {
        "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"})
    (path,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    history, config = [], {}
    for rec in _wandb_records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "config":
            config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.config.update})
    (row,) = history
    for key in ("reward", "entropy", "loss", "gtpo/conflict_frac"):
        assert row[key] == pytest.approx(records[-1][key], rel=1e-6, abs=1e-7), key
    assert row["_step"] == 1
    # W&B keeps the config's own types (lists, None), unlike TensorBoard's hparams
    assert config["gamma"] == 0.1 and config["report_to"] == ["wandb"] and config["epsilon_high"] is None


def test_trackio_gets_the_metrics(tiny_model_path, tmp_path):
    pytest.importorskip("trackio")
    import sqlite3

    records = train_one_step_in_a_process(tiny_model_path, tmp_path, "trackio", {"TRACKIO_DIR": str(tmp_path / "tio")})
    (db,) = glob.glob(str(tmp_path / "tio" / "*.db"))
    ((step, blob),) = sqlite3.connect(db).execute("select step, metrics from metrics").fetchall()
    logged = json.loads(blob)
    assert step == 1
    for key in ("reward", "entropy", "loss", "gtpo/conflict_frac"):
        assert logged[key] == pytest.approx(records[-1][key], rel=1e-6, abs=1e-7), key


@pytest.mark.parametrize("tracker", ["wandb", "trackio", "tensorboard"])
def test_a_tracker_not_installed_is_an_error_before_the_model_loads(tmp_path, monkeypatch, tracker):
    # sys.modules[name] = None is how Python marks a module as absent: find_spec gives None, import fails
    for module in {"tensorboard": ("tensorboard", "tensorboardX")}.get(tracker, (tracker,)):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ValueError, match=rf"GTPOConfig.report_to: '{tracker}' is not installed, so nothing would be "
                                         rf"logged there: pip install {tracker}"):
        GTPOTrainer(str(tmp_path / "no-such-model"), [reward_len], DATA,
                    args=GTPOConfig(output_dir=str(tmp_path / "run"), report_to=["none", tracker]))
    check_trackers(["none", "unknown"])  # unknown names are the config's to refuse


@pytest.mark.parametrize("engine", ["gtpo", "trl"])
def test_gtpo_train_names_the_missing_tracker_before_loading_anything(tmp_path, monkeypatch, capsys, engine):
    from gtpo.cli import main

    monkeypatch.setitem(sys.modules, "wandb", None)
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1 + 1?", "answer": "2"}\n')
    argv = ["train", "--model", str(tmp_path / "no-such-model"), "--dataset", str(data), "--reward_funcs", "format",
            "--report_to", "wandb", "--engine", engine, "--output_dir", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--report_to: 'wandb' is not installed, so nothing would be logged there: pip install wandb" in err
    assert not os.path.exists(tmp_path / "out")
