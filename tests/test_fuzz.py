"""Property tests: random configs and random reward outputs give a clean run or a clear error.

"Clear" means an exception the CLI reports without a traceback (``ValueError`` and its subclasses
``ConfigError`` and ``RewardFunctionError``) whose message names what was wrong: the config field
or the reward function. Never a ``TypeError``/``AttributeError``/``KeyError``/``OverflowError``
from deep inside. Bounded: a few dozen examples each, one step of a ~100k-parameter model.
"""

import copy
import dataclasses
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gtpo import GTPOConfig, GTPOTrainer
from gtpo import config as config_module
from gtpo.app import split_spec
from gtpo.cli import main
from gtpo.errors import ConfigError
from gtpo.errors import RewardFunctionError

FIELDS = {f.name: f for f in dataclasses.fields(GTPOConfig)}
CHOICES = {
    "loss_type": config_module.LOSS_TYPES, "loss_aggregation": config_module.AGGREGATIONS,
    "scale_rewards": config_module.SCALE_REWARDS, "entropy_rule": config_module.ENTROPY_RULES,
    "entropy_filter_scope": config_module.FILTER_SCOPES, "conflict_combine": config_module.CONFLICT_COMBINE,
    "conflict_count": config_module.CONFLICT_COUNT, "completion_reduction": config_module.COMPLETION_REDUCTIONS,
    "report_to": config_module.REPORT_TARGETS, "lr_scheduler_type": ("cosine", "linear", "constant"),
}
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# any YAML-like value: scalars of every kind, nested lists and mappings
anything = st.recursive(
    st.none() | st.booleans() | st.integers(-(10 ** 30), 10 ** 30) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=2),
    max_leaves=6,
)


def plausible(name):
    """Values near the valid range of field ``name`` (so that valid configs and boundaries are common)."""
    kind = FIELDS[name].type
    options = []
    if name in CHOICES:
        options.append(st.sampled_from(CHOICES[name]))
    if "bool" in kind:
        options.append(st.booleans())
    if "int" in kind:
        options.append(st.integers(-2, 20))
    if "float" in kind:
        options.append(st.floats(-1.0, 3.0) | st.sampled_from([0.0, 1.0, math.inf, -math.inf, math.nan]))
    if "list" in kind:
        options.append(st.lists(st.integers(-1, 5) | st.floats(-1, 2), max_size=3))
    if "None" in kind:
        options.append(st.none())
    return st.one_of(anything, st.one_of(options), st.one_of(options))  # two thirds near the valid range


def as_command_line(value):
    """A value as a user would type it after ``--field`` (YAML flow style)."""
    import yaml

    return yaml.safe_dump(value, default_flow_style=True).replace("\n...", "").strip()


config_specs = st.lists(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=4, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({n: plausible(n) for n in names}))


def named_field(message, spec):
    """The config keys of ``spec`` that ``message`` names (as ``GTPOConfig.<key>``, ``<key>`` or ``--<key>``)."""
    return [k for k in spec if re.search(rf"(?<![A-Za-z_]){re.escape(k)}(?![A-Za-z_])", message)]


# ----------------------------------------------------------------------------- configs
@pytest.mark.parametrize("spec, named", [
    ({"generation_batch_size": None, "group_size": [None]}, "group_size"),  # was a TypeError
    ({"generation_batch_size": 8, "group_size": 3}, "generation_batch_size"),  # named neither field
    ({"per_device_train_batch_size": "8"}, "per_device_train_batch_size"),
    ({"gradient_accumulation_steps": 0, "num_generations": 4}, "gradient_accumulation_steps"),
])
def test_trl_batch_with_gtpo_names_names_the_field(spec, named):
    # found by the fuzz test below: TRL's batch fields beside gtpo's group_size
    with pytest.raises(ConfigError) as err:
        split_spec(spec, source="fuzz.yaml")
    assert str(err.value).startswith("fuzz.yaml: ") and named in named_field(str(err.value), spec), str(err.value)


