"""The GTPO method composed once (arXiv 2508.03772; gtpo-method.md §3-§6): every engine calls this module.

The maths lives in pure functions (:mod:`gtpo.maths.advantages`, :mod:`gtpo.maths.conflict`, :mod:`gtpo.maths.losses`); this
module composes them the way GTPO uses them, from a rollout's tensors to the loss inputs, so that gtpo's own
trainer (:mod:`gtpo.trainer`), TRL's engine (:mod:`gtpo.integrations.trl`) and verl's
(:mod:`gtpo.integrations.verl`) hold no copy of the composition:

1. :func:`loss_mask` -- the completion mask, truncated completions removed with ``mask_truncated_completions``,
   tool / environment tokens of a multi-turn completion removed with ``tool_mask`` (the mask then has holes: the
   conflict runs align over the model tokens [D], docs/method.md "Multi-turn completions");
2. :func:`group_inputs` on WHOLE groups, from the UNSHAPED advantage signs (the reference code's order [C]):
   the conflict weights lambda ``(N, T)`` and counts ``n_conflict (N,)`` on the loss mask (a completion masked out
   of the loss is nobody's conflict partner [D]), the conflict runs (for ``gtpo/conflict_frac``), the rows the
   gamma shift reaches (``gamma_groups="varying"``) and the rows a ``completion_sign`` control trains on;
3. ⟨H⟩_ini, the paper's rule (:func:`uses_initial_entropy`, :func:`initial_entropy_sums`,
   :func:`initial_entropy_value`): the mean over the completions with loss tokens of their mean token entropy,
   measured once on the first batch [P];
4. :func:`effective_advantages` per row (any micro-batch): the entropy filter and the ``-gamma <H>_i`` shift
   (:func:`gtpo.maths.advantages.entropy_control`, with the ROLLOUT policy's completion entropies), then the sign
   control;
5. the loss: ``gtpo.maths.losses.POLICY_LOSSES[loss_type](logp, old_logp, advantages, mask, extras, config)``; or, for an
   engine whose policy loss takes TOKEN-level advantages and averages per completion then over completions (verl),
   :func:`token_advantages`: the effective advantages times lambda, over ``max(n_conflict, 1)``, times ``G`` for
   ``completion_reduction="sum"``, so that the plain PPO-clip surrogate reduced that way is GTPO's loss.

Shapes: ``P`` prompts, ``G = group_size``, ``N = P * G`` rows in prompt-major order (row ``p * G + g``), ``T``
completion tokens (right padded; with holes on tool tokens for multi-turn completions). Engines that reorder rows (verl's batch balancing) must pass the rows of each
group contiguously, in any order within the group (every output is equivariant to a permutation inside a group).

Hyperparameters come from a :class:`gtpo.GTPOConfig` (the presets reach every engine unchanged); the functions
here never read anything else, sync with the host only where the maths they call does, and return detached
metric tensors.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from ..config import GTPOConfig
from .advantages import entropy_control, sign_mask, varying_groups
from .conflict import conflict_runs, conflict_weights
from .ops import _check_group_size, _check_shape, _check_tensor, masked_mean

__all__ = ["EffectiveAdvantages", "GroupInputs", "completion_entropy", "conflict_stats", "effective_advantages", "group_inputs",
           "initial_entropy_sums", "initial_entropy_value", "loss_mask", "uses_initial_entropy",
           "constant_groups", "token_advantages"]


class GroupInputs(NamedTuple):
    """GTPO's per-row inputs, computed on whole groups before any micro-batching (``N`` rows).

    ``token_weights (N, T)`` float32 lambda and ``n_conflict (N,)`` int64 (None without conflict masks);
    ``conflict_run (N, T)`` bool, the tokens in a prefix or suffix conflict run (None without conflict masks);
    ``shift_mask (N,)`` bool, the rows the gamma shift reaches (None: all); ``sign_mask (N,)`` bool, the rows a
    ``completion_sign`` control trains on (None: all)."""

    token_weights: Tensor | None
    n_conflict: Tensor | None
    conflict_run: Tensor | None
    shift_mask: Tensor | None
    sign_mask: Tensor | None

    def rows(self, index) -> "GroupInputs":
        """The same inputs restricted to the rows ``index`` (a slice, an index tensor or a bool mask)."""
        return GroupInputs(*(None if t is None else t[index] for t in self))


class EffectiveAdvantages(NamedTuple):
    """``advantages (M,)`` that multiply the gradient; ``dropped (M,)`` bool, the rows the entropy filter dropped;
    ``metrics``: ``gtpo/filtered_frac``, ``gtpo/adv_shaped_mean``, ``gtpo/adv_shift_mean`` (means over these
    ``M`` rows; empty without entropy control)."""

    advantages: Tensor
    dropped: Tensor
    metrics: dict[str, Tensor]


def loss_mask(completion_mask: Tensor, truncated: Tensor | None, *, mask_truncated_completions: bool,
              tool_mask: Tensor | None = None) -> Tensor:
    """``(N, T)`` float: ``completion_mask (N, T)`` with the rows of ``truncated (N,)`` bool zeroed when
    ``mask_truncated_completions`` (DAPO's overlong filtering; TRL's option of the same name), times
    ``tool_mask (N, T)`` when given (1 on the tokens the policy produced, 0 on tool / environment tokens of a
    multi-turn completion: TRL's ``tool_mask`` / ``env_mask``, verl's agent-loop ``response_mask``). The
    result is the mask every later step reads: the loss, the conflict runs (aligned over the model tokens,
    docs/method.md "Multi-turn completions") and ``<H>_i``, so tool tokens are never trained, never conflict
    partners and never in the entropy."""
    _check_tensor("completion_mask", completion_mask, ndim=2)
    mask = completion_mask.clone()
    if tool_mask is not None:
        _check_shape("tool_mask", tool_mask, tuple(mask.shape), "completion_mask.shape (N, T)")
        mask = mask * (tool_mask.to(mask.device) != 0).to(mask.dtype)
    if mask_truncated_completions and truncated is not None:
        _check_shape("truncated", truncated, (mask.shape[0],), "(N,)")
        mask[truncated.to(mask.device).bool()] = 0
    return mask.float()


def group_inputs(completion_ids: Tensor, mask: Tensor, advantages: Tensor, config: GTPOConfig) -> GroupInputs:
    """GTPO's per-row inputs of whole groups (:class:`GroupInputs`).

    Args:
        completion_ids: ``(N, T)`` integer token ids, right padded.
        mask: ``(N, T)`` the LOSS mask (:func:`loss_mask`): conflict partners are the tokens that are trained.
        advantages: ``(N,)`` UNSHAPED group advantages (their sign makes a completion positive, negative or
            inactive; zero-variance groups must be exactly 0: :func:`zero_constant_groups`).
        config: ``resolved_conflict_masks`` and ``conflict_kwargs()`` (lambda), ``gamma_groups``,
            ``completion_sign`` and ``group_size`` are read.
    """
    g = config.group_size
    _check_tensor("advantages", advantages, ndim=1)
    _check_group_size(g, advantages.shape[0], "advantages")
    token_weights = n_conflict = conflict_run = None
    if config.resolved_conflict_masks:
        token_weights, n_conflict = conflict_weights(completion_ids, mask, advantages, g, **config.conflict_kwargs())
        prefix, suffix = conflict_runs(completion_ids, mask, advantages, g)
        conflict_run = prefix | suffix
    return GroupInputs(
        token_weights=token_weights, n_conflict=n_conflict, conflict_run=conflict_run,
        shift_mask=varying_groups(advantages, g) if config.gamma_groups == "varying" else None,
        sign_mask=None if config.completion_sign == "all" else sign_mask(advantages, config.completion_sign),
    )


def conflict_stats(inputs: GroupInputs, mask: Tensor) -> Tensor:
    """``(4,)`` float sums over ``mask (N, T)`` for the conflict metrics (add them over processes before
    dividing): tokens in a conflict run, masked tokens, ``n_conflict`` summed, rows. All 0 but the token count
    without conflict masks. ``gtpo/conflict_frac = s[0] / max(s[1], 1)``, ``gtpo/n_conflict_mean = s[2] / max(s[3], 1)``."""
    maskf = mask.float()
    zero = torch.zeros((), device=maskf.device)
    if inputs.conflict_run is None:
        return torch.stack([zero, maskf.sum(), zero, zero])
    return torch.stack([(inputs.conflict_run.float() * maskf).sum(), maskf.sum(), inputs.n_conflict.float().sum(),
                        torch.tensor(float(inputs.n_conflict.numel()), device=maskf.device)])


def uses_initial_entropy(config: GTPOConfig) -> bool:
    """Whether the entropy filter follows the paper's ⟨H⟩_ini rule [P] (``entropy_rule="initial"``, filter on)."""
    return config.resolved_entropy_filter and config.entropy_rule == "initial"


