"""GTPO on verl (``pip install gtpo[verl]``): a plug-in, no fork -- the advantage estimator, the policy loss and
the trainer mode ``gtpo``, registered in verl's own registries when ``import verl`` loads the ``verl.plugins`` entry
point of this package (verl 0.9.1; ``VERL_USE_EXTERNAL_PLUGINS=none`` turns that loading off, then import this
module yourself). A verl user sets three keys::

    algorithm.adv_estimator=gtpo  actor_rollout_ref.actor.policy_loss.loss_mode=gtpo  trainer.v1.trainer_mode=gtpo

and, optionally, GTPO's preset and method fields under ``algorithm.gtpo`` (``+algorithm.gtpo.preset=paper`` on the
command line; default ``official``). Loss mode ``gtpo`` reduces as GTPO does (a token mean per completion, then
the mean over the mini-batch's completions) whether ``actor_rollout_ref.actor.loss_agg_mode`` is verl's default
``token-mean`` or ``seq-mean-token-mean`` (verl then uses that key only for its entropy metrics); the sum modes
(``token-sum``, ``seq-mean-token-sum``, ``seq-mean-token-sum-norm``) name another reduction and are refused.

The method is gtpo's, never a copy: :mod:`gtpo.maths.method` composes it (the conflict inputs of whole groups from the
UNSHAPED advantage signs, the entropy filter, ⟨H⟩_ini and the gamma shift, :func:`gtpo.maths.method.token_advantages`) and
``gtpo.maths.losses.POLICY_LOSSES["gtpo"]`` is the loss, as in gtpo's own trainer and the TRL engine.

Where each step happens (verl 0.9.1, v1 trainer, ``verl/trainer/ppo/v1/trainer_base.py``):

1. The rollout policy's per-token entropies: verl computes them in its old-log-prob pass
   (``PPOTrainer._compute_old_log_prob``, ``calculate_entropy=True``) and writes them to the TransferQueue as
   ``entropy``, but its ``_compute_advantage`` reads neither them nor the completions' token ids ``responses``.
   :class:`GTPOTrainer` (trainer mode ``gtpo``, a ``PPOTrainerSync``) runs the same advantage step with those two
   fields too and calls :func:`gtpo_token_level_advantages`.
2. The advantage step runs on the single controller over the whole rollout batch, after verl's batch balancing
   reordered the rows: rows are grouped by ``uid`` (:func:`group_rows`), every group must have
   ``actor_rollout_ref.rollout.n`` rows (verl's synthetic padding rows, which have no loss token, are left at 0).
   Per group: rewards (``rm_scores`` summed), :func:`gtpo.maths.advantages.group_advantages` (``scale_rewards``), the
   conflict weights and counts on the response mask, the rows' mean token entropies ``<H>_i``, the filter and
   shift (⟨H⟩_ini from the first batch with the ``initial`` rule, kept in the checkpoint), then TOKEN-level
   advantages ``A_it = s * a_i * lambda_it / max(n_i, 1)`` (``s = G`` for ``completion_reduction="sum"``).
3. verl shuffles and splits the batch into mini-batches (one optimizer step each, ``ppo_mini_batch_size *
   rollout.n`` rows) and micro-batches (``ppo_micro_batch_size_per_gpu`` rows, or token-balanced with
   ``use_dynamic_bsz``); :func:`compute_policy_loss_gtpo` (loss mode ``gtpo``) is the PPO-clip surrogate without
   verl's dual clip, reduced as ``seq-mean-token-mean`` over the GLOBAL mini-batch (verl's
   ``global_batch_info``: micro-batch losses divided by the mini-batch's row count, times ``dp_size`` because
   FSDP / Megatron average gradients over data-parallel ranks). Each optimizer step is then GTPO's loss over its
   mini-batch, whatever the row order and the micro-batch split: with ``lambda >= 0`` the token-level advantages
   commute with the clip's ``min`` (:func:`gtpo.maths.method.token_advantages`). With ``ppo_mini_batch_size =
   data.train_batch_size`` and ``ppo_epochs = 1`` (the configs in ``configs/verl/``) it is one GTPO update per
   rollout batch, as in the reference code.
4. The log-prob temperature: verl computes the old and the training log-probs (and the entropies) at
   ``actor_rollout_ref.rollout.temperature``; a ``logprob_temperature`` other than the rollout temperature (the
   official preset: sampling at 0.9, log-probs from the raw logits) is honoured by :class:`GTPOTrainer`, which runs
   those two passes at it (the rollout itself keeps sampling at the rollout temperature).

Refused at start (:func:`check_verl_config`, a :class:`~gtpo.errors.ConfigError` naming the option): verl's legacy
trainer (``trainer.use_v1=false``), another estimator / loss / aggregation with trainer mode ``gtpo``, a KL loss or
KL reward, an entropy bonus, PF-PPO reweighting, distillation, rollout-correction bypass mode and rejection sampling (they change
the policies or masks GTPO's inputs are computed from), rollout IS weights with a log-prob temperature other than
the rollout temperature, GTPO fields verl does not implement (``mask_truncated_completions``, the overlong
penalty, dynamic sampling unless ``algorithm.filter_groups`` matches), and GTPO settings that disagree with verl's
own (``group_size`` vs ``rollout.n``, ``temperature``, ``max_completion_length``, ``epsilon`` / ``epsilon_high``
vs the clip ratios, ``num_iterations`` vs ``ppo_epochs``).
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
import os
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..config import GTPOConfig, fields_where
from ..errors import ConfigError
from ..maths import method
from ..maths.advantages import group_advantages
from ..maths.losses import POLICY_LOSSES, LossExtras

logger = logging.getLogger("gtpo")

#: the verl releases this module is tested with (pyproject's ``verl`` extra)
TESTED_VERL = ("0.9.1", "0.10")
#: ``actor.loss_agg_mode`` values loss mode ``gtpo`` accepts: it reduces as GTPO whichever (verl aggregates only
#: its entropy metrics with the key); the sum modes name another reduction of the loss and are refused
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean")


def _loss_agg_refusal(mode: str) -> str:
    """The error for an ``actor.loss_agg_mode`` outside :data:`LOSS_AGG_MODES` (at start and in the loss)."""
    return (f"actor_rollout_ref.actor.loss_agg_mode: loss mode gtpo reduces as GTPO (a token mean per completion, "
            f"then a mean over completions); use one of {LOSS_AGG_MODES}, got {mode!r}")

try:
    import verl
    import transfer_queue as tq
    from omegaconf import DictConfig, OmegaConf, open_dict
    from tensordict import TensorDict
    from verl.protocol import DataProto
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer, register_trainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.workers.utils.padding import response_to_nested
except ImportError as _err:  # verl logs entry-point failures at debug level only: say it here
    logger.warning("gtpo.integrations.verl: not registered in verl (%s); it needs verl %s and TransferQueue "
                   "(pip install 'gtpo[verl]')", _err, TESTED_VERL[0])
    raise ImportError(f"gtpo.integrations.verl needs verl >= {TESTED_VERL[0]}, < {TESTED_VERL[1]} with its v1 trainer "
                      f"and TransferQueue (pip install 'gtpo[verl]'); importing them failed: {_err}") from _err

__all__ = ["GTPOTrainer", "LOSS_AGG_MODES", "TESTED_VERL", "VERL_OWNED", "VerlAdvantages", "check_verl_config",
           "compute_gtpo_advantage", "compute_policy_loss_gtpo", "gtpo_config_from_verl",
           "gtpo_token_level_advantages", "group_rows", "missing_verl_api"]

#: what this module uses of verl beyond its registries' documented signatures (checked at import)
_USED = {
    "verl.trainer.ppo.core_algos": ("register_adv_est", "register_policy_loss", "get_adv_estimator_fn",
                                    "get_policy_loss_fn", "agg_loss"),
    "verl.trainer.ppo.v1.trainer_base": ("register_trainer", "get_trainer_cls"),
}
_OVERRIDDEN = ("_compute_advantage", "_compute_old_log_prob", "_update_actor", "_save_checkpoint", "_load_checkpoint")


def missing_verl_api() -> list[str]:
    """The names this module needs that the installed verl lacks."""
    import importlib

    missing = []
    for module_name, names in _USED.items():
        module = importlib.import_module(module_name)
        missing += [f"{module_name}.{n}" for n in names if not hasattr(module, n)]
    missing += [f"PPOTrainer.{n}" for n in _OVERRIDDEN if not hasattr(PPOTrainer, n)]
    missing += [f"transfer_queue.{n}" for n in ("kv_batch_get", "kv_batch_put") if not hasattr(tq, n)]
    return missing


_missing = missing_verl_api()
if _missing:  # pragma: no cover - depends on the installed verl
    logger.warning("gtpo.integrations.verl: not registered in verl %s (it lacks %s)", verl.__version__, _missing)
    raise ImportError(f"gtpo.integrations.verl supports verl >= {TESTED_VERL[0]}, < {TESTED_VERL[1]}; verl "
                      f"{verl.__version__} lacks {_missing}")

# ------------------------------------------------------------------------------------------ config
# Each GTPOConfig field declares what it is on verl (its ``verl`` role, gtpo.config.VERL_ROLES); these are read from
# the declarations.
#: GTPOConfig fields that verl sets with its own options (GTPOConfig name -> verl's option); a GTPO preset or
#: ``algorithm.gtpo`` may set them only to verl's value
VERL_OWNED = {name: GTPOConfig.__dataclass_fields__[name].metadata["verl_option"]
              for name in fields_where("verl", "owned")}
#: GTPOConfig fields that ``algorithm.gtpo`` may set (the method's); every other field is an engine's setting
#: that verl configures its own way
_METHOD_FIELDS = fields_where("verl", "method")


def _select(config, path: str, default: Any = None) -> Any:
    value = OmegaConf.select(config, path, default=default) if isinstance(config, DictConfig) else default
    return value


def _verl_values(config) -> dict[str, Any]:
    """verl's values of :data:`VERL_OWNED`."""
    actor = "actor_rollout_ref.actor."
    low = _select(config, actor + "clip_ratio_low")
    high = _select(config, actor + "clip_ratio_high")
    clip = _select(config, actor + "clip_ratio", 0.2)
    return {
        "group_size": _select(config, "actor_rollout_ref.rollout.n"),
        "temperature": float(_select(config, "actor_rollout_ref.rollout.temperature", 1.0)),
        "max_completion_length": _select(config, "data.max_response_length"),
        "epsilon": float(clip if low is None else low),
        "epsilon_high": float(clip if high is None else high),
        "num_iterations": _select(config, actor + "ppo_epochs", 1),
    }


