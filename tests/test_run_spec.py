"""The typed run spec (gtpo.app.spec.RunSpec): the run keys of a `gtpo train` spec as a dataclass whose fields
document themselves, with errors naming the key and where it came from (the YAML file or --key)."""

import dataclasses
import os

import pytest
import yaml

from gtpo.app import RunSpec, parse_overrides, resolve_train_spec, split_spec, typed_values
from gtpo.app.spec import from_yaml
from gtpo.cli import main
from gtpo.config import GTPOConfig
from gtpo.errors import ConfigError, ConfigValueError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_run_keys_and_defaults():
    """The run keys, in order, with the defaults `gtpo train` has always had."""
    assert RunSpec.key_names() == ["model", "dataset", "eval_dataset", "reward_funcs", "tools", "environment_factory",
                                   "eval_reward",
                                   "eval_before_after", "peft", "sft_warmup", "probes", "resume_from_checkpoint",
                                   "log_level", "engine"]
    assert RunSpec().to_dict() == {
        "model": None, "dataset": None, "eval_dataset": None, "reward_funcs": None, "tools": None,
        "environment_factory": None, "eval_reward": "correctness",
        "eval_before_after": False, "peft": None, "sft_warmup": None, "probes": None, "resume_from_checkpoint": None,
        "log_level": "info", "engine": "gtpo"}
    assert RunSpec().trl == {} and "trl" not in RunSpec.key_names()
    assert not set(RunSpec.key_names()) & set(GTPOConfig.field_names())  # a key is either the run's or the config's


def test_every_run_key_documents_itself():
    for f in RunSpec.keys():
        assert len(f.metadata["help"]) > 20 and f.metadata["metavar"] and f.metadata["expected"], f.name


def test_split_spec_returns_typed_run_and_config():
    run, config = split_spec({"model": "m", "dataset": "gsm8k", "reward_funcs": "correctness, format",
                              "peft": {"r": 4}, "group_size": 4}, source="run.yaml")
    assert isinstance(run, RunSpec) and isinstance(config, GTPOConfig)
    assert (run.model, run.dataset, run.peft, run.engine) == ("m", "gsm8k", {"r": 4}, "gtpo")
    assert run.reward_funcs == ["correctness", "format"]  # the command line's comma-separated spelling
    assert config.group_size == 4


def test_trl_options_are_kept_apart():
    run, _ = split_spec({"engine": "trl", "ddp_find_unused_parameters": False}, source="run.yaml")
    assert run.engine == "trl" and run.trl == {"ddp_find_unused_parameters": False}
    assert "ddp_find_unused_parameters" not in run.to_dict()


def test_typo_in_a_run_key_names_the_key_and_the_file(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"^run\.yaml: unknown config field 'eval_befor_after'; did you mean "
                                          r"'eval_before_after'\?"):
        split_spec({"eval_befor_after": True}, source="run.yaml")
    path = tmp_path / "typo.yaml"
    path.write_text("model: m\nreward_func: [correctness]\n")
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: unknown config field 'reward_func'; did you mean 'reward_funcs'?" in err


@pytest.mark.parametrize("key, value, expected", [
    ("model", 5, "model must be a hub id, a local path or a .gguf file (a string), got 5"),
    ("dataset", 3, "dataset must be a task name, a file path, or a mapping {name, split, size, ...}, got 3"),
    ("reward_funcs", [], "reward_funcs must be a non-empty list of reward names (e.g. [correctness, format]), got []"),
    ("reward_funcs", ["ok", 1], "reward_funcs must be a non-empty list of reward names"),
    ("eval_reward", 1.0, "eval_reward must be a reward name or null, got 1.0"),
    ("eval_before_after", "yes", "eval_before_after must be true or false, got 'yes'"),
    ("eval_before_after", None, "eval_before_after must be true or false, got None"),
    ("peft", 16, "peft must be a mapping of settings, true (defaults) or null, got 16"),
    ("probes", {"p": ["only a prefix"]}, "probes must be a mapping {name: [prefix, target]} of strings"),
    ("resume_from_checkpoint", 3, "resume_from_checkpoint must be true, false or a checkpoint path, got 3"),
    ("log_level", "loud", "log_level must be one of ['debug', 'info', 'warning', 'error', 'critical', 'passive'], got 'loud'"),
    ("engine", "verl", "engine must be one of ['gtpo', 'trl'], got 'verl'"),
])
def test_a_wrong_type_names_the_key_and_the_file(key, value, expected):
    with pytest.raises(ConfigError) as err:
        split_spec({key: value}, source="run.yaml")
    assert str(err.value).startswith(f"run.yaml: {expected}")
    with pytest.raises(ConfigError) as err:  # set on the command line: the option is named instead of the file
        split_spec({key: value}, source="run.yaml", options={key})
    assert str(err.value).startswith(f"--{key}: {expected}")


