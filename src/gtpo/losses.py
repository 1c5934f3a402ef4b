"""Policy losses: GTPO and the GRPO / Dr.GRPO / DAPO baselines, one explicit dispatch.

Shapes: ``N`` completions (prompt-major rows ``p * G + g``), ``T`` completion tokens (right
padded), ``completion_mask (N, T)`` 1 on generated tokens incl. the first EOS.

Shared per-token surrogate (PPO clip, Schulman et al. 2017; DAPO's clip-higher ``eps_high``):

    r_t = exp(logp_t - old_logp_t),   l_t = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)

With ``old_logp=None`` the update is on-policy: ``r = exp(logp - stopgrad(logp))`` has value 1
and its gradient is the REINFORCE gradient ``-A grad(logp)`` (the reference GTPO code's
``ratio``) [C]. Clipping is then never active.

* ``"grpo"`` (Shao et al. 2024): optional k3 KL to a reference model, ``beta * k3(ref, logp)``
  per token; aggregation ``seq_mean_token_mean``.
* ``"dr_grpo"`` (Liu et al. 2025): aggregation ``constant`` (sum / (max_completion_length * N)),
  advantages without std scaling (chosen in :func:`gtpo.advantages.group_advantages`).
* ``"dapo"`` (Yu et al. 2025): aggregation ``token_mean``; clip-higher via ``eps_high``.
  The KL term is accepted for ``dr_grpo`` and ``dapo`` too (as in TRL), though their papers drop it.
* ``"gtpo"`` (Simoni et al. 2026, arXiv 2508.03772, gtpo-method.md §4-§6): advantages shaped by
  the entropy filter and ``-gamma <H>_i`` (:func:`gtpo.advantages.shape_advantages`, applied
  here to the UNSHAPED advantages it receives), per-token term multiplied by the conflict
  weights lambda (:func:`gtpo.conflict.conflict_weights`), per-completion token mean,
  optionally divided by ``max(n_conflict_i, 1)`` (reference code [C]; the paper's objective has
  no such term -> ``divide_by_conflict_count=False`` [P]), then either summed over the
  completions of a group and averaged over groups (reference code: loss summed over completions
  [C], ``completion_reduction="sum"``) or averaged over completions (the paper's ``1/G`` [P],
  ``"mean"``). No KL ever (GTPO drops the reference model [P][C]). With several updates per
  batch the ratio is taken against the rollout log-probs and PPO-clipped [D].

Why lambda is computed from the UNSHAPED signs although the loss uses shaped advantages: that is
the reference code's order (conflicts first, entropy shaping after) [C]; shaping can flip a
small positive advantage negative, and the positive completion's conflict tokens still get
``pos_weight``.

Metrics are detached 0-dim tensors averaged over THIS micro-batch (the trainer averages them).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .advantages import FILTER_SCOPES, entropy_keep_mask, shape_advantages
from .ops import (
    AGGREGATIONS,
    _check_option,
    _check_positive_int,
    _check_shape,
    _check_tensor,
    aggregate,
    masked_mean,
    masked_sum,
)

__all__ = ["AGGREGATIONS", "COMPLETION_REDUCTIONS", "LOSS_TYPES", "LossOutput", "policy_loss"]

LOSS_TYPES = ("gtpo", "grpo", "dr_grpo", "dapo")
COMPLETION_REDUCTIONS = ("sum", "mean")
DEFAULT_AGGREGATION = {"grpo": "seq_mean_token_mean", "dr_grpo": "constant", "dapo": "token_mean"}


class LossOutput(NamedTuple):
    """``loss``: scalar, differentiable. ``metrics``: detached 0-dim tensors (e.g. ``"clipfrac"``,
    ``"approx_kl"``, ``"kl"``, ``"ratio/mean"``, ``"gtpo/filtered_frac"``, ...)."""

    loss: Tensor
    metrics: dict[str, Tensor]


def _check_float(name: str, value, *, minimum: float | None = None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected a float{' or None' if allow_none else ''}, got {value!r}")
    if minimum is not None and not value >= minimum:
        raise ValueError(f"{name}: expected a float >= {minimum}, got {value!r}")


def _clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: float,
    eps_high: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-token PPO-clip loss ``(N, T)``, ratio ``(N, T)``, clipped indicator ``(N, T)`` bool and
    log-ratio ``(N, T)``. ``advantages (N,)`` broadcast over tokens."""
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    adv = advantages[:, None].to(logp.dtype)  # (N, 1)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = -torch.minimum(ratio * adv, clipped_ratio * adv)
    # clipping is active when the clipped branch is the minimum and cuts the gradient (TRL)
    is_clipped = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
    return loss, ratio.detach(), is_clipped, log_ratio.detach()


