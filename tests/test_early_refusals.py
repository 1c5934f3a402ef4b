"""Library-validated model settings refused before any model loads (issue 41, item 2): LoRA values that peft refuses
only once it builds the adapter on the loaded model, quantization without bitsandbytes or without an adapter, an
attention implementation this machine cannot run, a float16 load on gtpo's trainer. Each `gtpo train --config x.yaml`
error names the key as the YAML wrote it (TRL's lora_r, load_in_4bit, ... or gtpo's peft.r, model_init_kwargs...),
the file (or --option) and what to do; the model and the dataset paths do not exist, so a run that got as far as
loading either would fail naming them instead."""

import os
import subprocess
import sys

import pytest
import yaml

from gtpo.app.model_checks import peft_problem
from gtpo.app.spec import split_spec
from gtpo.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def trl_yaml(tmp_path, **keys):
    """A `trl grpo` YAML (TRL's names) whose model and dataset do not exist."""
    spec = {"model_name_or_path": str(tmp_path / "no-such-model"), "dataset_name": str(tmp_path / "no-such-data"),
            "reward_funcs": ["accuracy_reward"], "output_dir": str(tmp_path / "out"), "num_generations": 4,
            "max_steps": 1, **keys}
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


def gtpo_yaml(tmp_path, **keys):
    spec = {"model": str(tmp_path / "no-such-model"), "dataset": str(tmp_path / "no-such-data.jsonl"),
            "reward_funcs": ["correctness"], "output_dir": str(tmp_path / "out"), **keys}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


def refused(argv, capsys):
    """The error of `gtpo train ARGV` (exit code 2), checked to come before the model and the dataset."""
    code = main(["train", *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "no-such-model" not in err and "no-such-data" not in err, err
    return err


# ----------------------------------------------------------------------------- LoRA
@pytest.mark.parametrize("engine", ["gtpo", "trl"])
def test_lora_r_0_names_lora_r_and_the_file_on_both_engines(tmp_path, capsys, engine):
    path = trl_yaml(tmp_path, use_peft=True, lora_r=0, lora_alpha=16, engine=engine)
    err = refused(["--config", path], capsys)
    assert f"{path}: lora_r: peft refuses 0 (ValueError: `r` should be a positive integer" in err
    assert "lora_r must be a positive integer (the LoRA rank, e.g. 16)" in err


@pytest.mark.parametrize("keys, words", [
    ({"lora_dropout": 2.0}, "lora_dropout: peft refuses 2.0 (ValueError: dropout probability has to be between 0 and 1"),
    ({"lora_alpha": "sixteen"}, "lora_alpha: peft refuses 'sixteen' (TypeError"),
    ({"lora_r": 2.5}, "lora_r: peft refuses 2.5 (TypeError"),
    ({"use_dora": "yes"}, "use_dora: peft refuses 'yes' (TypeError: use_dora must be true or false"),
])
def test_each_lora_setting_is_named_as_trl_names_it(tmp_path, capsys, keys, words):
    path = trl_yaml(tmp_path, use_peft=True, **keys)
    assert f"{path}: {words}" in refused(["--config", path], capsys)


def test_gtpos_peft_mapping_and_the_command_line_are_named_as_written(tmp_path, capsys):
    path = gtpo_yaml(tmp_path, peft={"r": 8, "bias": "some"})
    err = refused(["--config", path], capsys)
    assert f"{path}: peft.bias: peft refuses 'some' (NotImplementedError: Requested bias: some" in err
    assert "peft.bias must be 'none', 'all' or 'lora_only'" in err
    path = trl_yaml(tmp_path, use_peft=True)
    err = refused(["--config", path, "--lora_r", "-4"], capsys)
    assert "--lora_r: lora_r: peft refuses -4" in err


def test_peft_problem_accepts_what_peft_accepts():
    assert peft_problem(None) is None and peft_problem(True) is None
    assert peft_problem({"r": 4, "lora_alpha": 8, "lora_dropout": 0.05, "target_modules": "all-linear",
                         "use_rslora": True, "bias": "lora_only"}) is None
    key, err = peft_problem({"r": 4, "lora_dropout": 1.5})  # sensitivity: the same call refuses a bad value
    assert key == "lora_dropout" and "dropout probability" in str(err)


# ----------------------------------------------------------------------------- quantization
def test_load_in_4bit_without_bitsandbytes_says_how_to_install_it(tmp_path):
    """A Python without bitsandbytes (the import made impossible in the child process, as on a machine where it
    is not installed)."""
    path = trl_yaml(tmp_path, use_peft=True, lora_r=4, load_in_4bit=True)
    code = ("import sys; sys.modules['bitsandbytes'] = None; from gtpo.cli import main; "
            f"sys.exit(main(['train', '--config', {path!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")})
    assert out.returncode == 2, out.stderr[-2000:]
    assert (f"{path}: load_in_4bit loads the base model quantized with bitsandbytes, which is not installed: pip "
            "install bitsandbytes") in out.stderr
    assert "no-such-model" not in out.stderr