def gtpo_config_from_verl(config) -> GTPOConfig:
    """The :class:`~gtpo.GTPOConfig` of a verl run: the preset ``algorithm.gtpo.preset`` (default ``official``),
    the method fields of ``algorithm.gtpo`` on top, and :data:`VERL_OWNED` from verl's options. A field set by the
    preset or ``algorithm.gtpo`` that disagrees with verl's option, or that is no method field, is a
    :class:`~gtpo.errors.ConfigError` naming both."""
    block = _select(config, "algorithm.gtpo")
    block = {} if block is None else OmegaConf.to_container(block, resolve=True)
    if not isinstance(block, dict):
        raise ConfigError(f"algorithm.gtpo: expected a mapping (preset and GTPO method fields), got {block!r}")
    block = dict(block)
    preset = block.pop("preset", "official")
    if preset not in ("official", "paper"):
        raise ConfigError(f"algorithm.gtpo.preset: expected 'official' or 'paper' (GTPO's presets; for GRPO use "
                          f"verl's algorithm.adv_estimator=grpo), got {preset!r}")
    allowed = _METHOD_FIELDS + tuple(VERL_OWNED)
    for key in block:
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"algorithm.gtpo.{key}: not a GTPO method field on verl (verl sets its engine, "
                              f"optimiser and generation settings with its own options){hint}")
    chosen = GTPOConfig.apply_preset(preset, block)
    verl_values = _verl_values(config)
    for name, value in verl_values.items():
        option = VERL_OWNED[name]
        if name in chosen and chosen[name] is not None and chosen[name] != value:
            origin = f"algorithm.gtpo.{name}" if name in block else f"the {preset!r} preset's {name}"
            raise ConfigError(f"{option}: {value!r} disagrees with {origin}={chosen[name]!r}; verl's option sets it "
                              f"on verl: make them equal (set {option}={chosen[name]!r}, or algorithm.gtpo.{name}="
                              f"{value!r})")
        chosen[name] = value
    if chosen.get("loss_type", "gtpo") != "gtpo":
        raise ConfigError(f"algorithm.gtpo.loss_type: only 'gtpo' on verl (its GRPO is adv_estimator=grpo), got "
                          f"{chosen['loss_type']!r}")
    try:
        return GTPOConfig.from_dict(chosen, source="algorithm.gtpo")
    except ValueError as err:
        raise ConfigError(f"algorithm.gtpo: {err}") from err