def _k3(log_target: Tensor, logp: Tensor) -> Tensor:
    """k3 estimator of KL(pi || target) per token: ``exp(t - logp) - (t - logp) - 1`` (>= 0)."""
    delta = log_target - logp
    return torch.exp(delta) - delta - 1.0


def policy_loss(
    loss_type: str,
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
    seq_entropy: Tensor | None = None,
    token_weights: Tensor | None = None,
    n_conflict: Tensor | None = None,
    entropy_threshold: float | None = 0.7,
    gamma: float = 0.1,
    filter_scope: str = "all",
    initial_entropy: float | Tensor | None = None,
    divide_by_conflict_count: bool = True,
    completion_reduction: str = "sum",
    group_size: int | None = None,
) -> LossOutput:
    """Policy-gradient loss of one (micro-)batch for ``loss_type`` in :data:`LOSS_TYPES`.

    Args:
        loss_type: ``"gtpo" | "grpo" | "dr_grpo" | "dapo"``.
        logp: ``(N, T)`` current-policy log-probs of the sampled tokens, with grad.
        completion_mask: ``(N, T)`` 1 on generated tokens incl. the first EOS.
        advantages: ``(N,)`` group advantages (for gtpo UNSHAPED: shaping happens here).
        old_logp: ``(N, T)`` rollout log-probs; ``None`` = on-policy (ratio value 1).
        ref_logp: ``(N, T)`` reference-model log-probs for the k3 KL (needed when ``beta > 0``).
        beta: KL coefficient (not allowed for gtpo).
        eps_low, eps_high: clip range ``[1 - eps_low, 1 + eps_high]``; ``eps_high=None`` -> eps_low.
        aggregation: one of :data:`AGGREGATIONS`; ``None`` -> the loss type's default
            (grpo: seq_mean_token_mean, dapo: token_mean, dr_grpo: constant); must be None for gtpo.
        max_completion_length: required by the ``"constant"`` aggregation.
        num_sequences, num_tokens: GLOBAL counts of the whole rollout batch (default: this
            batch's) so that micro-batch losses sum to the full-batch loss.
        seq_entropy: ``(N,)`` mean token entropy per completion (detached); gtpo: required
            unless ``entropy_threshold is None and gamma == 0``. Ignored by the other types.
        token_weights: ``(N, T)`` conflict weights lambda (gtpo; None -> 1).
        n_conflict: ``(N,)`` conflict counts (gtpo); required with ``token_weights`` when
            ``divide_by_conflict_count`` is True.
        entropy_threshold, gamma, filter_scope, initial_entropy: GTPO entropy control, see
            :func:`gtpo.advantages.shape_advantages` (``entropy_threshold=None``: no filter).
        divide_by_conflict_count: gtpo: divide each completion's loss by ``max(n_conflict, 1)`` [C].
        completion_reduction: gtpo: ``"sum"`` over completions / number of groups [C] or
            ``"mean"`` over completions [P].
        group_size: gtpo with ``"sum"``: completions per group (groups = num_sequences / G).

    Returns:
        :class:`LossOutput` with the scalar loss and detached metrics of this micro-batch:
        ``clipfrac``, ``approx_kl`` (k3 of the rollout policy vs the current one, 0 on-policy),
        ``ratio/mean``, ``kl`` (when ``beta > 0``), and for gtpo ``gtpo/filtered_frac``,
        ``gtpo/adv_shaped_mean``, ``gtpo/adv_shift_mean``, ``gtpo/weighted_token_frac``,
        ``gtpo/n_conflict_mean``.
    """
    _check_option("loss_type", loss_type, LOSS_TYPES)
    _check_tensor("logp", logp, ndim=2)
    if not logp.is_floating_point():
        raise ValueError(f"logp: expected a floating-point tensor, got dtype {logp.dtype}")
    N, T = logp.shape
    _check_shape("completion_mask", completion_mask, (N, T), "logp.shape (N, T)")
    _check_shape("advantages", advantages, (N,), "(N,)")
    for name, value in (("old_logp", old_logp), ("ref_logp", ref_logp)):
        if value is not None:
            _check_shape(name, value, (N, T), "logp.shape (N, T)")
    _check_float("beta", beta, minimum=0.0)
    _check_float("eps_low", eps_low, minimum=0.0)
    _check_float("eps_high", eps_high, minimum=0.0, allow_none=True)
    if aggregation is not None:
        _check_option("aggregation", aggregation, AGGREGATIONS)
    _check_positive_int("max_completion_length", max_completion_length)
    _check_positive_int("num_sequences", num_sequences)
    _check_positive_int("num_tokens", num_tokens)
    if beta > 0 and ref_logp is None:
        raise ValueError(f"ref_logp: beta = {beta} > 0 needs the reference model's log-probs, got None")
    eps_high = eps_low if eps_high is None else eps_high

    mask = completion_mask.bool()  # (N, T)
    detached = logp.detach()
    # values under the mask never matter: padded positions get ratio 1 and KL 0
    old = detached if old_logp is None else torch.where(mask, old_logp.to(logp.dtype), detached)
    ref = None if ref_logp is None else torch.where(mask, ref_logp.to(logp.dtype), detached)

    if loss_type == "gtpo":
        return _gtpo_loss(
            logp, mask, advantages, old, eps_low=eps_low, eps_high=eps_high, beta=beta,
            aggregation=aggregation, num_sequences=num_sequences, seq_entropy=seq_entropy,
            token_weights=token_weights, n_conflict=n_conflict,
            entropy_threshold=entropy_threshold, gamma=gamma, filter_scope=filter_scope,
            initial_entropy=initial_entropy, divide_by_conflict_count=divide_by_conflict_count,
            completion_reduction=completion_reduction, group_size=group_size,
        )
    # grpo / dr_grpo / dapo
    for name, value in (("token_weights", token_weights), ("n_conflict", n_conflict)):
        if value is not None:
            raise ValueError(f"{name}: only used by loss_type='gtpo', got a tensor with loss_type={loss_type!r}")
    return _clipped_loss(
        loss_type, logp, mask, advantages, old, ref, eps_low=eps_low, eps_high=eps_high,
        beta=beta, aggregation=aggregation or DEFAULT_AGGREGATION[loss_type],
        max_completion_length=max_completion_length, num_sequences=num_sequences,
        num_tokens=num_tokens,
    )


