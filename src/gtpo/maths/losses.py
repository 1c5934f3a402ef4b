"""Policy losses: GTPO and the GRPO / Dr.GRPO / DAPO baselines, one function each, one dispatch table.

Shapes: ``N`` completions (prompt-major rows ``p * G + g``), ``T`` completion tokens (right
padded), ``completion_mask (N, T)`` 1 on generated tokens incl. the first EOS.

Every loss starts from the per-token PPO-clip surrogate (Schulman et al. 2017; DAPO's clip-higher
``eps_high``)::

    r_t = exp(logp_t - old_logp_t),   l_t = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)

With ``old_logp=None`` the update is on-policy: ``r = exp(logp - stopgrad(logp))`` has value 1
and its gradient is the REINFORCE gradient ``-A grad(logp)`` (the reference GTPO code's
``ratio``) [C]. Clipping is then never active. Optional per-token weights ``token_weights``
(GTPO's conflict weights lambda, :func:`gtpo.maths.conflict.conflict_weights`) multiply ``l_t``.

* :func:`grpo_loss` (Shao et al. 2024): aggregation ``seq_mean_token_mean``, optional k3 KL to a
  reference model ``beta * k3(ref, logp)`` per token.
* :func:`dr_grpo_loss` (Liu et al. 2025): aggregation ``constant`` (sum / (max_completion_length
  * N)); its advantages are not std-scaled (chosen in :func:`gtpo.maths.advantages.group_advantages`).
* :func:`dapo_loss` (Yu et al. 2025): aggregation ``token_mean``; clip-higher via ``eps_high``.
  The KL term is accepted for ``dr_grpo`` and ``dapo`` too (as in TRL), though their papers drop it.
* :func:`gtpo_loss` (Simoni et al. 2026, arXiv 2508.03772, gtpo-method.md §4-§6): per-token
  surrogate times lambda, token mean per completion, optionally divided by ``max(n_conflict_i,
  1)`` (reference code [C]; the paper's objective has no such term [P]), then summed over the
  completions of a group and averaged over groups (reference code [C], ``completion_reduction=
  "sum"``) or averaged over completions (the paper's ``1/G`` [P], ``"mean"``). No KL (GTPO drops
  the reference model [P][C]). The advantages it receives are already shaped by the entropy
  filter and the ``-gamma <H>_i`` shift (:func:`gtpo.maths.advantages.shape_advantages`, applied by the
  trainer, which also computed lambda from the UNSHAPED signs, the reference code's order [C]).

With a sampler other than the trained model (vLLM), ``is_weights`` (detached, from
:func:`sampler_importance_weights`) multiply the per-token loss as well: the truncated importance-sampling
correction of the mismatch between the sampler and the policy (Yao et al. 2025; TRL's
``vllm_importance_sampling_correction``). Unlike ``token_weights`` they are no part of any metric.

Hyperparameters are assumed valid (:class:`gtpo.GTPOConfig` validates them once); the functions
check only what a caller can get wrong per call: tensor shapes and the tensors a setting needs.
Metrics are detached 0-dim tensors averaged over THIS micro-batch (the trainer averages them).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from ..config import DEFAULT_AGGREGATION, LOSS_TYPES, VLLM_IS_MODES, GTPOConfig
from .ops import _check_shape, _check_tensor, aggregate, masked_mean

#: ``mode`` of :func:`sampler_importance_weights` (TRL's ``vllm_importance_sampling_mode`` values)
IS_MODES = VLLM_IS_MODES

__all__ = ["IS_MODES", "LOSS_TYPES", "LossExtras", "LossOutput", "POLICY_LOSSES", "dapo_loss", "dr_grpo_loss",
           "gtpo_loss", "grpo_loss", "sampler_importance_weights"]


class LossOutput(NamedTuple):
    """``loss``: scalar, differentiable. ``metrics``: detached 0-dim tensors (``"clipfrac"``,
    ``"approx_kl"``, ``"ratio/mean"``, ``"kl"`` with ``beta > 0``, ``"gtpo/..."``)."""

    loss: Tensor
    metrics: dict[str, Tensor]


def _check_inputs(logp: Tensor, completion_mask: Tensor, advantages: Tensor, **optional: Tensor | None) -> None:
    """Shapes of the per-call tensors: ``logp (N, T)`` floating, mask ``(N, T)``, ``advantages (N,)``,
    and each optional ``(N, T)`` tensor given."""
    _check_tensor("logp", logp, ndim=2)
    if not logp.is_floating_point():
        raise ValueError(f"logp: expected a floating-point tensor, got dtype {logp.dtype}")
    N, T = logp.shape
    _check_shape("completion_mask", completion_mask, (N, T), "logp.shape (N, T)")
    _check_shape("advantages", advantages, (N,), "(N,)")
    for name, value in optional.items():
        if value is not None:
            _check_shape(name, value, (N, T), "logp.shape (N, T)")


def _surrogate(logp: Tensor, mask: Tensor, advantages: Tensor, old_logp: Tensor | None, token_weights: Tensor | None,
               eps_low: float, eps_high: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token PPO-clip loss ``(N, T)`` (times ``token_weights`` where given; 0 outside the mask) and
    the metrics ``clipfrac``, ``approx_kl`` (k3 of the rollout policy vs the current one, cleanrl's
    ``(r - 1) - log r``) and ``ratio/mean``. ``advantages (N,)`` broadcast over the tokens; values
    under the mask never matter (padded positions get ratio 1)."""
    eps_high = eps_low if eps_high is None else eps_high
    detached = logp.detach()
    old = detached if old_logp is None else torch.where(mask, old_logp.to(logp.dtype), detached)
    log_ratio = logp - old
    ratio = torch.exp(log_ratio)
    adv = advantages[:, None].to(logp.dtype)  # (N, 1)
    per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)  # (N, T)
    if token_weights is not None:
        zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
        per_token = per_token * torch.where(mask, token_weights.to(logp.dtype), zero)
    with torch.no_grad():
        r, lr = ratio.detach(), log_ratio.detach()
        # clipping is active when the clipped branch is the minimum and cuts the gradient (TRL)
        is_clipped = ((r < 1.0 - eps_low) & (adv < 0)) | ((r > 1.0 + eps_high) & (adv > 0))
        metrics = {
            "clipfrac": masked_mean(is_clipped.to(r.dtype), mask),
            "approx_kl": masked_mean((r - 1.0) - lr, mask),
            "ratio/mean": masked_mean(r, mask),
        }
    return per_token, metrics


