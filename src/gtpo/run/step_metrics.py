"""The step's metrics record of gtpo's trainer: one dict per step, the line ``metrics.jsonl`` gets and the trackers
log, averaged over processes in one host sync (names: :mod:`gtpo.run.metric_names`; the table: docs/metrics.md)."""

from __future__ import annotations

import torch

from .metric_names import canonical_name
from .update import UpdateInputs, UpdateResult

__all__ = ["step_metrics"]


def step_metrics(trainer, batch, all_rewards: torch.Tensor, inputs: UpdateInputs, result: UpdateResult,
                 stats: dict[str, float], no_signal: str | None, times: tuple[float, float, float]) -> dict[str, float]:
    """The step's metrics, averaged over processes (one host sync). TRL's names where TRL logs the same
    quantity, GTPO's own under ``gtpo/`` (:mod:`gtpo.run.metric_names`; the table: docs/metrics.md).

    ``trainer`` is the :class:`gtpo.trainer.GTPOTrainer` after the step (read only: its accelerator, group size,
    reward names, learning rate, step, skip and no-signal counters, ⟨H⟩_ini); ``batch`` the step's
    :class:`gtpo.rewards.scoring.ScoredBatch` (this process's rows); ``all_rewards (P_all * G,)`` the rewards of
    every process; ``inputs`` and ``result`` the update's; ``stats`` the rollout's metrics (dynamic sampling, vLLM
    sync); ``no_signal`` the reason this step trained nothing, or None; ``times`` the step's, sampling's and
    update's seconds."""
    acc, g = trainer.accelerator, trainer.args.group_size
    dev = acc.device
    rollout = batch.rollout
    n = rollout.completion_ids.shape[0]
    lengths = rollout.lengths.float()
    local = {
        "loss": result.loss,
        "entropy": result.entropy_sum / inputs.mask.sum().clamp(min=1).to(dev),
        "completions/mean_length": lengths.mean(),
        "completions/clipped_ratio": rollout.truncated.float().mean(),
        "gtpo/conflict_frac": inputs.conflict_frac,
        **{canonical_name(key): val / n for key, val in result.metrics.items()},
        **{canonical_name(key): val for key, val in result.policy_change.items()},
        **{k: v for k, v in (result.sampler or {}).items() if not k.endswith(("_max", "_min"))},
    }
    for j, name in enumerate(trainer.scorer.names):
        col = batch.per_func[:, j]
        valid = ~torch.isnan(col)
        local[f"rewards/{name}/mean"] = col[valid].mean() if valid.any() else torch.tensor(0.0)
        local[f"rewards/{name}/std"] = col[valid].std() if valid.sum() > 1 else torch.tensor(0.0)
    keys = sorted(local)
    vec = torch.stack([torch.as_tensor(local[k], dtype=torch.float32).to(dev).reshape(()) for k in keys])
    metrics: dict[str, float] = dict(zip(keys, acc.reduce(vec, "mean").cpu().tolist()))
    for key, val in (result.sampler or {}).items():  # extremes over all processes
        if key.endswith("_max"):
            metrics[key] = float(acc.reduce(val.reshape(1).to(dev), "max"))
        elif key.endswith("_min"):
            metrics[key] = -float(acc.reduce(-val.reshape(1).to(dev), "max"))
    step_time, t_gen, t_upd = times
    grad_norm = result.grad_norm
    metrics.update({
        "step": trainer.global_step,
        "reward": float(all_rewards.mean()),
        "reward_std": float(all_rewards.std()) if all_rewards.numel() > 1 else 0.0,
        "frac_reward_zero_std": float((all_rewards.view(-1, g).std(dim=1) < 1e-8).float().mean()),
        "completions/max_length": float(acc.reduce(lengths.max().to(dev), "max")),
        "completions/min_length": -float(acc.reduce(-lengths.min().to(dev), "max")),
        "grad_norm": float(grad_norm) if torch.isfinite(grad_norm) else float("nan"),
        "learning_rate": trainer.step_learning_rate,  # the step's own rate, as TRL logs it (not the next step's)
        "gtpo/skipped_steps": float(trainer.skipped_steps),
        "gtpo/skipped_updates": float(trainer.skipped_updates),
        "gtpo/no_signal_steps": float(trainer.no_signal.total),
        **{f"gtpo/no_signal/{k}": float(v) for k, v in trainer.no_signal.counts.items()},
        "gtpo/no_signal": float(no_signal is not None),
        "step_time": step_time,
        "gtpo/generation_time": t_gen,
        "gtpo/update_time": t_upd,
        "gtpo/tokens_per_s": float(acc.reduce(lengths.sum().to(dev), "sum")) / max(step_time, 1e-9),
        **{canonical_name(key): val for key, val in stats.items()},
    })
    if trainer.initial_entropy is not None:
        metrics["gtpo/initial_entropy"] = trainer.initial_entropy
    return metrics
