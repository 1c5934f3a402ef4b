"""What gtpo's own engine does with each option of a `trl grpo` YAML (issue 41): one verdict per option
(gtpo.app.trl_options), acted on before any model loads, and the table of docs/trl-yaml.md generated from it."""

import dataclasses
import logging

import pytest

from gtpo import GTPOConfig
from gtpo.app.spec import resolve_train_spec, split_spec
from gtpo.app.trl_options import (ACCEPTED_VALUES, CONVERTED_NOTES, NO_EFFECT, REFUSED, TRL_ENGINE_ONLY,
                                  gtpo_engine_verdict)
from gtpo.config import fields_where
from gtpo.errors import ConfigError, ConfigValueError

trl = pytest.importorskip("trl")

BASE = {"model": "m", "dataset": "x.jsonl", "reward_funcs": ["format"]}


def trl_default(f):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def other_value(default):
    """A value other than TRL's default, of a plausible type."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 1
    if isinstance(default, str):
        return default + "-other"
    return 2 if default is None else None


@pytest.mark.parametrize("field", dataclasses.fields(trl.GRPOConfig), ids=lambda f: f.name)
def test_every_grpo_option_is_taken_or_refused_with_the_reason(field):
    """A TRL YAML that writes any GRPOConfig option at TRL's own default trains on gtpo's engine (a file written out
    from a whole GRPOConfig); another value is taken (the same, mapped, no effect with a reason) or refused naming the
    option, the file, why and what to do, never with another error."""
    from gtpo.app.spec import RunSpec

    default = trl_default(field)
    run, config = split_spec({**BASE, field.name: default}, source="grpo.yaml")
    assert run.trl == {}  # gtpo's engine: nothing is left for TRL
    value = other_value(default)
    verdict = gtpo_engine_verdict(field.name, value, run_keys=RunSpec.key_names())
    assert verdict.kind in ("same", "mapped", "no_effect", "refused")
    if verdict.kind == "refused":
        with pytest.raises(ConfigError) as err:
            split_spec({**BASE, field.name: value}, source="grpo.yaml")
        assert str(err.value) == f"grpo.yaml: {field.name} is not taken by gtpo's trainer: {verdict.note}"
    elif verdict.kind == "no_effect":
        assert split_spec({**BASE, field.name: value}, source="grpo.yaml")[0].trl == {}


def test_a_refusal_on_the_command_line_names_the_option_and_why():
    spec = resolve_train_spec(None, {**BASE, "use_liger_kernel": True})
    with pytest.raises(ConfigError, match=r"^--use_liger_kernel: use_liger_kernel is not taken by gtpo's trainer: "
                                          r"Liger's fused GRPO loss computes GRPO's loss, not GTPO's"):
        split_spec(spec.spec, source=spec.source, options=spec.options)
    spec = resolve_train_spec(None, {**BASE, "ddp_static_graph": True})  # no reason of its own: TRL's engine
    with pytest.raises(ConfigError, match=r"--ddp_static_graph: .*" + TRL_ENGINE_ONLY.replace("(", r"\(")
                       .replace(")", r"\)").replace(".", r"\.")):
        split_spec(spec.spec, source=spec.source, options=spec.options)
    with pytest.raises(ConfigError, match=r"unknown option --not_an_option"):  # not TRL's either: unknown
        resolve_train_spec(None, {**BASE, "not_an_option": 1})


def test_no_effect_options_are_dropped_and_logged(caplog):
    with caplog.at_level(logging.INFO, logger="gtpo"):
        run, config = split_spec({**BASE, "dataloader_num_workers": 4, "shuffle_dataset": True,
                                  "remove_unused_columns": False}, source="grpo.yaml")
    assert "ignored: dataloader_num_workers, shuffle_dataset, remove_unused_columns" in caplog.text
    assert run.trl == {}


def test_an_option_accepted_with_one_value_refuses_the_others():
    for name, (value, why) in ACCEPTED_VALUES.items():
        split_spec({**BASE, name: value}, source="grpo.yaml")
        with pytest.raises(ConfigError, match=rf"grpo.yaml: {name} is not taken by gtpo's trainer: only {value!r}"):
            split_spec({**BASE, name: "something else"}, source="grpo.yaml")


def test_the_verdict_lists_are_disjoint_and_name_real_options():
    """Each option has one verdict; every listed name is an option of a `trl grpo` YAML (TRL's GRPOConfig or script
    arguments), not a gtpo field."""
    from gtpo.app.trl_names import TRL_SCRIPT_KEYS

    lists = [set(NO_EFFECT), set(ACCEPTED_VALUES), set(REFUSED)]
    assert sum(map(len, lists)) == len(set().union(*lists))
    trl_names = {f.name for f in dataclasses.fields(trl.GRPOConfig)} | set(TRL_SCRIPT_KEYS)
    assert set().union(*lists) <= trl_names
    assert not set().union(*lists) & set(GTPOConfig.field_names())


def test_every_converted_field_says_how_it_differs():
    assert set(CONVERTED_NOTES) == set(fields_where("trl", "converted"))


def test_trls_null_means_gtpos_default_on_both_engines():
    for engine in ("gtpo", "trl"):
        run, config = split_spec({**BASE, "engine": engine, "output_dir": None, "bf16": None, "disable_tqdm": None,
                                  "log_level": "passive"}, source="grpo.yaml")
        assert (config.output_dir, config.bf16, config.disable_tqdm) == ("runs/gtpo", False, False)


def test_generation_batch_size_means_trls_rollout_batch():
    """TRL's generation_batch_size (completions per generation, over all processes) is prompts_per_step x group_size
    on gtpo's engine; gtpo's chunk of generate() calls is generation_chunk_size."""
    assert GTPOConfig(generation_batch_size=16, group_size=8).prompts_per_step == 2
    assert GTPOConfig(generation_batch_size=16, group_size=8).generation_batch_size is None  # read as an alias
    with pytest.raises(ConfigValueError, match=r"must be a positive multiple of group_size \(8\)"):
        GTPOConfig(generation_batch_size=12, group_size=8)
    with pytest.raises(ConfigValueError, match=r"TRL's name of prompts_per_step x group_size, which is 3 x 8"):
        GTPOConfig(generation_batch_size=16, group_size=8, prompts_per_step=3)
    yaml_batch = {**BASE, "num_generations": 4, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}
    run, config = split_spec({**yaml_batch, "generation_batch_size": 8}, source="grpo.yaml")
    assert (config.prompts_per_step, config.micro_batch_size) == (2, 4)  # TRL's derived batch, stated again
    with pytest.raises(ConfigError, match=r"grpo.yaml: generation_batch_size \(16\) other than "
                                          r"per_device_train_batch_size x gradient_accumulation_steps x processes \(8\)"):
        split_spec({**yaml_batch, "generation_batch_size": 16}, source="grpo.yaml")
    # alone, TRL's per-device default (8 completions per optimizer step) applies, as in TRL
    with pytest.raises(ConfigError, match=r"generation_batch_size \(16\) other than .* \(8\)"):
        split_spec({**BASE, "generation_batch_size": 16}, source="grpo.yaml")
    run, config = split_spec({**BASE, "generation_batch_size": 8, "num_generations": 4}, source="grpo.yaml")
    assert (config.prompts_per_step, config.micro_batch_size) == (2, 8)
    # TRL's engine: TRL's own field, as TRL reads it
    run, config = split_spec({**yaml_batch, "engine": "trl", "generation_batch_size": 16}, source="grpo.yaml")
    assert run.trl["generation_batch_size"] == 16


def test_the_table_in_docs_is_generated_from_the_verdicts():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "docs", "trl-yaml.md")).read()
    assert "<!-- trl-options: generated by scripts/gen_config_docs.py -->" in text
    for name, reason in list(REFUSED.items())[:3] + list(NO_EFFECT.items())[:3]:
        assert f"| `{name}` | {reason} |" in text
    result = subprocess.run([sys.executable, os.path.join(root, "scripts", "gen_config_docs.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, "docs/trl-yaml.md's table is stale: run python scripts/gen_config_docs.py"


def test_disable_dropout_means_the_same_on_both_engines(tiny_model_path, tmp_path):
    """gtpo's trainer trains without dropout: disable_dropout (TRL's name) is true by default and goes to TRL's engine
    as it is, so a LoRA adapter's dropout applies on neither; false is refused on gtpo's engine before the model
    loads, and trains with dropout on TRL's."""
    from gtpo.app.training import load_run_inputs
    from gtpo.integrations.trl import TRLGTPOConfig

    assert GTPOConfig().disable_dropout is True
    args = TRLGTPOConfig.from_gtpo_config(GTPOConfig(output_dir=str(tmp_path)), use_cpu=True)
    assert args.disable_dropout is True
    args = TRLGTPOConfig.from_gtpo_config(GTPOConfig(output_dir=str(tmp_path), disable_dropout=False), use_cpu=True)
    assert args.disable_dropout is False
    spec = {"model": str(tmp_path / "no-such-model"), "dataset": "no-such-file.jsonl", "reward_funcs": ["format"],
            "disable_dropout": False}
    with pytest.raises(ConfigError, match=r"^grpo.yaml: GTPOConfig.disable_dropout=False: gtpo's trainer trains "
                                          r"without dropout"):
        load_run_inputs(spec, source="grpo.yaml")  # before the data or the model is read