def check_verl_config(config) -> GTPOConfig:
    """Refuse, with a :class:`~gtpo.errors.ConfigError` naming the option, a verl config whose run GTPO cannot
    honour (the module documentation lists them); return its :func:`gtpo_config_from_verl`."""
    def need(path: str, expected: Any, why: str) -> None:
        value = _select(config, path)
        if value != expected:
            raise ConfigError(f"{path}: GTPO on verl needs {expected!r} ({why}), got {value!r}")

    if _select(config, "trainer.use_v1", True) is not True:
        raise ConfigError("trainer.use_v1: GTPO's trainer mode is a verl v1 trainer; set trainer.use_v1=true")
    need("algorithm.adv_estimator", "gtpo", "trainer mode gtpo computes GTPO's advantages")
    need("actor_rollout_ref.actor.policy_loss.loss_mode", "gtpo", "the PPO-clip surrogate without verl's dual clip, "
         "which GTPO's loss does not have")
    agg = _select(config, "actor_rollout_ref.actor.loss_agg_mode", "token-mean")
    if agg not in LOSS_AGG_MODES:
        raise ConfigError(_loss_agg_refusal(agg))
    for path, why in (("actor_rollout_ref.actor.use_kl_loss", "GTPO drops the KL term and the reference model"),
                      ("algorithm.use_kl_in_reward", "GTPO drops the KL term and the reference model"),
                      ("algorithm.use_pf_ppo", "PF-PPO reweights the batch GTPO's groups come from"),
                      ("algorithm.rollout_correction.bypass_mode",
                       "bypass mode trains on the rollout engine's log-probs, not on the trainer's")):
        if _select(config, path, False):
            raise ConfigError(f"{path}: not available with GTPO ({why}); set {path}=false")
    if float(_select(config, "actor_rollout_ref.actor.entropy_coeff", 0) or 0) != 0:
        raise ConfigError("actor_rollout_ref.actor.entropy_coeff: GTPO has no entropy bonus (its gamma is an entropy "
                          "penalty on the advantages, algorithm.gtpo.gamma); set it to 0")
    if _select(config, "distillation.enabled", False) or _select(config, "distillation.enable", False):
        raise ConfigError("distillation: not available with GTPO; disable it")
    # multi-turn / tool agent loops are welcome: their response_mask (0 on tool tokens) is GTPO's loss mask, and
    # the method runs over the model tokens only (docs/method.md, "Multi-turn completions")
    if _select(config, "algorithm.rollout_correction.rollout_rs") is not None:
        raise ConfigError("algorithm.rollout_correction.rollout_rs: rejection sampling changes the response masks "
                          "GTPO's conflict runs are computed on; set it to null (rollout_is weights are supported)")
    if (_select(config, "actor_rollout_ref.rollout.n") or 0) < 2:
        raise ConfigError(f"actor_rollout_ref.rollout.n: GTPO compares completions within a group: expected >= 2, got "
                          f"{_select(config, 'actor_rollout_ref.rollout.n')!r}")
    cfg = gtpo_config_from_verl(config)
    if cfg.mask_truncated_completions:
        raise ConfigError("algorithm.gtpo.mask_truncated_completions: not implemented on verl (its rows carry no "
                          "truncation flag); set it to false")
    if cfg.overlong_buffer_length:
        raise ConfigError("algorithm.gtpo.overlong_buffer_length: use verl's reward overlong buffer "
                          "(reward.reward_kwargs.overlong_buffer_cfg) instead; set it to 0")
    filter_groups = bool(_select(config, "algorithm.filter_groups.enable", False))
    if cfg.resolved_dynamic_sampling != filter_groups:
        raise ConfigError(f"algorithm.filter_groups.enable: {filter_groups} disagrees with GTPO's dynamic_sampling="
                          f"{cfg.resolved_dynamic_sampling} (verl's filter_groups is the dynamic sampling); make them "
                          f"equal")
    if cfg.resolved_conflict_masks and (cfg.pos_weight < 0 or cfg.neg_weight < 0):
        raise ConfigError(f"algorithm.gtpo.pos_weight / neg_weight: verl's token-level advantages need conflict "
                          f"weights >= 0, got {cfg.pos_weight}, {cfg.neg_weight}")
    if (_select(config, "algorithm.rollout_correction.rollout_is") is not None
            and cfg.resolved_logprob_temperature != cfg.temperature):
        raise ConfigError(f"algorithm.rollout_correction.rollout_is: the rollout's log-probs (temperature "
                          f"{cfg.temperature}) do not compare with GTPO's training log-probs at logprob_temperature "
                          f"{cfg.resolved_logprob_temperature}; set it to null or algorithm.gtpo.logprob_temperature="
                          f"null")
    return cfg