def _k3(log_target: Tensor, logp: Tensor) -> Tensor:
    """k3 estimator of KL(pi || target) per token: ``exp(t - logp) - (t - logp) - 1`` (>= 0)."""
    delta = log_target - logp
    return torch.exp(delta) - delta - 1.0


def _apply_is_weights(per_token: Tensor, mask: Tensor, is_weights: Tensor | None) -> Tensor:
    """``per_token (N, T)`` times the detached ``is_weights`` on the mask (unchanged when None)."""
    if is_weights is None:
        return per_token
    zero = torch.zeros((), dtype=per_token.dtype, device=per_token.device)
    return per_token * torch.where(mask, is_weights.detach().to(per_token.dtype), zero)


def sampler_importance_weights(old_logp: Tensor, sampling_logp: Tensor, completion_mask: Tensor, *,
                               mode: str = "token_truncate", clip_min: float | None = None,
                               clip_max: float | None = 3.0) -> tuple[Tensor, dict[str, Tensor]]:
    """Importance weights that correct for sampling with another implementation of the policy (vLLM).

    The rollouts were drawn from ``pi_sampler`` (vLLM's kernels, maybe another dtype) while the loss
    treats them as drawn from ``pi_old`` (the trainer's recomputation of the same policy). The
    importance ratio ``rho = pi_old / pi_sampler`` of each sampled token, bounded, reweights the
    per-token loss: truncated importance sampling (Yao et al. 2025, "Your efficient RL framework
    secretly brings you off-policy RL training"); TRL's ``vllm_importance_sampling_correction`` with
    its four modes:

    * ``token_truncate``: ``rho_t = exp(old_t - sampling_t)`` clipped to ``[clip_min, clip_max]``;
    * ``token_mask``: ``rho_t``, set to 0 outside ``[clip_min, clip_max]``;
    * ``sequence_truncate`` / ``sequence_mask``: one ratio per completion,
      ``exp(sum_t (old_t - sampling_t))`` over its masked tokens, clipped / zeroed outside the range,
      given to every token of the completion.

    Args:
        old_logp: ``(N, T)`` the trainer's log-probs of the sampled tokens before the update.
        sampling_logp: ``(N, T)`` the sampler's log-probs of the same tokens.
        completion_mask: ``(N, T)`` 1 on the tokens that count; values elsewhere never matter.
        mode: one of :data:`IS_MODES`.
        clip_min, clip_max: the bounds (None: unbounded on that side).

    Returns:
        ``weights (N, T)`` detached (1 outside the mask) and metrics over the masked tokens:
        ``vllm/is_weight_mean``, ``vllm/is_weight_min``, ``vllm/is_weight_max`` (after bounding) and
        ``vllm/is_bounded_frac`` (share of tokens whose ratio was clipped or masked).
    """
    _check_tensor("old_logp", old_logp, ndim=2)
    _check_shape("sampling_logp", sampling_logp, tuple(old_logp.shape), "old_logp.shape (N, T)")
    _check_shape("completion_mask", completion_mask, tuple(old_logp.shape), "old_logp.shape (N, T)")
    if mode not in IS_MODES:
        raise ValueError(f"mode: expected one of {list(IS_MODES)}, got {mode!r}")
    with torch.no_grad():
        mask = completion_mask.bool()
        diff = torch.where(mask, old_logp.detach().float() - sampling_logp.detach().float().to(old_logp.device),
                           torch.zeros((), device=old_logp.device))
        diff = torch.nan_to_num(diff, nan=0.0)  # a token without a sampler log-prob gets ratio 1
        if mode.startswith("sequence"):
            diff = diff.sum(dim=1, keepdim=True).expand_as(diff)
        ratio = torch.exp(diff)
        low = -math.inf if clip_min is None else clip_min
        high = math.inf if clip_max is None else clip_max
        outside = (ratio < low) | (ratio > high)
        if mode.endswith("truncate"):
            weights = ratio.clamp(min=clip_min, max=clip_max)
        else:
            weights = ratio.masked_fill(outside, 0.0)
        weights = torch.where(mask, weights, torch.ones_like(weights))
        m = mask.float()
        count = m.sum().clamp(min=1)
        any_token = bool(mask.any())
        metrics = {
            "vllm/is_weight_mean": (weights * m).sum() / count,
            "vllm/is_weight_min": weights[mask].min() if any_token else torch.ones(()),
            "vllm/is_weight_max": weights[mask].max() if any_token else torch.ones(()),
            "vllm/is_bounded_frac": (outside.float() * m).sum() / count,
        }
    return weights, metrics


