"""Group-relative advantages and GTPO's entropy control.

Shapes: ``P`` prompts, ``G = group_size`` completions per prompt, ``N = P * G`` rows in
prompt-major order (row ``p * G + g``).

Advantage (gtpo-method.md §3). GTPO's reference code uses ``A_i = R_i - mean_group(R)`` and does
NOT divide by the group standard deviation (it is commented out) [C]; this is also Dr.GRPO's
choice (Liu et al. 2025). GRPO (Shao et al. 2024) divides by the group std; TRL's
``scale_rewards="batch"`` divides by the std of the whole batch. All three are offered
(``scale="none" | "group" | "batch"``) [D]; the std is the unbiased one, as in TRL and
DeepSeekMath. Zero-variance groups (all rewards equal) get an advantage of exactly 0, also in
float arithmetic, so that they are "inactive" for conflict detection (the sign of the advantage
decides positive / negative completions).

Entropy control (gtpo-method.md §5), applied to the advantages by :func:`shape_advantages`:

* filter: a completion whose mean token entropy ``<H>_i`` is strictly above ``threshold``
  (0.7 ~ ln 2, the entropy of two equiprobable tokens) gets advantage 0. The reference code
  always applies it to every completion [C]; the paper's printed objective switches the filter
  off when the initial policy entropy ``<H>_ini`` is already above the threshold [P]
  (``initial_entropy=...``); the paper's "OnlyNeg" ablation filters only negative completions
  [P] (``scope="negative"``); ``threshold=None`` switches the filter off (the paper's
  "gamma without the filter" ablation) [D].
* shaping: kept completions get ``A_i - gamma * <H>_i`` [P][C], a sequence-level penalty on
  entropy (the opposite sign of PPO's entropy bonus). Side effect kept on purpose (it is the
  method): an all-equal-reward group still receives ``-gamma <H>_i``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import COMPLETION_SIGNS, FILTER_SCOPES, GTPO_GAMMA, SCALE_REWARDS
from .ops import _check_group_size, _check_option, _check_shape, _check_tensor

__all__ = ["entropy_control", "entropy_keep_mask", "group_advantages", "shape_advantages", "sign_mask",
           "varying_groups"]


def group_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    scale: str = "none",
    eps: float = 1e-4,
) -> Tensor:
    """Group-relative advantages ``A (N,)`` from ``rewards (N,)`` (prompt-major, row p*G+g).

    * ``scale="none"`` (GTPO [C], Dr.GRPO): ``A_i = R_i - mean_{j in group(i)} R_j``;
    * ``scale="group"`` (GRPO): ``(R_i - mean) / (std_group + eps)``;
    * ``scale="batch"`` (TRL ``scale_rewards="batch"``): ``(R_i - mean) / (std_batch + eps)``.

    ``std`` is the unbiased standard deviation (TRL, DeepSeekMath). Groups whose rewards are all
    equal get exactly 0 (never NaN). Integer rewards are converted to float32. The result has no
    gradient link to anything but ``rewards``.
    """
    _check_tensor("rewards", rewards, ndim=1)
    _check_group_size(group_size, rewards.shape[0], "rewards")
    _check_option("scale", scale, SCALE_REWARDS)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps < 0:
        raise ValueError(f"eps: expected a float >= 0, got {eps!r}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)

    grouped = rewards.view(-1, group_size)  # (P, G)
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # (P, G)
    # exact zeros for zero-variance groups: the float mean of equal numbers can differ from
    # them in the last bit (e.g. three 0.1), which would make the group look "active".
    constant = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)  # (P, 1)
    centred = torch.where(constant, torch.zeros((), dtype=centred.dtype, device=centred.device), centred)
    if scale != "none":
        if scale == "group":
            denom = grouped.std(dim=1, keepdim=True) + eps  # (P, 1), unbiased std
        else:
            denom = rewards.std() + eps  # 0-dim, unbiased std of the whole batch
        # with eps=0 a zero std meets a centred value that is exactly 0: 0 / 1, not 0 / 0
        centred = centred / torch.where(denom == 0, torch.ones_like(denom), denom)
    return centred.reshape(-1)  # (N,)


def entropy_keep_mask(
    advantages: Tensor,
    seq_entropy: Tensor,
    *,
    threshold: float | None = 0.7,
    scope: str = "all",
    initial_entropy: float | Tensor | None = None,
) -> Tensor:
    """The entropy filter ``delta (N,)`` (bool): True for completions that are kept.

    ``advantages (N,)`` (unshaped; only its sign is used, for ``scope="negative"``),
    ``seq_entropy (N,)`` the mean token entropy ``<H>_i`` of each completion.
    A completion is dropped when ``<H>_i > threshold`` (strictly) and, for ``scope="negative"``,
    ``A_i < 0``. ``threshold=None`` keeps everything. With ``initial_entropy`` (``<H>_ini``, a
    float or a 0-dim tensor) nothing is dropped when ``initial_entropy > threshold`` [P].
    """
    _check_tensor("advantages", advantages, ndim=1)
    _check_shape("seq_entropy", seq_entropy, advantages.shape, "advantages.shape (N,)")
    _check_option("scope", scope, FILTER_SCOPES)
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))):
        raise ValueError(f"threshold: expected a float or None, got {threshold!r}")
    if initial_entropy is not None:
        if isinstance(initial_entropy, Tensor):
            if initial_entropy.dim() != 0:
                raise ValueError(
                    f"initial_entropy: expected a float or a 0-dim tensor, got shape "
                    f"{tuple(initial_entropy.shape)}"
                )
        elif isinstance(initial_entropy, bool) or not isinstance(initial_entropy, (int, float)):
            raise ValueError(f"initial_entropy: expected a float, a 0-dim tensor or None, got {initial_entropy!r}")
    if threshold is None:
        return torch.ones_like(advantages, dtype=torch.bool)
    drop = seq_entropy.detach() > threshold  # (N,)
    if scope == "negative":
        drop = drop & (advantages < 0)
    if initial_entropy is not None:
        # [P] delta_i = 1 for everyone when <H>_ini > threshold (tensor op: no host sync)
        filter_on = torch.as_tensor(initial_entropy, device=drop.device) <= threshold
        drop = drop & filter_on
    return ~drop


def entropy_control(
    advantages: Tensor,
    seq_entropy: Tensor,
    *,
    threshold: float | None = 0.7,
    gamma: float = GTPO_GAMMA,
    scope: str = "all",
    initial_entropy: float | Tensor | None = None,
    shift_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GTPO's entropy-controlled advantages ``A' (N,)`` and the filter's ``keep (N,)`` (bool).

    ``advantages (N,)`` the unshaped group advantages, ``seq_entropy (N,)`` the mean token
    entropy of each completion (used detached). Filtered completions (see
    :func:`entropy_keep_mask`: ``<H>_i > threshold``, optionally only the negative ones,
    optionally switched off by ``initial_entropy > threshold``) get 0; kept ones get
    ``A_i - gamma * <H>_i`` [P][C]. ``threshold=None`` keeps every completion. ``shift_mask (N,)``
    bool limits the shift to its rows (e.g. :func:`varying_groups`, the ``gamma_groups="varying"``
    ablation) [D]; None shifts every kept completion.
    """
    keep = entropy_keep_mask(
        advantages, seq_entropy, threshold=threshold, scope=scope, initial_entropy=initial_entropy
    )
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)):
        raise ValueError(f"gamma: expected a float, got {gamma!r}")
    shift = gamma * seq_entropy.detach().to(advantages.dtype)  # (N,)
    if shift_mask is not None:
        _check_shape("shift_mask", shift_mask, advantages.shape, "advantages.shape (N,)")
        shift = torch.where(shift_mask, shift, torch.zeros((), dtype=shift.dtype, device=shift.device))
    shifted = advantages - shift
    return torch.where(keep, shifted, torch.zeros((), dtype=shifted.dtype, device=shifted.device)), keep


