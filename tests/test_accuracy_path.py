"""One before/after accuracy path for both engines (gtpo.app.common.measure_accuracy), on the model the run trains
(the trainer's own object: its dtype, its device, its precision), and the run's precision decided once."""

import json

import pytest
import torch

from gtpo.app import RunHooks, greedy_accuracy, parse_overrides, resolve_train_spec, run_training
from gtpo.app.common import measures_accuracy
from gtpo.app.training import load_run_inputs

# a scorer of the held-out problems that passes some replies and not others, by the parity of the reply's tokens and
# of the problem's answer (the tiny random model's replies are too alike for a correctness reward: 0 everywhere)
PARITY = ("def parity(completions, completion_ids, answer, **kwargs):\n"
          "    return [float((sum(ids) + int(a)) % 2 == 0) for ids, a in zip(completion_ids, answer)]\n")


def _run_args(model_path, tmp_path, *extra):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
                            for a, b in [(1, 2), (3, 4), (5, 1), (2, 2), (7, 3), (4, 4), (6, 1), (9, 2)]))
    scorer = tmp_path / "parity.py"
    scorer.write_text(PARITY)
    return ["--model", model_path, "--dataset", str(data), "--dataset.template", "plain",
            "--eval_dataset", str(data), "--eval_dataset.template", "plain", "--eval_before_after", "true",
            "--eval_reward", f"{scorer}:parity", "--reward_funcs", "last_number_correctness",
            "--output_dir", str(tmp_path / "out"), "--group_size", "4", "--prompts_per_step", "2", "--max_steps", "1",
            "--max_completion_length", "8", "--save_steps", "0", "--disable_tqdm", "true", "--peft.r", "4",
            "--learning_rate", "1e-2", "--log_completions_steps", "0", "--entropy_filter", "false", *extra]


class Recorder:
    """RunHooks whose accuracy records what it was given (then measures as the default does) and which keep the
    trainer."""

    def __init__(self):
        self.calls, self.trainer = [], None

    def accuracy(self, model, tokenizer, dataset, reward, config, engine=None, stage=None):
        self.calls.append({"stage": stage, "model": model, "engine": engine,
                           "dtypes": {p.dtype for p in model.parameters()},
                           "devices": {p.device for p in model.parameters()},
                           "autocast": torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu"),
                           "trainer_built": self.trainer is not None})
        return greedy_accuracy(model, tokenizer, dataset, reward, config, engine=engine, stage=stage)

    def hooks(self):
        return RunHooks(accuracy=self.accuracy, on_trainer=lambda trainer: setattr(self, "trainer", trainer))


def _before_on_a_fresh_base(model_path, args, tmp_path):
    """The before-training accuracy as measured before there was one path: on a separately loaded float32 base."""
    from gtpo.run.models import load_model, load_tokenizer

    spec, source, options = resolve_train_spec(None, parse_overrides(args), demo=False)
    inputs = load_run_inputs(spec, source=source, options=options)
    return greedy_accuracy(load_model(model_path), load_tokenizer(model_path), inputs.eval_dataset,
                           inputs.eval_reward, inputs.config)


def test_measures_accuracy_when_asked_and_not_before_a_resume(tiny_model_path, tmp_path):
    spec, source, options = resolve_train_spec(None, parse_overrides(_run_args(tiny_model_path, tmp_path)))
    inputs = load_run_inputs(spec, source=source, options=options)
    assert measures_accuracy(inputs, "before") and measures_accuracy(inputs, "after")
    inputs.run.resume_from_checkpoint = True
    assert not measures_accuracy(inputs, "before") and measures_accuracy(inputs, "after")
    inputs.run.eval_before_after = False
    assert not measures_accuracy(inputs, "after")


def test_gtpo_engine_measures_the_trainers_model_before_and_after(tiny_model_path, tmp_path, capsys):
    args = _run_args(tiny_model_path, tmp_path)
    rec = Recorder()
    spec, source, options = resolve_train_spec(None, parse_overrides(args))
    assert run_training(spec, source=source, options=options, hooks=rec.hooks()) == 0
    trainer = rec.trainer
    assert [c["stage"] for c in rec.calls] == ["before", "after"]
    for call in rec.calls:  # the trainer's own model (a peft model), built before the first measurement
        assert call["model"] is trainer.unwrapped_model and call["trainer_built"] and call["engine"] is None
        assert call["devices"] == {trainer.accelerator.device} and call["dtypes"] == {torch.float32}
        assert call["autocast"] is False  # float32: no autocast
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert 0.0 < summary["accuracy_before"] < 1.0
    # the number is the one the separate untrained base gives: the new adapter adds exactly nothing
    assert summary["accuracy_before"] == _before_on_a_fresh_base(tiny_model_path, args, tmp_path)
    out = capsys.readouterr().out
    assert f"greedy accuracy before training: {summary['accuracy_before']:.1%} on 8 held-out problems" in out
    assert f"greedy accuracy after training:  {summary['accuracy_after']:.1%} on 8 held-out problems" in out


def test_gtpo_engine_precision_is_decided_once_and_measured_in(tiny_model_path, tmp_path):
    """dtype bfloat16 with LoRA: the app decides the precision, loads the base with it and hands it to the trainer;
    the accuracy runs in the run's compute dtype (the trainer's autocast) on that bfloat16 base."""
    from gtpo.run.build import run_precision

    rec = Recorder()
    spec, source, options = resolve_train_spec(None, parse_overrides(_run_args(tiny_model_path, tmp_path,
                                                                               "--dtype", "bfloat16")))
    assert run_training(spec, source=source, options=options, hooks=rec.hooks()) == 0
    trainer = rec.trainer
    decided = run_precision(trainer.args, tiny_model_path, adapter=True, device=torch.device("cpu"))
    assert trainer.precision == decided and decided.compute == decided.load == torch.bfloat16
    for call in rec.calls:
        assert call["model"] is trainer.unwrapped_model
        assert call["dtypes"] == {torch.bfloat16, torch.float32}  # the frozen base, the float32 adapter
        assert call["autocast"] == torch.bfloat16


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_trl_engine_measures_the_trainers_model_not_a_second_copy(tiny_model_path, tmp_path, dtype):
    """TRL's engine: before training the accuracy is measured on the model TRL's trainer holds (its dtype, its
    device; not a second float32 copy loaded on CPU: issue 42), the same object as after training."""
    pytest.importorskip("trl")
    args = _run_args(tiny_model_path, tmp_path, "--engine", "trl", "--dtype", dtype)
    rec = Recorder()
    spec, source, options = resolve_train_spec(None, parse_overrides(args))
    assert run_training(spec, source=source, options=options, hooks=rec.hooks()) == 0
    trainer = rec.trainer
    assert [c["stage"] for c in rec.calls] == ["before", "after"]
    held = trainer.accelerator.unwrap_model(trainer.model)
    for call in rec.calls:
        assert call["model"] is held and call["trainer_built"]
        assert call["devices"] == {trainer.accelerator.device}
        assert getattr(torch, trainer.args.model_init_kwargs["dtype"]) == getattr(torch, dtype)
        assert call["dtypes"] == {getattr(torch, dtype)} | {torch.float32}  # the base in the run's dtype, the adapter
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["engine"] == "trl" and 0.0 < summary["accuracy_before"] < 1.0
    if dtype == "float32":  # the number the separate float32 base gave (the new adapter adds exactly nothing)
        assert summary["accuracy_before"] == _before_on_a_fresh_base(tiny_model_path, args, tmp_path)