def grpo_loss(
    logp: Tensor,
    completion_mask: Tensor,
    advantages: Tensor,
    *,
    old_logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    aggregation: str | None = None,
    max_completion_length: int | None = None,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
    token_weights: Tensor | None = None,
    is_weights: Tensor | None = None,
) -> LossOutput:
    """GRPO's clipped surrogate with an optional k3 KL term.

    Args:
        logp: ``(N, T)`` current-policy log-probs of the sampled tokens, with grad.
        completion_mask: ``(N, T)`` 1 on generated tokens incl. the first EOS.
        advantages: ``(N,)`` the advantages multiplying the gradient.
        old_logp: ``(N, T)`` rollout log-probs; ``None`` = on-policy (ratio value 1).
        ref_logp: ``(N, T)`` reference-model log-probs (needed when ``beta > 0``).
        beta: KL coefficient.
        eps_low, eps_high: clip range ``[1 - eps_low, 1 + eps_high]``; ``eps_high=None`` -> eps_low.
        aggregation: ``token_mean | seq_mean_token_mean | constant`` (:func:`gtpo.maths.ops.aggregate`);
            None: ``seq_mean_token_mean``.
        max_completion_length: the ``constant`` aggregation's normaliser.
        num_sequences, num_tokens: GLOBAL counts of the whole rollout batch (default: this batch's)
            so that micro-batch losses sum to the full-batch loss.
        token_weights: ``(N, T)`` per-token weights (the "conflict masks only" ablation), None -> 1.
        is_weights: ``(N, T)`` detached importance weights of the sampler mismatch
            (:func:`sampler_importance_weights`), multiplying the per-token loss, KL term included (as
            TRL); None -> 1.

    Returns:
        :class:`LossOutput`: ``clipfrac``, ``approx_kl``, ``ratio/mean`` and ``kl`` (``beta > 0``).
    """
    _check_inputs(logp, completion_mask, advantages, old_logp=old_logp, ref_logp=ref_logp, token_weights=token_weights,
                  is_weights=is_weights)
    if beta > 0 and ref_logp is None:
        raise ValueError(f"ref_logp: beta = {beta} > 0 needs the reference model's log-probs, got None")
    mask = completion_mask.bool()
    per_token, metrics = _surrogate(logp, mask, advantages, old_logp, token_weights, eps_low, eps_high)
    if beta > 0:
        ref = torch.where(mask, ref_logp.to(logp.dtype), logp.detach())  # padded positions: KL 0
        kl = _k3(ref, logp)  # (N, T)
        per_token = per_token + beta * kl
        metrics["kl"] = masked_mean(kl.detach(), mask)
    per_token = _apply_is_weights(per_token, mask, is_weights)
    loss = aggregate(per_token, mask, aggregation or DEFAULT_AGGREGATION["grpo"],
                     max_completion_length=max_completion_length, num_sequences=num_sequences,
                     num_tokens=num_tokens)
    return LossOutput(loss, metrics)