@FUZZ
@given(spec=config_specs)
def test_random_yaml_config_is_valid_or_names_the_field(spec):
    try:
        run, config = split_spec(spec, source="fuzz.yaml")
    except ConfigError as err:
        event("error")
        assert str(err).startswith("fuzz.yaml: ")
        assert named_field(str(err), spec), f"{err} does not name any of {sorted(spec)}"
        return
    event("valid")
    assert isinstance(config, GTPOConfig)
    assert GTPOConfig.from_dict(config.to_dict()) == config  # a valid config survives the checkpoint round trip


@FUZZ
@given(spec=config_specs)
def test_random_python_config_is_valid_or_names_the_field(spec):
    try:
        config = GTPOConfig(**spec)
    except ValueError as err:
        event("error")
        assert named_field(str(err), spec), f"{err} does not name any of {sorted(spec)}"
        return
    event("valid")
    config.validate()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.sampled_from(sorted(FIELDS)).flatmap(lambda name: st.tuples(st.just(name), st.one_of(
    st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=10),
    plausible(name).map(as_command_line)).filter(lambda t: t and not t.startswith("--")))))
def test_random_command_line_value_is_valid_or_names_the_option(data, capsys):
    name, text = data
    code = main(["train", f"--{name}", text, "--print_config"])
    err = capsys.readouterr().err
    assert code in (0, 2)
    event(f"exit {code}")
    if code == 2:
        assert err.startswith("gtpo train: error: ") and name in err, err


@settings(max_examples=20, deadline=None)
@given(key=st.text("abcdefghijklmnopqrstuvwxyz_", min_size=2, max_size=14).filter(
    lambda k: k not in FIELDS and k not in ("model", "dataset", "eval_dataset", "reward_funcs", "eval_reward",
                                            "eval_before_after", "peft", "sft_warmup", "probes",
                                            "resume_from_checkpoint", "log_level")))
def test_unknown_keys_are_named(key):
    with pytest.raises(ConfigError, match=rf"unknown config field '{key}'"):
        split_spec({key: 1}, source="fuzz.yaml")


# ----------------------------------------------------------------------------- reward outputs
N = 4  # prompts_per_step 2 x group_size 2

good = st.one_of(  # what reward functions commonly return
    st.floats(-5, 5), st.none(), st.booleans(), st.integers(-3, 3), st.floats(-5, 5).map(np.float32),
    st.floats(-5, 5).map(lambda x: torch.tensor(x)),
)
scalar = st.one_of(
    st.none(), st.floats(), st.floats(-10, 10), st.integers(-(10 ** 400), 10 ** 400), st.booleans(),
    st.text(max_size=3), st.complex_numbers(max_magnitude=2),
    st.floats(-10, 10).map(np.float32), st.floats(-1e300, 1e300).map(np.float64), st.integers(-5, 5).map(np.int64),
    st.floats(-10, 10).map(lambda x: torch.tensor(x)), st.floats(-1, 1).map(lambda x: torch.tensor([x, x])),
    st.floats(-1, 1).map(lambda x: [x]), st.just(np.bool_(True)),
)
reward_outputs = st.one_of(
    st.lists(good, min_size=N, max_size=N),
    st.lists(good, min_size=N, max_size=N),
    st.lists(good, min_size=N, max_size=N),
    st.lists(scalar, min_size=N, max_size=N),
    st.lists(scalar, max_size=N + 2),
    st.lists(st.floats(-5, 5, width=32), min_size=N, max_size=N).map(torch.tensor),
    st.lists(st.floats(-5, 5), min_size=1, max_size=N + 2).map(np.array),
    st.lists(st.floats(-5, 5), min_size=N, max_size=N).map(lambda xs: torch.tensor(xs).reshape(2, 2)),
    scalar,
    st.dictionaries(st.text(max_size=3), st.floats(), max_size=2),
)


@pytest.fixture(scope="module")
def fuzz_trainer(tiny_model_path, tmp_path_factory):
    holder = {"out": None}

    def fuzzed(completions, **kwargs):
        out = holder["out"]
        return out(completions) if callable(out) else out

    cfg = GTPOConfig(output_dir=str(tmp_path_factory.mktemp("fuzz") / "run"), group_size=2, prompts_per_step=2,
                     max_steps=10 ** 6, max_completion_length=4, learning_rate=1e-3, save_steps=0,
                     log_completions_steps=0, disable_tqdm=True, seed=0, lr_scheduler_type="constant")
    prompts = [{"prompt": f"What is {a} + {b}?"} for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]]
    return GTPOTrainer(tiny_model_path, fuzzed, prompts, args=cfg), holder