def shape_advantages(advantages: Tensor, seq_entropy: Tensor, **kwargs) -> Tensor:
    """``A' (N,)`` of :func:`entropy_control` (same arguments), without the keep mask."""
    return entropy_control(advantages, seq_entropy, **kwargs)[0]


def varying_groups(advantages: Tensor, group_size: int) -> Tensor:
    """``(N,)`` bool: True on the rows of groups whose rewards differ (some advantage != 0).

    ``advantages (N,)`` from :func:`group_advantages`, whose zero-variance groups are exactly 0.
    """
    _check_tensor("advantages", advantages, ndim=1)
    _check_group_size(group_size, advantages.shape[0], "advantages")
    return (advantages.view(-1, group_size) != 0).any(dim=1).repeat_interleave(group_size)  # (N,)


def sign_mask(advantages: Tensor, sign: str) -> Tensor:
    """``(N,)`` bool: the completions a ``completion_sign`` control trains on, by the sign of the
    UNSHAPED ``advantages (N,)``: ``"all"`` every row, ``"positive"`` A > 0, ``"negative"`` A < 0."""
    _check_tensor("advantages", advantages, ndim=1)
    _check_option("sign", sign, COMPLETION_SIGNS)
    if sign == "positive":
        return advantages > 0
    if sign == "negative":
        return advantages < 0
    return torch.ones_like(advantages, dtype=torch.bool)