def test_unknown_nested_keys_are_named_with_their_parent():
    for parent in ("dataset", "eval_dataset"):
        with pytest.raises(ConfigError, match=rf"^run\.yaml: unknown key '{parent}\.sise'; did you mean 'size'\?"):
            split_spec({parent: {"name": "gsm8k", "sise": 5}}, source="run.yaml")
    with pytest.raises(ConfigError, match=r"^run\.yaml: unknown key 'sft_warmup\.max_step'; did you mean 'max_steps'"):
        split_spec({"sft_warmup": {"max_step": 5}}, source="run.yaml")


def test_runspec_built_in_python_validates_too():
    with pytest.raises(ConfigValueError, match=r"^log_level must be one of") as err:
        RunSpec(log_level=3)
    assert err.value.field == "log_level"
    with pytest.raises(ConfigValueError) as err:
        RunSpec(peft={"rank": 4})
    assert err.value.field == "peft.rank" and "did you mean 'r'" not in str(err.value)
    assert RunSpec(peft="none", sft_warmup=True, probes={"p": ("a", "b")}).peft == "none"


def test_yaml_values_read_as_the_field_says():
    """YAML 1.1 reads 1e-5 as a string, a whole float may be given for an integer, one integer for a list."""
    where = {"learning_rate": "x.yaml", "max_steps": "x.yaml", "eval_k": "x.yaml", "reward_weights": "x.yaml",
             "epsilon": "x.yaml"}.get
    out = typed_values(GTPOConfig, {"learning_rate": "1e-5", "max_steps": 3.0, "eval_k": 4,
                                    "reward_weights": ["2e-1", 1], "epsilon": 1, "unknown": "kept"}, where)
    assert out == {"learning_rate": 1e-5, "max_steps": 3, "eval_k": [4], "reward_weights": [0.2, 1],
                   "epsilon": 1.0, "unknown": "kept"}
    assert type(out["max_steps"]) is int and type(out["epsilon"]) is float
    assert from_yaml("fast", "float") == "fast" and from_yaml(True, "float") is True
    assert from_yaml(2.5, "int") == 2.5  # not whole: left for the type check to refuse
    with pytest.raises(ConfigError, match=r"^x\.yaml: max_steps must be an integer, got 2\.5$"):
        typed_values(GTPOConfig, {"max_steps": 2.5}, where)
    with pytest.raises(ConfigError, match=r"^--learning_rate: learning_rate must be a number, got 'fast'$"):
        typed_values(GTPOConfig, {"learning_rate": "fast"}, lambda key: f"--{key}")


def test_sft_settings_use_the_same_reading():
    from gtpo.app.sft import run_sft_job

    with pytest.raises(ConfigError, match=r"^sft\.yaml: max_steps must be an integer, got 'many'$"):
        run_sft_job({"model": "m", "dataset": "d", "max_steps": "many"}, source="sft.yaml")
    with pytest.raises(ConfigError, match=r"^--max_steps: max_steps must be an integer"):
        run_sft_job({"model": "m", "dataset": "d", "max_steps": "many"}, source="sft.yaml", options={"max_steps"})


def test_help_and_docs_document_every_run_key(capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for f in RunSpec.keys():
        assert f"--{f.name} {f.metadata['metavar']}" in out, f.name
    with open(os.path.join(ROOT, "docs", "config.md")) as fh:
        docs = fh.read()
    for name, doc in RunSpec.key_help().items():
        assert f"| `{name}` | {doc} |" in docs, name


def test_the_application_call_shape():
    """What experiments call (gtpo.app's documentation): the spec, its source and options, then split."""
    spec, source, options = resolve_train_spec(None, parse_overrides(["--seed", "1", "--log_level", "debug"]),
                                               demo=True)
    run, config = split_spec(spec, source=source, options=options)
    assert run.model == "smollm2-135m-instruct" and run.eval_before_after and run.log_level == "debug"
    assert config.seed == 1 and options == {"seed", "log_level"}


def test_print_config_prints_the_spec(capsys):
    assert main(["train", "--demo", "--seed", "3", "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    from gtpo.app import default_config_text

    assert printed == {**yaml.safe_load(default_config_text()), "seed": 3}


def test_runspec_is_a_plain_dataclass():
    run = RunSpec(model="m")
    assert dataclasses.replace(run, engine="trl").engine == "trl"
    with pytest.raises(ConfigValueError):
        dataclasses.replace(run, engine="verl")