def dr_grpo_loss(logp: Tensor, completion_mask: Tensor, advantages: Tensor, *, aggregation: str | None = None,
                 **kwargs) -> LossOutput:
    """Dr.GRPO (Liu et al. 2025): :func:`grpo_loss` with the ``constant`` aggregation by default
    (``max_completion_length`` required)."""
    return grpo_loss(logp, completion_mask, advantages, aggregation=aggregation or DEFAULT_AGGREGATION["dr_grpo"],
                     **kwargs)


def dapo_loss(logp: Tensor, completion_mask: Tensor, advantages: Tensor, *, aggregation: str | None = None,
              **kwargs) -> LossOutput:
    """DAPO (Yu et al. 2025): :func:`grpo_loss` with the ``token_mean`` aggregation by default; the
    clip-higher range comes in as ``eps_high``."""
    return grpo_loss(logp, completion_mask, advantages, aggregation=aggregation or DEFAULT_AGGREGATION["dapo"],
                     **kwargs)


def gtpo_loss(
    logp: Tensor,
    completion_mask: Tensor,
    advantages: Tensor,
    *,
    token_weights: Tensor | None = None,
    n_conflict: Tensor | None = None,
    old_logp: Tensor | None = None,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    divide_by_conflict_count: bool = True,
    completion_reduction: str = "sum",
    group_size: int | None = None,
    num_sequences: int | None = None,
    is_weights: Tensor | None = None,
) -> LossOutput:
    """GTPO's policy loss (arXiv 2508.03772).

    Args:
        logp: ``(N, T)`` current-policy log-probs of the sampled tokens, with grad.
        completion_mask: ``(N, T)`` 1 on generated tokens incl. the first EOS.
        advantages: ``(N,)`` SHAPED advantages (entropy filter and gamma shift applied:
            :func:`gtpo.maths.advantages.shape_advantages`).
        token_weights: ``(N, T)`` conflict weights lambda (None -> 1).
        n_conflict: ``(N,)`` conflict counts from :func:`gtpo.maths.conflict.conflict_weights`;
            ``divide_by_conflict_count`` divides each completion's loss by ``max(n, 1)`` [C].
        old_logp, eps_low, eps_high: as :func:`grpo_loss` (with several updates per batch [D]).
        completion_reduction: ``"sum"`` over the completions of each group, averaged over groups
            (``num_sequences / group_size`` of them) [C]; ``"mean"`` over completions [P].
        group_size: ``G``, for ``"sum"``.
        num_sequences: GLOBAL number of completions of the rollout batch (default ``N``).
        is_weights: ``(N, T)`` detached importance weights of the sampler mismatch
            (:func:`sampler_importance_weights`), multiplying the per-token loss; None -> 1.

    Returns:
        :class:`LossOutput`: ``clipfrac``, ``approx_kl``, ``ratio/mean``,
        ``gtpo/weighted_token_frac`` (share of tokens with lambda != 1), ``gtpo/n_conflict_mean``.
    """
    _check_inputs(logp, completion_mask, advantages, old_logp=old_logp, token_weights=token_weights,
                  is_weights=is_weights)
    N = logp.shape[0]
    if n_conflict is not None:
        _check_shape("n_conflict", n_conflict, (N,), "(N,)")
    elif token_weights is not None and divide_by_conflict_count:
        raise ValueError("n_conflict: divide_by_conflict_count=True needs the (N,) conflict counts returned by "
                         "conflict_weights together with token_weights; got None (or set divide_by_conflict_count=False)")
    n_rows = N if num_sequences is None else num_sequences
    if completion_reduction == "sum" and (not isinstance(group_size, int) or group_size < 2 or n_rows % group_size):
        raise ValueError(f"group_size: completion_reduction='sum' divides by the number of groups (num_sequences "
                         f"{n_rows} / group_size); expected an int >= 2 dividing it, got {group_size!r}")
    mask = completion_mask.bool()
    per_token, metrics = _surrogate(logp, mask, advantages, old_logp, token_weights, eps_low, eps_high)
    per_token = _apply_is_weights(per_token, mask, is_weights)
    per_completion = masked_mean(per_token, mask, dim=1)  # (N,) token mean per completion
    if divide_by_conflict_count and n_conflict is not None:
        per_completion = per_completion / n_conflict.clamp(min=1).to(per_completion.dtype)
    scale = group_size / n_rows if completion_reduction == "sum" else 1.0 / n_rows  # sum / #groups, or mean
    loss = per_completion.sum() * scale
    with torch.no_grad():
        zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
        weighted = zero if token_weights is None else masked_mean((token_weights != 1).to(logp.dtype), mask)
        metrics["gtpo/weighted_token_frac"] = weighted
        metrics["gtpo/n_conflict_mean"] = zero if n_conflict is None else n_conflict.to(logp.dtype).mean()
    return LossOutput(loss, metrics)