def _base_metrics(ratio: Tensor, is_clipped: Tensor, log_ratio: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """clipfrac, approx_kl (k3 of old vs current: ``(r - 1) - log r``, cleanrl), ratio/mean."""
    approx_kl = (ratio - 1.0) - log_ratio
    return {
        "clipfrac": masked_mean(is_clipped.to(ratio.dtype), mask),
        "approx_kl": masked_mean(approx_kl, mask),
        "ratio/mean": masked_mean(ratio, mask),
    }


def _clipped_loss(
    loss_type, logp, mask, advantages, old, ref, *, eps_low, eps_high, beta, aggregation,
    max_completion_length, num_sequences, num_tokens,
) -> LossOutput:
    per_token, ratio, is_clipped, log_ratio = _clipped_surrogate(logp, old, advantages, eps_low, eps_high)
    metrics = _base_metrics(ratio, is_clipped, log_ratio, mask)
    if beta > 0:
        kl = _k3(ref, logp)  # (N, T)
        per_token = per_token + beta * kl
        metrics["kl"] = masked_mean(kl.detach(), mask)
    loss = aggregate(
        per_token, mask, aggregation, max_completion_length=max_completion_length,
        num_sequences=num_sequences, num_tokens=num_tokens,
    )
    return LossOutput(loss, {k: v.detach() for k, v in metrics.items()})


def _gtpo_loss(
    logp, mask, advantages, old, *, eps_low, eps_high, beta, aggregation, num_sequences,
    seq_entropy, token_weights, n_conflict, entropy_threshold, gamma, filter_scope,
    initial_entropy, divide_by_conflict_count, completion_reduction, group_size,
) -> LossOutput:
    N, T = logp.shape
    if beta > 0:
        raise ValueError(f"beta: GTPO uses no KL penalty (no reference model), expected 0, got {beta}")
    if aggregation is not None:
        raise ValueError(
            f"aggregation: GTPO has its own reduction (completion_reduction, "
            f"divide_by_conflict_count); expected None, got {aggregation!r}"
        )
    _check_option("filter_scope", filter_scope, FILTER_SCOPES)
    _check_option("completion_reduction", completion_reduction, COMPLETION_REDUCTIONS)
    _check_float("gamma", gamma)
    _check_float("entropy_threshold", entropy_threshold, allow_none=True)
    if not isinstance(divide_by_conflict_count, bool):
        raise ValueError(f"divide_by_conflict_count: expected a bool, got {divide_by_conflict_count!r}")
    n_rows = N if num_sequences is None else num_sequences
    if completion_reduction == "sum":
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
            raise ValueError(
                f"group_size: completion_reduction='sum' divides by the number of groups "
                f"(num_sequences / group_size); expected an int >= 2, got {group_size!r}"
            )
        if n_rows % group_size != 0:
            raise ValueError(
                f"group_size: num_sequences ({n_rows}) must be divisible by group_size ({group_size})"
            )
    if seq_entropy is None:
        if entropy_threshold is not None or gamma != 0:
            raise ValueError(
                "seq_entropy: GTPO's entropy filter / shaping needs the (N,) mean token entropy "
                "of each completion; got None (pass entropy_threshold=None and gamma=0 to run "
                "without entropy control)"
            )
        seq_entropy = torch.zeros(N, dtype=logp.dtype, device=logp.device)
    _check_shape("seq_entropy", seq_entropy, (N,), "(N,)")
    if token_weights is not None:
        _check_shape("token_weights", token_weights, (N, T), "logp.shape (N, T)")
        if n_conflict is None and divide_by_conflict_count:
            raise ValueError(
                "n_conflict: divide_by_conflict_count=True needs the (N,) conflict counts "
                "returned by conflict_weights together with token_weights; got None (or set "
                "divide_by_conflict_count=False)"
            )
    if n_conflict is not None:
        _check_shape("n_conflict", n_conflict, (N,), "(N,)")

    keep = entropy_keep_mask(
        advantages, seq_entropy, threshold=entropy_threshold, scope=filter_scope,
        initial_entropy=initial_entropy,
    )  # (N,) bool
    shaped = shape_advantages(
        advantages, seq_entropy, threshold=entropy_threshold, gamma=gamma, scope=filter_scope,
        initial_entropy=initial_entropy,
    )  # (N,)
    per_token, ratio, is_clipped, log_ratio = _clipped_surrogate(logp, old, shaped, eps_low, eps_high)
    if token_weights is not None:
        weights = torch.where(mask, token_weights.to(logp.dtype), torch.zeros((), dtype=logp.dtype, device=logp.device))
        per_token = per_token * weights  # (N, T)
    per_completion = masked_mean(per_token, mask, dim=1)  # (N,) token mean per completion
    if divide_by_conflict_count and n_conflict is not None:
        per_completion = per_completion / n_conflict.clamp(min=1).to(per_completion.dtype)
    if completion_reduction == "sum":
        loss = per_completion.sum() * (group_size / n_rows)  # sum over completions / #groups
    else:
        loss = per_completion.sum() / n_rows

    metrics = _base_metrics(ratio, is_clipped, log_ratio, mask)
    with torch.no_grad():
        kept = keep.to(logp.dtype)
        shift = -gamma * seq_entropy.detach().to(logp.dtype)
        metrics["gtpo/filtered_frac"] = 1.0 - kept.mean()
        metrics["gtpo/adv_shaped_mean"] = shaped.detach().to(logp.dtype).mean()
        metrics["gtpo/adv_shift_mean"] = masked_sum(shift, keep) / kept.sum().clamp(min=1)
        if token_weights is not None:
            metrics["gtpo/weighted_token_frac"] = masked_mean((token_weights != 1).to(logp.dtype), mask)
        else:
            metrics["gtpo/weighted_token_frac"] = torch.zeros((), dtype=logp.dtype, device=logp.device)
        if n_conflict is not None:
            metrics["gtpo/n_conflict_mean"] = n_conflict.to(logp.dtype).mean()
        else:
            metrics["gtpo/n_conflict_mean"] = torch.zeros((), dtype=logp.dtype, device=logp.device)
    return LossOutput(loss, {k: v.detach() for k, v in metrics.items()})