# ------------------------------------------------------------------------------------------ advantages
def group_rows(index, response_mask: Tensor, group_size: int) -> Tensor:
    """``(M,)`` int64 row indices that put the rows of each ``uid`` group side by side (groups in order of first
    appearance, rows in batch order): ``index (N,)`` the rows' group ids (verl's ``uid``), ``response_mask (N, T)``.
    Groups without any response token (verl's synthetic padding rows) are left out; every other group must have
    ``group_size`` rows (ValueError naming the uid)."""
    ids = np.asarray(index, dtype=object)
    if ids.shape != (response_mask.shape[0],):
        raise ValueError(f"index: expected one uid per row ({response_mask.shape[0]},), got shape {ids.shape}")
    groups: dict[Any, list[int]] = {}
    for row, uid in enumerate(ids.tolist()):
        groups.setdefault(uid, []).append(row)
    has_tokens = (response_mask.sum(dim=1) > 0).tolist()
    order: list[int] = []
    for uid, rows in groups.items():
        if not any(has_tokens[r] for r in rows):
            continue
        if len(rows) != group_size:
            raise ValueError(f"index: group uid={uid!r} has {len(rows)} rows, expected actor_rollout_ref.rollout.n = "
                             f"{group_size} (GTPO needs whole groups)")
        order += rows
    return torch.tensor(order, dtype=torch.long)


