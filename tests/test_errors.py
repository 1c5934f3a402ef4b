"""Bad input stops a run before it trains, with a message that names what was wrong and where: a missing model or
tokenizer, a tokenizer that cannot pad, malformed dataset rows, an output_dir that is a file, a checkpoint that
cannot be resumed, config fields and run keys of the wrong type, an unknown scheduler."""

import json
import os

import pytest

from gtpo import GTPOConfig, GTPOTrainer
from gtpo.app import split_spec
from gtpo.cli import main
from gtpo.errors import ConfigError
from gtpo.run.checkpoint import list_checkpoints
from helpers import PROMPTS, digit_reward, metrics_lines, rows, tiny_config, write_cli_inputs


def config(tmp_path, **kw):
    return tiny_config(tmp_path, **{"entropy_filter": False, **kw})


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
        (dict(logging_steps=0), "GTPOConfig.logging_steps must be an integer >= 1 or a fraction in (0, 1), got 0"),
        (dict(learning_rate=float("nan")), "GTPOConfig.learning_rate must be a number, got nan"),
        (dict(learning_rate=float("inf")), "GTPOConfig.learning_rate must be a finite number, got inf"),
        (dict(generation_chunk_size=-1), "GTPOConfig.generation_chunk_size must be None or an integer >= 1"),
        (dict(adam_beta2=1.0), "GTPOConfig.adam_beta2 must be in [0, 1), got 1.0"),
        (dict(max_completion_length=8, overlong_buffer_length=16), "GTPOConfig.overlong_buffer_length (16) must be"),
        (dict(max_consecutive_skips=0), "GTPOConfig.max_consecutive_skips must be an integer >= 1, got 0"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError) as info:
            GTPOConfig(**kwargs)
        assert str(info.value).startswith(message), (kwargs, str(info.value))


def test_unknown_scheduler_is_named(tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match=r"GTPOConfig.lr_scheduler_type must be one of \['linear', 'cosine', .*"
                                         r"\(transformers' SchedulerType; .*got 'cosine_forever'"):
        config(tmp_path, lr_scheduler_type="cosine_forever")
    # a schedule keyword transformers refuses: named when the trainer is built, before the model loads
    with pytest.raises(ValueError, match=r"GTPOConfig.lr_scheduler_type='linear' with lr_scheduler_kwargs="
                                         r"\{'num_cycles': 2\} cannot be used"):
        GTPOTrainer(str(tmp_path / "no-model"), digit_reward, rows(),
                    args=config(tmp_path, lr_scheduler_type="linear", lr_scheduler_kwargs={"num_cycles": 2}))


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