class LossExtras(NamedTuple):
    """The optional per-call inputs of every policy loss (:data:`POLICY_LOSSES`); a loss reads what it uses.

    ``token_weights (N, T)``: per-token weights (GTPO's conflict weights lambda; on a baseline the "conflict masks
    only" ablation); ``n_conflict (N,)``: GTPO's conflict counts (read by ``gtpo`` only); ``ref_logp (N, T)``: the
    reference model's log-probs (``beta > 0``; baselines only); ``is_weights (N, T)``: detached importance weights
    of the sampler mismatch (:func:`sampler_importance_weights`); ``num_sequences`` / ``num_tokens``: the GLOBAL
    numbers of completions and loss tokens of the rollout batch, so that micro-batch losses sum to the full-batch
    loss (default: this call's)."""

    token_weights: Tensor | None = None
    n_conflict: Tensor | None = None
    ref_logp: Tensor | None = None
    is_weights: Tensor | None = None
    num_sequences: int | None = None
    num_tokens: int | None = None


def _gtpo_policy_loss(logp: Tensor, old_logp: Tensor | None, advantages: Tensor, completion_mask: Tensor,
                      extras: LossExtras, config: GTPOConfig) -> LossOutput:
    """:func:`gtpo_loss` with ``config``'s clip range, ``divide_by_conflict_count`` (when counts are given),
    ``completion_reduction`` and ``group_size``."""
    return gtpo_loss(
        logp, completion_mask, advantages, token_weights=extras.token_weights, n_conflict=extras.n_conflict,
        old_logp=old_logp, eps_low=config.epsilon, eps_high=config.resolved_epsilon_high,
        divide_by_conflict_count=config.divide_by_conflict_count and extras.n_conflict is not None,
        completion_reduction=config.completion_reduction, group_size=config.group_size,
        num_sequences=extras.num_sequences, is_weights=extras.is_weights,
    )


def _clipped_policy_loss(logp: Tensor, old_logp: Tensor | None, advantages: Tensor, completion_mask: Tensor,
                         extras: LossExtras, config: GTPOConfig) -> LossOutput:
    """:func:`grpo_loss` with ``config``'s clip range, KL coefficient and aggregation (``loss_aggregation``, or
    the loss type's own: GRPO ``seq_mean_token_mean``, Dr.GRPO ``constant``, DAPO ``token_mean``)."""
    return grpo_loss(
        logp, completion_mask, advantages, old_logp=old_logp, ref_logp=extras.ref_logp, beta=config.beta,
        eps_low=config.epsilon, eps_high=config.resolved_epsilon_high,
        aggregation=config.resolved_loss_aggregation,
        max_completion_length=config.max_completion_length, num_sequences=extras.num_sequences,
        num_tokens=extras.num_tokens, token_weights=extras.token_weights, is_weights=extras.is_weights,
    )


#: ``loss_type`` -> policy loss, one signature for all (verl's ``register_policy_loss`` style)::
#:
#:     POLICY_LOSSES[config.loss_type](logp, old_logp, advantages, completion_mask, extras, config) -> LossOutput
#:
#: ``logp (N, T)`` with grad, ``old_logp (N, T)`` or None (on-policy: ratio value 1), ``advantages (N,)`` as they
#: multiply the gradient (GTPO's already shaped: :func:`gtpo.maths.method.effective_advantages`), ``completion_mask
#: (N, T)``, :class:`LossExtras`, the :class:`gtpo.GTPOConfig` (hyperparameters). The keyword functions above
#: (:func:`gtpo_loss`, :func:`grpo_loss`, ...) are the maths; these entries only read the config.
POLICY_LOSSES: dict[str, Callable[..., LossOutput]] = {
    "gtpo": _gtpo_policy_loss, "grpo": _clipped_policy_loss, "dr_grpo": _clipped_policy_loss,
    "dapo": _clipped_policy_loss,
}
