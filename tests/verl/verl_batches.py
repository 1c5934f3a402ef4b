"""Synthetic verl batches for tests/verl: groups with shared prefixes and suffixes (so conflict runs exist), a
zero-variance group, a truncated completion, completion entropies on both sides of the filter thresholds."""

from __future__ import annotations

import os

import numpy as np
import torch

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "verl")


def compose(name: str = "qwen2.5-3b-gsm8k-gtpo", overrides: list[str] | None = None):
    """A config of configs/verl composed by hydra with verl's own ppo_trainer defaults (as main_ppo does)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=os.path.abspath(CONFIG_DIR), version_base=None):
        return hydra_compose(config_name=name, overrides=overrides or [])


def rollout(seed: int, G: int = 4, P: int = 3, T: int = 10) -> dict:
    """One rollout batch in prompt-major order (rows p * G + g): ``ids (N, T)``, ``lengths (N,)``, ``mask (N, T)``,
    ``rewards (N,)``, ``scores (N, T)`` (verl's rm_scores: the reward on the last response token), ``entropy (N, T)``
    float64, ``prompt_len (N,)``, ``uid`` list."""
    g = torch.Generator().manual_seed(seed)
    N = P * G
    ids = torch.randint(3, 12, (N, T), generator=g)
    for p in range(P):
        ids[p * G:(p + 1) * G, :3] = ids[p * G, :3]  # a shared prefix of 3 tokens in each group
    lengths = torch.randint(4, T, (N,), generator=g)
    lengths[1] = T  # a truncated completion: the whole budget, no padding
    for i in range(N):  # a shared suffix before each end
        ids[i, lengths[i] - 2:lengths[i]] = torch.tensor([5, 7])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    rewards = torch.randint(0, 2, (N,), generator=g).float()
    rewards[:G] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    rewards[G:2 * G] = 1.0  # a zero-variance group
    scale = torch.linspace(0.2, 2.2, N)[torch.randperm(N, generator=g)]  # mean entropies ~0.1 .. ~1.1
    entropy = (torch.rand(N, T, generator=g, dtype=torch.float64) * scale[:, None].double())
    scores = torch.zeros(N, T)
    scores[torch.arange(N), lengths - 1] = rewards
    prompt_len = torch.randint(2, 6, (N,), generator=g)
    uid = [f"prompt-{seed}-{i // G}" for i in range(N)]
    return dict(ids=ids, lengths=lengths, mask=mask, rewards=rewards, scores=scores, entropy=entropy,
                prompt_len=prompt_len, uid=uid, G=G)


def log_probs(seed: int, shape) -> tuple[torch.Tensor, torch.Tensor]:
    """``logp (N, T)`` and ``old (N, T)`` float64 that differ by enough for the clip to act."""
    g = torch.Generator().manual_seed(1000 + seed)
    logp = -torch.rand(shape, generator=g, dtype=torch.float64) * 3
    return logp, logp + 0.4 * torch.randn(shape, generator=g, dtype=torch.float64)


def uid_array(uid) -> np.ndarray:
    return np.array(uid, dtype=object)
