"""configs/verl against verl's own config schema, and the start-time refusals (each names the option)."""

import pytest
from omegaconf import OmegaConf

from verl_batches import compose

pytest.importorskip("verl")

from verl.trainer.ppo.utils import need_critic, need_reference_policy  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass, validate_config  # noqa: E402

from gtpo.errors import ConfigError  # noqa: E402
from gtpo.integrations.verl import check_verl_config  # noqa: E402

NAMES = ["qwen2.5-3b-gsm8k-gtpo", "qwen2.5-3b-gsm8k-grpo"]


@pytest.mark.parametrize("name", NAMES)
def test_configs_compose_and_pass_verls_validation(name):
    # rollout.name=sglang only skips validate_config's last check (vLLM's LoRA ranks), which imports vllm
    cfg = compose(name, ["actor_rollout_ref.rollout.name=sglang"])
    assert not need_critic(cfg) and not need_reference_policy(cfg)  # no critic, no reference model (no KL)
    validate_config(cfg, use_reference_policy=False, use_critic=False)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # verl's dataclass schemas
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    twin = compose(NAMES[1 - NAMES.index(name)], ["actor_rollout_ref.rollout.name=sglang"])
    for key in ("data", "actor_rollout_ref.model", "actor_rollout_ref.rollout", "actor_rollout_ref.actor.optim",
                "reward", "trainer.total_training_steps"):  # the twins differ only in the algorithm
        a, b = (OmegaConf.to_container(OmegaConf.select(c, key)) if key != "trainer.total_training_steps"
                else OmegaConf.select(c, key) for c in (cfg, twin))
        if key == "actor_rollout_ref.rollout":  # its trace names the experiment
            a.pop("trace"), b.pop("trace")
        assert a == b, key


def test_gtpo_config_reaches_the_method_unchanged():
    g = check_verl_config(compose())
    assert (g.group_size, g.temperature, g.logprob_temperature, g.max_completion_length) == (8, 0.9, 1.0, 1500)
    assert (g.pos_weight, g.neg_weight, g.completion_reduction, g.divide_by_conflict_count) == (2.0, 0.0, "sum", True)
    assert (g.entropy_threshold, g.entropy_rule, g.gamma, g.scale_rewards) == (1.02, "fixed", 0.1, "none")
    p = check_verl_config(compose(overrides=["algorithm.gtpo={preset:paper}", "actor_rollout_ref.rollout.temperature=1.0"]))
    assert (p.completion_reduction, p.divide_by_conflict_count, p.entropy_rule, p.resolved_logprob_temperature) == \
        ("mean", False, "initial", 1.0)


@pytest.mark.parametrize("override, option", [
    ("trainer.use_v1=false", "trainer.use_v1"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode=vanilla", "actor_rollout_ref.actor.policy_loss.loss_mode"),
    ("actor_rollout_ref.actor.loss_agg_mode=token-sum", "actor_rollout_ref.actor.loss_agg_mode"),
    ("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm", "actor_rollout_ref.actor.loss_agg_mode"),
    ("actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.use_kl_loss"),
    ("algorithm.use_kl_in_reward=true", "algorithm.use_kl_in_reward"),
    ("actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.entropy_coeff"),
    ("algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.bypass_mode"),
    ("algorithm.rollout_correction.rollout_rs=token_k1", "algorithm.rollout_correction.rollout_rs"),
    ("algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is"),
    ("actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.temperature"),
    ("actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.ppo_epochs"),
    ("+algorithm.gtpo.group_size=4", "actor_rollout_ref.rollout.n"),
    ("+algorithm.gtpo.mask_truncated_completions=true", "mask_truncated_completions"),
    ("+algorithm.gtpo.neg_weight=-1.0", "neg_weight"),
    ("+algorithm.gtpo.learning_rate=1e-5", "algorithm.gtpo.learning_rate"),
    ("algorithm.gtpo.preset=grpo", "algorithm.gtpo.preset"),
    ("algorithm.filter_groups.enable=true", "algorithm.filter_groups.enable"),
])
def test_what_gtpo_cannot_honour_is_refused_naming_the_option(override, option):
    with pytest.raises(ConfigError, match=option.replace(".", r"\.")):
        check_verl_config(compose(overrides=[override]))