class VerlAdvantages(NamedTuple):
    """``advantages (N, T)`` float32 token-level advantages in verl's row order (0 outside the response mask and on
    rows of groups left out); ``initial_entropy``: ⟨H⟩_ini used (None unless the ``initial`` rule applies);
    ``metrics``: floats (``gtpo/conflict_frac``, ``gtpo/n_conflict_mean``, ``gtpo/filtered_frac``, ...)."""

    advantages: Tensor
    initial_entropy: float | None
    metrics: dict[str, float]


def gtpo_token_level_advantages(token_level_rewards: Tensor, response_mask: Tensor, index, responses: Tensor,
                                entropy: Tensor | None, gtpo_config: GTPOConfig, *,
                                initial_entropy: float | None = None) -> VerlAdvantages:
    """GTPO's token-level advantages of a verl batch (:mod:`gtpo.maths.method` on the rows grouped by ``uid``).

    Args:
        token_level_rewards: ``(N, T)`` verl's rewards (``rm_scores``); a row's reward is their sum.
        response_mask: ``(N, T)`` the loss mask (after verl's rollout correction, when any).
        index: ``(N,)`` the rows' ``uid``.
        responses: ``(N, T)`` the completions' token ids.
        entropy: ``(N, T)`` the rollout policy's per-token entropies (verl's old-log-prob pass); needed with entropy
            control.
        gtpo_config: :func:`gtpo_config_from_verl`.
        initial_entropy: ⟨H⟩_ini when known; None with the ``initial`` rule measures it on this batch.
    """
    cfg, G = gtpo_config, gtpo_config.group_size
    n_rows, width = response_mask.shape
    for name, value in (("token_level_rewards", token_level_rewards), ("responses", responses), ("entropy", entropy)):
        if value is not None and tuple(value.shape) != (n_rows, width):
            raise ValueError(f"{name}: expected the response mask's shape {(n_rows, width)}, got {tuple(value.shape)}")
    order = group_rows(index, response_mask, G).to(response_mask.device)
    out = torch.zeros(n_rows, width, dtype=torch.float32, device=response_mask.device)
    if order.numel() == 0:
        return VerlAdvantages(out, initial_entropy, {})
    mask = method.loss_mask(response_mask[order], None, mask_truncated_completions=False)  # (M, T)
    rewards = token_level_rewards[order].float().sum(dim=1)  # (M,)
    adv = group_advantages(rewards, G, scale=cfg.resolved_scale_rewards)
    inputs = method.group_inputs(responses[order].long(), mask, adv, cfg)
    seq_entropy = None
    if cfg.entropy_control:
        if entropy is None:
            raise ValueError("entropy: GTPO's entropy filter / gamma shift need the rollout policy's per-token "
                             "entropies (verl's old-log-prob pass writes them: trainer.v1.trainer_mode=gtpo)")
        seq_entropy = method.completion_entropy(entropy[order], mask)
    if method.uses_initial_entropy(cfg) and initial_entropy is None:
        initial_entropy = method.initial_entropy_value(method.initial_entropy_sums(seq_entropy, mask))
    initial = initial_entropy if method.uses_initial_entropy(cfg) else None
    eff = method.effective_advantages(adv, seq_entropy, cfg, initial_entropy=initial, shift_mask=inputs.shift_mask,
                                      sign_rows=inputs.sign_mask)
    out[order] = method.token_advantages(eff.advantages, inputs, mask, cfg)
    metrics = {k: float(v) for k, v in eff.metrics.items()}
    if inputs.token_weights is not None:
        s = method.conflict_stats(inputs, mask)
        metrics["gtpo/conflict_frac"] = float(s[0] / s[1].clamp(min=1))
        metrics["gtpo/n_conflict_mean"] = float(s[2] / s[3].clamp(min=1))
        metrics["gtpo/weighted_token_frac"] = float(((inputs.token_weights != 1).float() * mask).sum()
                                                    / mask.sum().clamp(min=1))
    if initial is not None:
        metrics["gtpo/initial_entropy"] = float(initial)
    return VerlAdvantages(out, initial_entropy if method.uses_initial_entropy(cfg) else None, metrics)


