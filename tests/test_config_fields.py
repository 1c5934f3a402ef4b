"""Each GTPOConfig field's facts in one place: its declaration (``gtpo.config._f``) carries its role on TRL's engine
and on verl, whether a resume may change it, whether it is a GTPO switch and its default rule; the lists of fields by
role are read from there, and both engines resolve a None through the same rule (``gtpo.config.resolved``)."""

from __future__ import annotations

import dataclasses

import pytest

from gtpo.config import (LOSS_TYPES, SHARED_VLLM_FIELDS, TRL_ROLES, VERL_ROLES, GTPOConfig, field_default,
                         fields_where, resolved)


def undeclared(cls) -> list[str]:
    """The fields of ``cls`` that do not say what they are on each engine (no ``trl`` / ``verl`` role)."""
    return [f.name for f in dataclasses.fields(cls)
            if f.metadata.get("trl") not in TRL_ROLES or f.metadata.get("verl") not in VERL_ROLES]


def test_every_field_declares_its_roles():
    assert undeclared(GTPOConfig) == []
    for f in dataclasses.fields(GTPOConfig):
        facts = f.metadata
        assert facts["help"], f.name
        assert (facts["trl"] == "renamed") == bool(facts["trl_name"]), f.name
        assert (facts["verl"] == "owned") == bool(facts["verl_option"]), f.name
        if facts["switch_off"] is not None:  # a switch's default leaves a baseline as it is
            assert field_default(f.name) in facts["switch_off"], f.name


def test_a_field_declared_without_a_role_is_caught():
    @dataclasses.dataclass
    class Grown(GTPOConfig):
        new_knob: int = dataclasses.field(default=3, metadata={"help": "a field someone forgot to place"})

    assert undeclared(Grown) == ["new_knob"]
    with pytest.raises(TypeError, match="trl"):  # the declaration helper refuses it outright
        from gtpo.config import _f

        _f(3, "no roles")
    with pytest.raises(ValueError, match="trl_name"):
        from gtpo.config import _f

        _f(3, "renamed without its TRL name", trl="renamed", verl="engine")


def test_lists_by_role_are_read_from_the_declarations():
    from gtpo.trainer import RESUMABLE_CHANGES

    assert set(SHARED_VLLM_FIELDS) == {"use_vllm", "vllm_gpu_memory_utilization", "vllm_max_model_length",
                                       "vllm_enable_sleep_mode", "vllm_importance_sampling_correction",
                                       "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
                                       "vllm_importance_sampling_clip_min"}
    assert GTPOConfig.GTPO_SWITCHES == {"conflict_masks": (None, False), "entropy_filter": (None, False),
                                        "gamma": (None, 0.0), "completion_sign": ("all",)}
    assert RESUMABLE_CHANGES == frozenset(fields_where("resumable", True))
    assert {"max_steps", "save_steps", "eval_k", "vllm_enforce_eager"} <= RESUMABLE_CHANGES
    assert not {"learning_rate", "seed", "gamma", "temperature", "group_size"} & RESUMABLE_CHANGES
    with pytest.raises(ValueError, match="unknown fact"):
        fields_where("colour", "red")


def test_trl_roles_agree_with_the_installed_trl():
    trl = pytest.importorskip("trl")
    from gtpo.integrations.trl import ENGINE_ONLY, GTPO_METHOD_FIELDS, RENAMED, SAME_FIELDS, UNAVAILABLE

    trl_names = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    for role in ("same", "when_set", "converted"):  # TRL has a field of that name
        assert set(fields_where("trl", role)) <= trl_names, role
    for role in ("method", "renamed", "unavailable"):  # TRL has none of that name
        assert not set(fields_where("trl", role)) & trl_names, role
    assert GTPO_METHOD_FIELDS == fields_where("trl", "method") and SAME_FIELDS == fields_where("trl", "same")
    assert RENAMED["group_size"] == "num_generations" and RENAMED["warmup_ratio"] == "warmup_steps"
    assert "decode_loop" in ENGINE_ONLY and UNAVAILABLE == ("dynamic_sampling",)


def test_same_fields_reach_trl_unchanged(tmp_path):
    pytest.importorskip("trl")
    from gtpo.integrations.trl import SAME_FIELDS, TRLGTPOConfig

    changed = dict(seed=7, temperature=0.7, top_p=0.9, top_k=5, repetition_penalty=1.1, learning_rate=3e-5,
                   lr_scheduler_type="linear", weight_decay=0.05, adam_beta1=0.8, adam_beta2=0.99, adam_epsilon=1e-6,
                   max_grad_norm=0.5, epsilon=0.3, max_completion_length=32, logging_steps=3, run_name="r",
                   num_completions_to_print=2, save_total_limit=4, reward_weights=[1.0, 0.5], disable_tqdm=True,
                   mask_truncated_completions=True, optim="adamw_torch", output_dir=str(tmp_path))
    config = GTPOConfig(**changed)
    args = TRLGTPOConfig.from_gtpo_config(config, use_cpu=True)
    for name in SAME_FIELDS:
        assert getattr(args, name) == getattr(config, name), name