def test_a_quantized_base_without_an_adapter_is_refused_before_loading(tmp_path, capsys):
    pytest.importorskip("bitsandbytes")
    path = trl_yaml(tmp_path, load_in_4bit=True)
    err = refused(["--config", path], capsys)
    assert f"{path}: load_in_4bit: a quantized base cannot be trained itself, only an adapter on it" in err
    assert "set use_peft: true" in err
    path = trl_yaml(tmp_path, load_in_4bit=True, use_peft=True, bnb_4bit_quant_type="nf5")
    assert f"{path}: bnb_4bit_quant_type must be one of ['nf4', 'fp4']" in refused(["--config", path], capsys)
    path = gtpo_yaml(tmp_path, peft={"r": 4},
                     model_init_kwargs={"quantization_config": {"load_in_4bit": True, "bnb_4bit_compute_dtype": "bf17"}})
    err = refused(["--config", path], capsys)
    assert f"{path}: model_init_kwargs.quantization_config: transformers' BitsAndBytesConfig refuses it" in err


# ----------------------------------------------------------------------------- attention, dtype
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="flash attention runs on this machine's GPU")
def test_flash_attention_without_a_gpu_is_refused_before_loading(tmp_path, capsys):
    path = trl_yaml(tmp_path, attn_implementation="flash_attention_2")
    err = refused(["--config", path], capsys)
    assert f"{path}: attn_implementation: flash_attention_2 runs on GPUs" in err and "sdpa" in err


def test_an_unknown_attention_implementation_is_refused_with_the_known_ones(tmp_path, capsys):
    path = trl_yaml(tmp_path, attn_implementation="fast")
    err = refused(["--config", path], capsys)
    assert f"{path}: attn_implementation: transformers has no attention implementation 'fast'; use one of " in err
    assert "'sdpa'" in err and "'eager'" in err
    path = gtpo_yaml(tmp_path, model_init_kwargs={"attn_implementation": "fast"})
    assert f"{path}: model_init_kwargs.attn_implementation: transformers has no" in refused(["--config", path], capsys)


def test_known_attention_implementations_pass_the_check(tmp_path):
    from gtpo.app.model_checks import check_model_settings

    for value in ("eager", "sdpa", "paged|eager", "kernels-community/flash-attn2"):
        spec = {"model": "m", "attn_implementation": value}
        run, config = split_spec(spec, source="x.yaml")
        check_model_settings(run, config, spec, source="x.yaml", options=frozenset())


def test_float16_is_refused_on_gtpos_engine_with_the_reason_and_taken_by_trls(tmp_path, capsys):
    path = gtpo_yaml(tmp_path, model_init_kwargs={"dtype": "float16"})
    err = refused(["--config", path], capsys)
    assert f"{path}: model_init_kwargs.dtype: float16 cannot train on gtpo's trainer, which does no loss scaling" in err
    assert "engine: trl" in err
    path = trl_yaml(tmp_path, dtype="float16")
    err = refused(["--config", path], capsys)
    assert "dtype must be None or one of ['auto', 'float32', 'bfloat16'] (float16 is refused: gtpo's trainer" in err
    # TRL's engine: TRL's ModelConfig.dtype float16 is the dtype the model loads in, trained with loss scaling
    _, config = split_spec({"model_name_or_path": "m", "dtype": "float16", "engine": "trl"}, source="x.yaml")
    assert config.model_init_kwargs == {"dtype": "float16"} and config.requested_dtype == "float16"
