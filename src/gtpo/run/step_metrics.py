"""The step's metrics record of gtpo's trainer: one dict per step, the line ``metrics.jsonl`` gets and the trackers
log, averaged over processes in one host sync (names: :mod:`gtpo.run.metric_names`; the table: docs/metrics.md)."""

from __future__ import annotations

import torch

from .metric_names import canonical_name
from .update import UpdateInputs, UpdateResult

__all__ = ["agent_metrics", "step_metrics"]


def step_metrics(trainer, batch, all_rewards: torch.Tensor, inputs: UpdateInputs, result: UpdateResult,
                 stats: dict[str, float], no_signal: str | None, times: tuple[float, float, float],
                 learning_rate: float) -> dict[str, float]:
    """The step's metrics, averaged over processes (one host sync). TRL's names where TRL logs the same
    quantity, GTPO's own under ``gtpo/`` (:mod:`gtpo.run.metric_names`; the table: docs/metrics.md).

    ``trainer`` is the :class:`gtpo.trainer.GTPOTrainer` after the step (read only: its accelerator, group size,
    reward names, learning rate, step, skip and no-signal counters, ⟨H⟩_ini); ``batch`` the step's
    :class:`gtpo.rewards.scoring.ScoredBatch` (this process's rows); ``all_rewards (P_all * G,)`` the rewards of
    every process; ``inputs`` and ``result`` the update's; ``stats`` the rollout's metrics (dynamic sampling, vLLM
    sync); ``no_signal`` the reason this step trained nothing, or None; ``times`` the step's, sampling's and
    update's seconds (``num_tokens``: ``trainer.num_tokens`` before the step plus this step's prompt and completion
    tokens over all processes, TRL's metric); ``learning_rate`` the rate this step's updates used (TRL logs the same: the rate before the
    scheduler steps)."""
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
        "step_tokens": (rollout.prompt_mask.sum() + rollout.completion_mask.sum()).float(),  # summed below
        "gtpo/conflict_frac": inputs.conflict_frac,
        **{canonical_name(key): val / n for key, val in result.metrics.items()},
        **{canonical_name(key): val for key, val in result.policy_change.items()},
        **{k: v for k, v in (result.sampler or {}).items() if not k.endswith(("_max", "_min"))},
    }
    agent = rollout.agent
    if agent is not None:  # multi-turn completions (tools, environment_factory, a rollout_func's env_mask)
        counted = getattr(trainer, "toolbox", None) is not None  # tool calls are counted by gtpo's tool loop only
        local.update(agent_metrics(rollout.completion_mask, agent.tool_mask, agent.calls if counted else None,
                                   agent.failures if counted else None))
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
    step_tokens = round(metrics.pop("step_tokens") * acc.num_processes)  # the mean over processes -> the sum
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
        "learning_rate": learning_rate,
        "num_tokens": float(trainer.num_tokens + step_tokens),  # TRL's: prompt and completion tokens so far
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


def agent_metrics(completion_mask: torch.Tensor, tool_mask: torch.Tensor, calls: torch.Tensor | None = None,
                  failures: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The ``tools/*`` metrics of a batch (docs/metrics.md; the same on both engines): ``tools/turns_mean`` (model
    turns per completion: maximal runs of model tokens), ``tools/env_token_frac`` (tool / environment tokens over
    all completion tokens) and, given the counts ``calls (N,)`` and ``failures (N,)``, TRL's
    ``tools/call_frequency`` (calls per completion) and ``tools/failure_frequency`` (failed calls over calls).

    ``completion_mask (N, T)`` 1 on completion tokens (tool ones included); ``tool_mask (N, T)`` 0 on tool tokens.
    Plain sums as 0-dim float tensors; the caller averages over processes."""
    c = completion_mask.float()
    model = c * (tool_mask.to(c.device) != 0).float()  # (N, T)
    starts = model[:, :1].sum() + (model[:, 1:] * (1 - model[:, :-1])).sum()  # runs of model tokens
    out = {"tools/turns_mean": starts / max(c.shape[0], 1),
           "tools/env_token_frac": (c - model).sum() / c.sum().clamp(min=1)}
    if calls is not None:
        total = calls.float().sum()
        out["tools/call_frequency"] = total / max(calls.numel(), 1)
        out["tools/failure_frequency"] = failures.float().sum() / total.clamp(min=1)
    return out