@core_algos.register_adv_est("gtpo")
def compute_gtpo_advantage(token_level_rewards: Tensor, response_mask: Tensor, index=None, config=None, *,
                           responses: Tensor | None = None, entropy: Tensor | None = None,
                           gtpo_config: GTPOConfig | None = None, initial_entropy: float | None = None,
                           **kwargs) -> tuple[Tensor, Tensor]:
    """verl's advantage-estimator signature (``algorithm.adv_estimator=gtpo``): ``(advantages, returns)``, both the
    token-level advantages of :func:`gtpo_token_level_advantages`. verl's own trainers call estimators without the
    completions' token ids and entropies GTPO needs: this estimator runs under ``trainer.v1.trainer_mode=gtpo``
    (:class:`GTPOTrainer`), which passes them."""
    if responses is None or gtpo_config is None or index is None:
        raise ValueError("algorithm.adv_estimator=gtpo: GTPO's advantages need the completions' token ids and the "
                         "rollout policy's entropies, which verl's own trainers do not pass to an estimator; set "
                         "trainer.v1.trainer_mode=gtpo (and trainer.use_v1=true)")
    result = gtpo_token_level_advantages(token_level_rewards, response_mask, index, responses, entropy, gtpo_config,
                                         initial_entropy=initial_entropy)
    return result.advantages, result.advantages