def initial_entropy_sums(seq_entropy: Tensor, mask: Tensor) -> Tensor:
    """``(2,)``: the completions' mean token entropies ``seq_entropy (N,)`` summed over the rows that have tokens
    in ``mask (N, T)``, and the number of those rows (add over processes and micro-batches, then
    :func:`initial_entropy_value`). Completions masked out entirely (truncated) have no entropy."""
    has_tokens = mask.sum(dim=1) > 0
    return torch.stack([seq_entropy[has_tokens].sum(), has_tokens.sum().float()])


def initial_entropy_value(sums: Tensor) -> float | None:
    """⟨H⟩_ini from the summed :func:`initial_entropy_sums`; None when no completion had tokens or the value is
    not finite (the engine measures it again on the next batch)."""
    if float(sums[1]) <= 0:
        return None
    value = float(sums[0] / sums[1])
    return value if math.isfinite(value) else None


def effective_advantages(advantages: Tensor, seq_entropy: Tensor | None, config: GTPOConfig, *,
                         initial_entropy: float | Tensor | None = None, shift_mask: Tensor | None = None,
                         sign_rows: Tensor | None = None) -> EffectiveAdvantages:
    """The advantages that multiply the gradient of ``M`` rows (any subset: a micro-batch).

    ``advantages (M,)`` unshaped; ``seq_entropy (M,)`` the ROLLOUT policy's mean token entropies ``<H>_i``
    (frozen over the ``num_iterations`` passes [D]; needed when ``config.entropy_control``);
    :func:`gtpo.maths.advantages.entropy_control` with ``config.shaping_kwargs()``, ``initial_entropy`` (⟨H⟩_ini, when
    :func:`uses_initial_entropy`) and ``shift_mask (M,)`` (``gamma_groups="varying"``); then ``sign_rows (M,)``
    bool (``completion_sign``) zeroes the other rows.
    """
    effective, metrics = advantages, {}
    dropped = torch.zeros_like(advantages, dtype=torch.bool)
    if config.entropy_control:
        if seq_entropy is None:
            raise ValueError("seq_entropy: the entropy filter / gamma shift need the completions' mean token "
                             "entropies (M,), got None")
        if shift_mask is not None:
            shift_mask = shift_mask.to(advantages.device)
        effective, keep = entropy_control(advantages, seq_entropy, **config.shaping_kwargs(),
                                          initial_entropy=initial_entropy, shift_mask=shift_mask)
        kept, dropped = keep.float(), ~keep
        metrics = {"gtpo/filtered_frac": 1.0 - kept.mean(), "gtpo/adv_shaped_mean": effective.mean(),
                   "gtpo/adv_shift_mean": ((effective - advantages) * kept).sum() / kept.sum().clamp(min=1)}
    if sign_rows is not None:
        effective = torch.where(sign_rows.to(advantages.device), effective, torch.zeros_like(effective))
    return EffectiveAdvantages(effective, dropped, metrics)


