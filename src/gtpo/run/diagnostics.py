"""Diagnostics that explain a run: steps without gradient signal (and why), how far a step moved the policy.

* :class:`NoSignalCounter` -- a step whose effective advantages are all 0 (the entropy filter dropped
  every completion, every group's rewards were equal with nothing to shift, every completion was
  truncated and masked) or whose update was skipped (non-finite) trains nothing; the counter says
  how many such steps there were and why, and warns when the entropy filter is the reason (the
  fixed tau = 0.7 of the released code on a model that samples above 0.7 nats trains nothing).
* :func:`signal_counts` -- the per-micro-batch counts the counter decides from.
* :func:`probe_probabilities` -- the probability of fixed texts (format tags, a shared prefix) under
  the policy, logged every step (``probe/<name>``).
* :func:`policy_change_sums` -- KL estimators between the policy after and before a step on the
  step's own sampled tokens (``log_policy_change``), so that arms can be compared at equal step
  size as well as at equal learning rate.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import Tensor

logger = logging.getLogger("gtpo")

__all__ = ["FILTERED_WARNING_INTERVAL", "NO_SIGNAL_REASONS", "NoSignalCounter", "policy_change_sums",
           "probe_probabilities", "signal_counts"]

#: why a step had no policy-gradient signal
NO_SIGNAL_REASONS = ("filtered", "zero_variance", "masked", "nonfinite")
#: the "entropy filter dropped everything" warning repeats at most once per this many steps
FILTERED_WARNING_INTERVAL = 50


def signal_counts(effective: Tensor, dropped: Tensor, mask: Tensor) -> Tensor:
    """``(3,)`` float counts over a micro-batch: completions with tokens in ``mask (M, T)`` (the loss
    mask), those whose ``effective (M,)`` advantage (the one multiplying the gradient) is non-zero,
    and those ``dropped (M,)`` (bool) by the entropy filter."""
    has_tokens = mask.sum(dim=1) > 0
    return torch.stack([has_tokens.sum(), (has_tokens & (effective != 0)).sum(),
                        (has_tokens & dropped).sum()]).float()


class NoSignalCounter:
    """Steps without gradient signal, by reason (:data:`NO_SIGNAL_REASONS`); saved in checkpoints."""

    def __init__(self):
        self.counts = dict.fromkeys(NO_SIGNAL_REASONS, 0)
        self._last_warning: int | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def record(self, step: int, counts: Tensor, *, skipped: bool, seq_entropy: Tensor, mask: Tensor,
               threshold: float, temperature: float) -> str | None:
        """Count step ``step`` if it had no signal and return why (None if it had signal).

        ``counts (3,)``: :func:`signal_counts` summed over the step (all processes); ``skipped``: the
        update was not applied (non-finite). ``seq_entropy (N,)``, ``mask (N, T)``, the filter's
        ``threshold`` and the sampling ``temperature`` only go into the warning logged the first time
        the entropy filter dropped everything (and at most once per FILTERED_WARNING_INTERVAL steps
        after that), which says what was measured and what to change.
        """
        with_tokens, with_signal, dropped = (int(c) for c in counts.tolist())
        if skipped:
            reason = "nonfinite"
        elif with_signal > 0:
            return None
        elif with_tokens == 0:
            reason = "masked"
        elif dropped > 0:
            reason = "filtered"
        else:
            reason = "zero_variance"
        self.counts[reason] += 1
        if reason == "filtered" and (self._last_warning is None or step - self._last_warning >= FILTERED_WARNING_INTERVAL):
            self._last_warning = step
            has_tokens = mask.sum(dim=1).to(seq_entropy.device) > 0
            measured = float(seq_entropy[has_tokens].mean()) if bool(has_tokens.any()) else float("nan")
            logger.warning(
                "step %d: the entropy filter dropped every completion (mean token entropy %.3f nats > "
                "entropy_threshold %.3f), so this step trained nothing (%d such step(s) so far). Use the paper's "
                "rule (entropy_rule: initial), a higher entropy_threshold (e.g. %.2f), or a lower temperature "
                "(now %g); entropy_filter: false switches the filter off.",
                step, measured, threshold, self.counts["filtered"],
                math.ceil(measured * 10 + 1) / 10 if math.isfinite(measured) else 2.0, temperature,
            )
        return reason

    def summary(self) -> str:
        """``'3 (filtered 2, nonfinite 1)'``: steps without gradient signal and why; ``'0'`` if none."""
        parts = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in self.counts.items() if v)
        return f"{self.total} ({parts})" if self.total else "0"

    def state_dict(self) -> dict[str, int]:
        return dict(self.counts)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.counts = {**dict.fromkeys(NO_SIGNAL_REASONS, 0), **{k: int(v) for k, v in state.items()}}


def policy_change_sums(new_logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """``(3,)`` sums over the masked tokens: ``r log r - r + 1`` (an estimator of KL(pi_new || pi_old)
    with tokens sampled from pi_old, non-negative), ``(r - 1) - log r`` (k3, KL(pi_old || pi_new)),
    and the token count; ``r = pi_new / pi_old`` of the sampled token. ``new_logp``, ``old_logp``,
    ``mask``: ``(M, T)``."""
    m = mask.bool()
    log_r = torch.where(m, new_logp - old_logp, torch.zeros_like(new_logp))
    r = log_r.exp()
    return torch.stack([(r * log_r - r + 1)[m].sum(), ((r - 1) - log_r)[m].sum(), m.sum().to(new_logp.dtype)])


@torch.no_grad()
def probe_probabilities(model, tokenizer, probes: dict[str, tuple[str, str]], *, temperature: float = 1.0) -> dict[str, float]:
    """``{"probe/<name>": p}``: the mean probability of each probe's target tokens after its prefix
    (``probes = {name: (prefix, target)}``), from ``model``'s logits divided by ``temperature``."""
    out = {}
    dev = next(model.parameters()).device
    for name, (prefix, target) in probes.items():
        p_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
        t_ids = tokenizer(target, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([p_ids + t_ids], device=dev)
        logits = model(input_ids=ids).logits[0, len(p_ids) - 1:-1].float() / temperature  # (len(target), V)
        probs = torch.softmax(logits, -1).gather(-1, torch.tensor(t_ids, device=dev).unsqueeze(-1))
        out[f"probe/{name}"] = float(probs.mean())
    return out