# ------------------------------------------------------------------------------------------ loss
@functools.lru_cache(maxsize=8)
def _loss_config(eps_low: float, eps_high: float) -> GTPOConfig:
    """``POLICY_LOSSES["gtpo"]``'s settings for token-level advantages: the clip range, the mean over completions
    (the group sum and the conflict-count division are in the advantages already)."""
    return GTPOConfig(loss_type="gtpo", epsilon=eps_low, epsilon_high=eps_high, completion_reduction="mean",
                      divide_by_conflict_count=False)


@core_algos.register_policy_loss("gtpo")
def compute_policy_loss_gtpo(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
                             loss_agg_mode: str = "seq-mean-token-mean", config=None,
                             rollout_is_weights: Tensor | None = None) -> tuple[Tensor, dict[str, Any]]:
    """verl's policy-loss signature (``actor_rollout_ref.actor.policy_loss.loss_mode=gtpo``): the PPO-clip surrogate
    of token-level ``advantages (B, T)`` without verl's dual clip, token mean per completion (for either of
    :data:`LOSS_AGG_MODES`), divided by the mini-batch's row count ``config.global_batch_info["global_batch_size"]``
    (verl's ``seq-mean-token-mean``) times ``dp_size``; ``rollout_is_weights (B, T)`` multiply the per-token loss.

    It is ``POLICY_LOSSES["gtpo"]`` with each row's sign as its advantage and ``|advantages|`` as the token weights
    (the advantages :func:`gtpo_token_level_advantages` writes have one sign per row); a row whose advantages change
    sign (an estimator like GAE) is a ValueError.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(_loss_agg_refusal(loss_agg_mode))
    if config is None:
        raise ValueError("config: loss mode gtpo reads the clip range from verl's actor config, got None")
    mask = response_mask.bool()
    adv = torch.where(mask, advantages, torch.zeros_like(advantages))
    sign = torch.sign(adv.sum(dim=1))  # (B,)
    if bool((adv * sign[:, None] < 0).any()):
        raise ValueError("advantages: loss mode gtpo needs one sign per row (GTPO's token-level advantages); a row's "
                         "advantages change sign (set algorithm.adv_estimator=gtpo)")
    clip = config.clip_ratio
    low = clip if config.clip_ratio_low is None else config.clip_ratio_low
    high = clip if config.clip_ratio_high is None else config.clip_ratio_high
    info = dict(getattr(config, "global_batch_info", None) or {})
    dp_size = info.get("dp_size") or 1
    num_sequences = info.get("global_batch_size")
    if num_sequences is None:  # as verl's agg_loss: the rows with tokens of this call
        if dp_size > 1:
            raise ValueError("config.global_batch_info: global_batch_size is required when dp_size > 1")
        num_sequences = int((mask.sum(dim=1) > 0).sum())
    extras = LossExtras(token_weights=adv.abs(), is_weights=rollout_is_weights, num_sequences=max(int(num_sequences), 1))
    out = POLICY_LOSSES["gtpo"](log_prob, old_log_prob, sign.to(log_prob.dtype), response_mask, extras,
                                _loss_config(float(low), float(high)))
    metrics = {"actor/pg_clipfrac": float(out.metrics["clipfrac"]), "actor/approx_kl": float(out.metrics["approx_kl"]),
               "actor/ratio_mean": float(out.metrics["ratio/mean"])}
    return out.loss * dp_size, metrics


# ------------------------------------------------------------------------------------------ trainer
@register_trainer("gtpo")
class GTPOTrainer(PPOTrainerSync):
    """verl's synchronous v1 trainer (``trainer.v1.trainer_mode=gtpo``) with GTPO's advantage step: the config is
    checked at construction (:func:`check_verl_config`); ``_compute_advantage`` reads the completions' token ids and
    the old-log-prob pass's entropies with verl's fields and writes GTPO's token-level advantages; the old-log-prob
    and actor passes run at GTPO's ``logprob_temperature``; ⟨H⟩_ini is kept in ``gtpo_state.json`` beside verl's
    checkpoint."""

    def __init__(self, config):
        self.gtpo_config = check_verl_config(config)
        self.gtpo_initial_entropy: float | None = None
        super().__init__(config)

    # the log-prob temperature -------------------------------------------------------------------
    @contextmanager
    def _logprob_temperature(self):
        """verl's two log-prob passes read ``actor_rollout_ref.rollout.temperature`` for their logits; GTPO's
        ``logprob_temperature`` replaces it for their duration (the rollout servers have their own copy)."""
        rollout = self.config.actor_rollout_ref.rollout
        saved, wanted = rollout.temperature, self.gtpo_config.resolved_logprob_temperature
        if wanted == saved:
            yield
            return
        with open_dict(rollout):
            rollout.temperature = wanted
        try:
            yield
        finally:
            with open_dict(rollout):
                rollout.temperature = saved

    def _compute_old_log_prob(self, batch, metrics):
        with self._logprob_temperature():
            return super()._compute_old_log_prob(batch, metrics)

    def _update_actor(self, batch, metrics):
        with self._logprob_temperature():
            return super()._update_actor(batch, metrics)

    # the advantage step -------------------------------------------------------------------------
    def _compute_advantage(self, batch, metrics: dict):
        """verl's advantage step (``PPOTrainer._compute_advantage``: the fields, rewards, rollout correction, the
        nested write-back) with GTPO's estimator, given ``responses`` and ``entropy`` too."""
        fields = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "responses", "entropy"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        nested_mask = data["response_mask"]
        data = DataProto(batch=data.to_padded_tensor())
        data.batch["token_level_scores"] = data.batch["rm_scores"]
        data.batch["token_level_rewards"] = data.batch["token_level_scores"]
        data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)

        rollout_corr = self.config.algorithm.get("rollout_correction", None)
        rollout_correction = rollout_corr is not None and "rollout_log_probs" in data.batch
        if rollout_correction:  # bypass mode and rejection sampling are refused at start
            data, is_metrics = compute_rollout_correction_and_add_to_batch(data, rollout_corr)
            metrics.update(is_metrics)

        result = gtpo_token_level_advantages(
            data.batch["token_level_rewards"], data.batch["response_mask"], data.non_tensor_batch["uid"],
            data.batch["responses"], data.batch["entropy"], self.gtpo_config,
            initial_entropy=self.gtpo_initial_entropy)
        if self.gtpo_initial_entropy is None and result.initial_entropy is not None:
            self.gtpo_initial_entropy = result.initial_entropy
        metrics.update(result.metrics)
        data.batch["advantages"] = result.advantages
        data.batch["returns"] = result.advantages

        out_fields = ["advantages", "returns"]
        if rollout_correction:
            out_fields.append("response_mask")
            if "rollout_is_weights" in data.batch:
                out_fields.append("rollout_is_weights")
        output = {f: response_to_nested(data.batch[f], nested_mask) for f in out_fields}
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                               fields=TensorDict(output, batch_size=len(batch)))

    # checkpoints --------------------------------------------------------------------------------
    def _gtpo_state_path(self, step: int) -> str:
        resume = self.config.trainer.get("resume_from_path")
        folder = resume if resume and f"global_step_{step}" in str(resume) else os.path.join(
            self.config.trainer.default_local_dir, f"global_step_{step}")
        return os.path.join(folder, "gtpo_state.json")

    def _save_checkpoint(self):
        super()._save_checkpoint()
        path = self._gtpo_state_path(self.global_steps)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            json.dump({"initial_entropy": self.gtpo_initial_entropy}, fh)

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        path = self._gtpo_state_path(self.global_steps) if self.global_steps else None
        if path is not None and os.path.exists(path):
            with open(path) as fh:
                self.gtpo_initial_entropy = json.load(fh)["initial_entropy"]
        return result