def constant_groups(rewards: Tensor, group_size: int) -> Tensor:
    """``(N,)`` bool: True on the rows of groups whose ``rewards (N,)`` are all equal (NaN rewards, rows no
    reward function scored, are ignored). Their advantages must be exactly 0 -- as
    :func:`gtpo.maths.advantages.group_advantages` gives them -- for the conflict masks: an engine's own advantages (a
    float mean) can leave a +-1e-8 residue that would make such a group "active"."""
    _check_tensor("rewards", rewards, ndim=1)
    _check_group_size(group_size, rewards.shape[0], "rewards")
    grouped = rewards.view(-1, group_size)  # (P, G)
    nan = torch.isnan(grouped)
    hi = torch.where(nan, -torch.inf, grouped).amax(dim=1)
    lo = torch.where(nan, torch.inf, grouped).amin(dim=1)
    return (hi <= lo).repeat_interleave(group_size)  # (N,)


def completion_entropy(entropy: Tensor, mask: Tensor) -> Tensor:
    """``<H>_i (N,)``: each completion's mean token entropy over ``mask (N, T)`` (``entropy (N, T)``, detached,
    in float32 at least)."""
    ent = entropy.detach()
    return masked_mean(ent if ent.dtype in (torch.float32, torch.float64) else ent.float(), mask, dim=1)


