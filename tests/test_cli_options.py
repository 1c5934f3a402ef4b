"""The command line's option traps: no silent inheritance of the demo run, YAML 1.1 floats, errors that name the
option, --a-b and --a_b in every subcommand, every sft key documented in its --help."""

import pytest


def test_options_without_a_config_file_start_from_gtpoconfig_defaults(capsys):
    import yaml

    from gtpo.cli import main

    assert main(["train", "--model", "Qwen/Qwen2.5-3B-Instruct", "--dataset", "gsm8k", "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == {"model": "Qwen/Qwen2.5-3B-Instruct", "dataset": "gsm8k"}  # nothing of the demo
    # a run that misses what it needs is a clear error, before anything is loaded
    assert main(["train", "--model", "Qwen/Qwen2.5-3B-Instruct", "--dataset", "gsm8k"]) == 2
    err = capsys.readouterr().err
    assert "a run needs reward_funcs" in err and "--reward_funcs" in err and "--demo" in err
    assert main(["train", "--learning_rate", "1e-4"]) == 2
    err = capsys.readouterr().err
    assert "model (set `model:`" in err and "dataset (set `dataset:`" in err
    # --demo starts from the default run, with overrides
    assert main(["train", "--demo", "--seed", "1", "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"] == "smollm2-135m-instruct" and printed["seed"] == 1


def test_yaml_1_1_floats_are_accepted(tmp_path):
    from gtpo.app import load_yaml, split_spec

    path = tmp_path / "c.yaml"
    path.write_text("learning_rate: 1e-5\nadam_epsilon: 1E-8\nentropy_threshold: 2e0\nreward_weights: [1e0, 5e-1]\n"
                    "logprob_temperature: 1e0\n")
    raw = load_yaml(str(path))
    assert raw["learning_rate"] == "1e-5"  # what PyYAML (YAML 1.1) makes of it
    _run, cfg = split_spec(raw, source=str(path))
    assert (cfg.learning_rate, cfg.adam_epsilon, cfg.entropy_threshold) == (1e-5, 1e-8, 2.0)
    assert cfg.reward_weights == [1.0, 0.5] and cfg.logprob_temperature == 1.0
    with pytest.raises(ValueError, match="learning_rate must be a number, got 'fast'"):
        split_spec({"learning_rate": "fast"}, source="x.yaml")


def test_errors_name_the_command_line_option(capsys, tmp_path):
    from gtpo.cli import main

    assert main(["train", "--loss_type", "gpro"]) == 2
    err = capsys.readouterr().err
    assert "--loss_type: GTPOConfig.loss_type must be one of" in err and "default config" not in err
    cfg = tmp_path / "c.yaml"
    cfg.write_text("loss_type: gpro\n")
    assert main(["train", str(cfg)]) == 2
    assert f"{cfg}: GTPOConfig.loss_type must be one of" in capsys.readouterr().err
    assert main(["train", str(cfg), "--loss_type", "grpo", "--group_size", "x"]) == 2
    assert "--group_size: group_size must be an integer" in capsys.readouterr().err


@pytest.mark.parametrize("spelling", ["--max_new_tokens", "--max-new-tokens"])
def test_every_subcommand_accepts_both_spellings(spelling, capsys, tmp_path):
    from gtpo.cli import main

    # gtpo eval: parsed (then refused for the missing model, not for the option)
    assert main(["eval", spelling, "10", "--dataset", "gsm8k"]) == 2
    err = capsys.readouterr().err
    assert "--model and --dataset are required" in err and "usage" not in err
    # gtpo train / sft read --a-b as --a_b
    assert main(["train", "--demo", "--max-completion-length", "12", "--print-config"]) == 0
    assert "max_completion_length: 12" in capsys.readouterr().out
    assert main(["sft", "--model", "m", "--dataset", "d", "--max-steps", "0"]) == 2
    assert "max_steps" in capsys.readouterr().err


def test_sft_help_documents_every_key(capsys):
    from gtpo.cli import main
    from gtpo.sft import SFTArgs

    assert main(["sft", "--help"]) == 0
    out = capsys.readouterr().out
    for name, doc in SFTArgs.field_help().items():
        assert f"--{name}" in out, name
    assert "Optimiser steps" in out and "Peak AdamW learning rate" in out and "LoRA settings" in out