# ------------------------------------------------------------------------------------- default rules
def test_rules_decide_none_from_the_other_fields():
    assert resolved(GTPOConfig(loss_type="dr_grpo"), "scale_rewards") == "none"
    assert resolved(GTPOConfig(loss_type="dapo"), "scale_rewards") == "group"
    assert GTPOConfig(loss_type="gtpo").resolved_gamma == 0.1 and GTPOConfig(loss_type="grpo").resolved_gamma == 0.0
    assert GTPOConfig(loss_type="grpo").resolved_loss_aggregation == "seq_mean_token_mean"
    assert GTPOConfig(loss_type="gtpo").resolved_loss_aggregation is None
    assert GTPOConfig(temperature=0.9).resolved_logprob_temperature == 0.9
    assert GTPOConfig(max_prompt_length=10, max_completion_length=20,
                      eval_max_new_tokens=30).resolved_vllm_max_model_length == 40
    assert GTPOConfig(bf16=True).requested_dtype == "bfloat16"
    assert GTPOConfig(eval_max_new_tokens=None, max_completion_length=17).resolved_eval_max_new_tokens == 17
    # a run's run_config.json: missing keys read as GTPOConfig's defaults (report.py reads old runs this way)
    assert resolved({}, "entropy_filter") is True
    assert resolved({"loss_type": "grpo"}, "entropy_filter") is False
    assert resolved({"loss_type": "grpo", "entropy_filter": True}, "entropy_filter") is True


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_scale_rewards_default_is_the_same_on_both_engines(tmp_path, loss_type):
    """The same YAML means the same on both engines: a None scale_rewards is GTPOConfig's rule on TRL's engine too
    (it was 'group' for dr_grpo on TRLGTPOConfig, 'none' on gtpo's engine)."""
    pytest.importorskip("trl")
    from gtpo.integrations.trl import TRLGTPOConfig

    expected = GTPOConfig(loss_type=loss_type).resolved_scale_rewards
    assert expected == ("group" if loss_type in ("grpo", "dapo") else "none")
    args = TRLGTPOConfig(output_dir=str(tmp_path), use_cpu=True, loss_type=loss_type)
    assert args.scale_rewards == expected  # what TRL's GRPOTrainer reads


def test_dr_grpo_yaml_scales_rewards_alike_on_both_engines(tmp_path):
    """A YAML with ``loss_type: dr_grpo`` and no scale_rewards, read as ``gtpo train`` reads it for each engine: gtpo's
    trainer scales by ``config.resolved_scale_rewards``, TRL's engine by the ``scale_rewards`` of the TRL config it
    builds (``run_trl_training``: ``TRLGTPOConfig.from_gtpo_config``); both are 'none' (Dr. GRPO drops the std)."""
    pytest.importorskip("trl")
    from gtpo.app.spec import split_spec
    from gtpo.integrations.trl import TRLGTPOConfig

    yaml = {"model": "m", "dataset": "gsm8k", "loss_type": "dr_grpo", "output_dir": str(tmp_path)}
    _, gtpo_config = split_spec(dict(yaml), source="run.yaml")
    run, trl_config = split_spec({**yaml, "engine": "trl"}, source="run.yaml")
    args = TRLGTPOConfig.from_gtpo_config(trl_config, use_cpu=True, **run.trl)
    assert gtpo_config.resolved_scale_rewards == "none"
    assert args.loss_type == "dr_grpo" and args.scale_rewards == "none"
    # a TRL-style config naming TRL's own loss types keeps TRL's default
    assert TRLGTPOConfig(output_dir=str(tmp_path), use_cpu=True, loss_type="bnpo").scale_rewards == "group"


def test_a_choice_field_is_validated_from_its_declaration_alone():
    """A field that declares ``choices`` in its ``_f`` is checked against them (naming the field, the values and its
    note) and listed in FIELD_CHOICES, with no other edit: what a new choice field needs is its declaration."""
    import dataclasses

    from gtpo.config import FIELD_CHOICES, GTPOConfig, _f
    from gtpo.errors import ConfigValueError

    @dataclasses.dataclass
    class WithNewField(GTPOConfig):
        new_choice: str = _f("a", "A new choice field.", trl="gtpo_engine", verl="engine", choices=("a", "b"),
                             choices_note="'a': the first")

    assert WithNewField(new_choice="b").new_choice == "b"
    with pytest.raises(ConfigValueError, match=r"^GTPOConfig.new_choice must be one of \['a', 'b'\] \('a': the first\), "
                                               r"got 'c'$") as err:
        WithNewField(new_choice="c")
    assert err.value.field == "new_choice"
    assert {f.name: f.metadata["choices"] for f in dataclasses.fields(GTPOConfig)
            if f.metadata["choices"] is not None} == FIELD_CHOICES
    assert FIELD_CHOICES["save_dtype"] == ("auto", "float32") and len(FIELD_CHOICES) == 22
    assert FIELD_CHOICES["save_strategy"] == ("no", "steps", "epoch", "best")
    assert FIELD_CHOICES["hub_strategy"] == ("every_save", "end", "checkpoint", "all_checkpoints")