def token_advantages(advantages: Tensor, inputs: GroupInputs, mask: Tensor, config: GTPOConfig) -> Tensor:
    """``(N, T)`` float32: GTPO's loss as token-level advantages, for an engine whose policy loss is the plain
    PPO-clip surrogate with per-token advantages, averaged over each completion's tokens and then over the ``N``
    completions (verl's ``seq-mean-token-mean`` with the global batch size).

    ``A_it = s * a_i * lambda_it / d_i`` on ``mask (N, T)`` (0 elsewhere): ``a (N,)`` the effective advantages
    (:func:`effective_advantages`), ``lambda = inputs.token_weights`` (1 without conflict masks), ``d_i =
    max(n_conflict_i, 1)`` when ``config.divide_by_conflict_count`` and conflict masks are on (1 otherwise, as
    ``POLICY_LOSSES["gtpo"]`` reads it), ``s = G`` for ``completion_reduction="sum"`` (the sum over a group, mean
    over groups, is ``G`` times the mean over completions) and 1 for ``"mean"``. Since ``lambda, d, s >= 0``,
    ``-min(r A_it, clip(r) A_it) = (s lambda_it / d_i) * -min(r a_i, clip(r) a_i)``: the reduced surrogate equals
    :func:`gtpo.maths.losses.gtpo_loss` (loss and gradient) for any ratio ``r``, clipped or not.

    Raises ValueError for a negative ``pos_weight`` / ``neg_weight`` (a negative lambda does not commute with the
    clip's ``min``: no token-level advantage reproduces it).
    """
    if inputs.token_weights is not None and (config.pos_weight < 0 or config.neg_weight < 0):
        raise ValueError(f"pos_weight / neg_weight: token-level advantages need conflict weights >= 0 (a negative "
                         f"weight does not commute with the PPO clip), got pos_weight={config.pos_weight}, "
                         f"neg_weight={config.neg_weight}")
    _check_tensor("mask", mask, ndim=2)
    _check_shape("advantages", advantages, (mask.shape[0],), "(N,)")
    per_row = advantages.detach().float()
    if inputs.n_conflict is not None and config.divide_by_conflict_count:
        per_row = per_row / inputs.n_conflict.clamp(min=1).to(per_row.dtype)
    if config.completion_reduction == "sum":
        per_row = per_row * config.group_size
    out = per_row[:, None] * mask.float()
    if inputs.token_weights is not None:
        out = out * inputs.token_weights.to(out.dtype)
    return out
