"""What one update of gtpo's trainer takes and gives back, and the sampler comparison it records.

* :class:`UpdateInputs` -- the loss mask and GTPO's per-row inputs (conflict weights, gamma-shift and sign rows,
  ⟨H⟩_ini, reference log-probs) that :meth:`gtpo.trainer.GTPOTrainer.gtpo_inputs` computes for the update;
* :class:`UpdateResult` -- what :meth:`gtpo.trainer.GTPOTrainer.update` did (loss, gradient norm, skips, metric sums);
* :class:`SamplerStats` -- with vLLM, the gap between the sampler's log-probs and the trainer's ``pi_old`` and the
  importance weights of ``vllm_importance_sampling_correction``, accumulated over the update's micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import GTPOConfig
from ..maths.losses import LossExtras, sampler_importance_weights

__all__ = ["SamplerStats", "UpdateInputs", "UpdateResult"]


@dataclass
class UpdateInputs:
    """What the update needs besides the rollout and the advantages (this process's ``N`` rows).

    ``mask (N, T)`` float, the loss mask (truncated completions removed with
    ``mask_truncated_completions``); ``token_weights (N, T)`` and ``n_conflict (N,)`` the conflict
    weights (None without conflict masks); ``conflict_frac`` the share of masked tokens in a conflict
    run; ``shift_mask (N,)`` the rows the gamma shift reaches (None: all); ``sign_mask (N,)`` the rows
    a ``completion_sign`` control trains on (None: all); ``initial_entropy`` ⟨H⟩_ini (the paper's rule)
    or None; ``ref_logp (N, T)`` the reference model's log-probs (``beta > 0``) or None.
    """

    mask: torch.Tensor
    token_weights: torch.Tensor | None
    n_conflict: torch.Tensor | None
    conflict_frac: torch.Tensor
    shift_mask: torch.Tensor | None
    sign_mask: torch.Tensor | None
    initial_entropy: float | None
    ref_logp: torch.Tensor | None


    def loss_extras(self, index: slice, is_weights: torch.Tensor | None, *, device, num_sequences: int,
                    num_tokens: int) -> LossExtras:
        """The loss's optional tensors of the rows ``index`` on ``device`` (conflict weights and counts, reference
        log-probs; ``is_weights`` the sampler's importance weights of those rows) and the whole batch's
        normalisers."""
        def rows(t):
            return None if t is None else t[index].to(device)

        return LossExtras(token_weights=rows(self.token_weights), n_conflict=rows(self.n_conflict),
                          ref_logp=rows(self.ref_logp), is_weights=is_weights, num_sequences=num_sequences,
                          num_tokens=num_tokens)


@dataclass
class UpdateResult:
    """What :meth:`gtpo.trainer.GTPOTrainer.update` did: the last pass's ``loss`` (0-dim), ``grad_norm`` (0-dim),
    ``skipped_updates`` (non-finite passes not applied), ``metrics`` (loss metrics summed over rows of
    the first pass), ``entropy_sum`` (token entropies summed over the mask), ``signal`` (3,) counts of
    :func:`gtpo.run.diagnostics.signal_counts`, ``seq_entropy (N,)`` the rollout policy's completion entropies,
    ``policy_change`` (``log_policy_change`` metrics) and ``sampler`` (with vLLM: the log-prob gap and
    importance-weight metrics of this process, :meth:`SamplerStats.metrics`)."""

    loss: torch.Tensor
    grad_norm: torch.Tensor
    skipped_updates: int
    metrics: dict[str, torch.Tensor]
    entropy_sum: torch.Tensor
    signal: torch.Tensor
    seq_entropy: torch.Tensor
    policy_change: dict[str, torch.Tensor]
    sampler: dict[str, torch.Tensor] | None = None


class SamplerStats:
    """The step's comparison of the sampler's log-probs (vLLM) with the trainer's ``pi_old`` (its own log-probs
    of the same tokens in the first pass, at ``logprob_temperature``), and the importance weights of
    ``vllm_importance_sampling_correction`` (:func:`gtpo.maths.losses.sampler_importance_weights`), over this
    process's masked tokens:

    ``vllm/logprob_gap_mean`` / ``_max``: mean and max of ``|log pi_old - log pi_vllm|``;
    ``vllm/logprob_diff_mean``: mean of ``log pi_old - log pi_vllm`` (its sign shows a bias);
    with the correction, ``vllm/is_weight_mean`` / ``_min`` / ``_max`` and ``vllm/is_bounded_frac`` (tokens
    whose ratio was clipped or masked)."""

    def __init__(self, device, args: GTPOConfig):
        zero = torch.zeros((), device=device)
        self.sums = {"gap": zero.clone(), "diff": zero.clone(), "tokens": zero.clone(), "is": zero.clone(),
                     "bounded": zero.clone()}
        self.gap_max = zero.clone()
        self.is_min = self.is_max = None
        self.args = args
        self.correct = args.resolved_vllm_importance_sampling_correction

    def observe(self, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, *, first: bool
                ) -> torch.Tensor | None:
        """Record the gap (``first`` pass only) of a micro-batch; return its IS weights with the correction."""
        args, correct = self.args, self.correct
        m = mask.float()
        if first:
            diff = (old - sampling) * m
            self.sums["gap"] += diff.abs().sum()
            self.sums["diff"] += diff.sum()
            self.sums["tokens"] += m.sum()
            if m.any():
                self.gap_max = torch.maximum(self.gap_max, diff.abs().max())
        if not correct:
            return None
        weights, metrics = sampler_importance_weights(
            old, sampling, mask, mode=args.vllm_importance_sampling_mode,
            clip_min=args.vllm_importance_sampling_clip_min, clip_max=args.vllm_importance_sampling_clip_max)
        if first:
            self.sums["is"] += (weights * m).sum()
            self.sums["bounded"] += metrics["vllm/is_bounded_frac"] * m.sum()
            if m.any():
                low, high = metrics["vllm/is_weight_min"], metrics["vllm/is_weight_max"]
                self.is_min = low if self.is_min is None else torch.minimum(self.is_min, low)
                self.is_max = high if self.is_max is None else torch.maximum(self.is_max, high)
        return weights

    def metrics(self) -> dict[str, torch.Tensor]:
        tokens = self.sums["tokens"].clamp(min=1)
        out = {"vllm/logprob_gap_mean": self.sums["gap"] / tokens, "vllm/logprob_gap_max": self.gap_max,
               "vllm/logprob_diff_mean": self.sums["diff"] / tokens}
        if self.correct:  # the same keys on every process (the metrics are reduced together)
            one = torch.ones_like(self.gap_max)
            out.update({"vllm/is_weight_mean": self.sums["is"] / tokens,
                        "vllm/is_weight_min": one if self.is_min is None else self.is_min,
                        "vllm/is_weight_max": one if self.is_max is None else self.is_max,
                        "vllm/is_bounded_frac": self.sums["bounded"] / tokens})
        return out