def test_intervals_as_fractions_of_the_run_mean_what_they_mean_to_transformers():
    """logging_steps / save_steps / eval_steps below 1 are a fraction of the run, rounded up (transformers'
    math.ceil(max_steps * x)); whole floats are counts; anything else is refused naming the field."""
    config = GTPOConfig(logging_steps=0.1, save_steps=0.25, eval_steps=0.34, max_steps=10)
    assert [config.every(n, 10) for n in ("logging_steps", "save_steps", "eval_steps")] == [1, 3, 4]
    assert GTPOConfig(save_steps=3.0).save_steps == 3 and GTPOConfig(save_steps=0.5).every("save_steps", 7) == 4
    assert GTPOConfig(logging_steps=0.5).every("eval_steps", 8) == 4  # unset eval_steps: logging_steps (TRL's rule)
    for name, bad in (("save_steps", 1.5), ("logging_steps", 0), ("eval_steps", -0.5)):
        with pytest.raises(ValueError, match=rf"GTPOConfig.{name} must be"):
            GTPOConfig(**{name: bad})
    from gtpo.integrations.trl import TRLGTPOConfig

    args = TRLGTPOConfig.from_gtpo_config(GTPOConfig(save_steps=0.5, eval_steps=0.25, num_iterations=2), use_cpu=True)
    assert (args.save_steps, args.eval_steps) == (0.5, 0.25)  # the same fraction of TRL's (optimizer-step) run


def test_lora_task_type_other_than_causal_lm_is_refused_naming_the_file():
    with pytest.raises(ConfigError, match=r"^grpo.yaml: lora_task_type: only CAUSAL_LM is trained here .*'SEQ_CLS'"):
        split_spec({**BASE, "use_peft": True, "lora_task_type": "SEQ_CLS"}, source="grpo.yaml")
    assert split_spec({**BASE, "use_peft": True, "lora_task_type": "CAUSAL_LM"}, source="grpo.yaml")[0].peft