@FUZZ
@given(out=reward_outputs)
def test_random_reward_output_gives_a_clean_step_or_names_the_function(fuzz_trainer, out):
    trainer, holder = fuzz_trainer
    holder["out"] = out
    step = trainer.global_step
    try:
        metrics = trainer.step()
    except RewardFunctionError as err:
        event("RewardFunctionError")
        assert "'fuzzed'" in str(err), str(err)
        assert trainer.global_step == step  # nothing was updated
        return
    event("clean step")
    assert trainer.global_step == step + 1
    assert math.isfinite(metrics["reward"]) and math.isfinite(metrics["rewards/fuzzed/mean"])
    assert all(torch.isfinite(p).all() for p in trainer.unwrapped_model.parameters())


# ----------------------------------------------------------------------------- algorithm configs
algorithm_configs = st.fixed_dictionaries({
    "loss_type": st.sampled_from(config_module.LOSS_TYPES),
    "scale_rewards": st.sampled_from((None,) + config_module.SCALE_REWARDS),
    "num_iterations": st.integers(1, 2),
    "micro_batch_size": st.sampled_from([None, 1, 3]),
    "entropy_filter": st.booleans(),
    "entropy_rule": st.sampled_from(config_module.ENTROPY_RULES),
    "entropy_threshold": st.sampled_from([0.0, 0.6931, 100.0]),
    "entropy_filter_scope": st.sampled_from(config_module.FILTER_SCOPES),
    "gamma": st.sampled_from([0.0, 0.1]),
    "beta": st.sampled_from([0.0, 0.04]),
    "loss_aggregation": st.sampled_from((None,) + config_module.AGGREGATIONS),
    "dynamic_sampling": st.sampled_from([None, True, False]),
    "max_resample_rounds": st.integers(0, 2),
    "overlong_buffer_length": st.integers(0, 4),
    "mask_truncated_completions": st.booleans(),
    "generation_chunk_size": st.sampled_from([None, 3]),
    "temperature": st.sampled_from([0.7, 1.0]),
    "top_k": st.sampled_from([0, 5]),
    "max_grad_norm": st.sampled_from([0.0, 1.0]),
    "conflict_combine": st.sampled_from(config_module.CONFLICT_COMBINE),
    "conflict_count": st.sampled_from(config_module.CONFLICT_COUNT),
    "completion_reduction": st.sampled_from(config_module.COMPLETION_REDUCTIONS),
    "divide_by_conflict_count": st.booleans(),
})


@pytest.fixture(scope="module")
def tiny_loaded(tiny_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_path), AutoTokenizer.from_pretrained(tiny_model_path)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(kw=algorithm_configs)
def test_random_algorithm_config_runs_a_step_or_names_the_field(tiny_loaded, tmp_path, kw):
    model, tokenizer = tiny_loaded
    try:
        cfg = GTPOConfig(output_dir=str(tmp_path / "run"), overwrite_output_dir=True, group_size=4, prompts_per_step=2,
                         max_steps=1, max_completion_length=4, learning_rate=1e-3, save_steps=0,
                         log_completions_steps=0, disable_tqdm=True, seed=0, **kw)
    except ValueError as err:
        event("config error")
        assert named_field(str(err), kw), f"{err} does not name any of {sorted(kw)}"
        return
    event("one step")

    def digits(completions, **kwargs):
        return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

    prompts = [{"prompt": f"What is {a} + {b}?"} for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]]
    trainer = GTPOTrainer(copy.deepcopy(model), digits, prompts, args=cfg, processing_class=copy.deepcopy(tokenizer))
    metrics = trainer.train()
    assert trainer.global_step == 1 and metrics["gtpo/skipped_steps"] == 0.0
    assert all(math.isfinite(metrics[k]) for k in ("loss", "reward", "entropy", "grad_norm"))
