"""gtpo.maths.method.token_advantages: GTPO's loss as token-level advantages (the form verl's policy losses take)."""

import pytest
import torch

from gtpo import GTPOConfig
from gtpo.maths import method
from gtpo.maths.losses import POLICY_LOSSES, LossExtras


def _rollout(seed: int, G: int = 4, P: int = 3, T: int = 9):
    """Groups whose completions share prefixes and suffixes (so conflict runs exist), one zero-variance group,
    one truncated completion (no padding), the others right padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 12, (P * G, T), generator=g)
    ids[:, :3] = ids[0, :3]  # a shared prefix of 3 tokens in every group
    lengths = torch.randint(4, T, (P * G,), generator=g)
    lengths[1] = T  # truncated: all T tokens
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    for i in range(P * G):  # a shared suffix of 2 tokens before each end
        ids[i, lengths[i] - 2:lengths[i]] = torch.tensor([5, 7])
    rewards = torch.randint(0, 2, (P * G,), generator=g).float()
    rewards[:G] = torch.tensor([1.0, 0.0, 1.0, 0.0])  # one group certainly varying
    rewards[G:2 * G] = 1.0  # a zero-variance group
    entropy = torch.rand(P * G, T, generator=g) * 1.4
    logp = -torch.rand(P * G, T, generator=g, dtype=torch.float64) * 3
    old = logp + 0.4 * torch.randn(P * G, T, generator=g, dtype=torch.float64)  # clipping is active
    return ids, mask, rewards, entropy, logp, old


def _reduced_surrogate(logp, old, adv_tok, mask, eps_low, eps_high):
    """The plain PPO-clip surrogate with token-level advantages, token mean per completion, mean over the N
    completions (verl's seq-mean-token-mean with the global batch size N), written out."""
    ratio = torch.exp(logp - old)
    per_token = -torch.minimum(ratio * adv_tok, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv_tok)
    per_completion = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1)
    return per_completion.sum() / mask.shape[0]


@pytest.mark.parametrize("preset", ["official", "paper"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_token_advantages_reproduce_gtpo_loss_and_gradient(preset, seed):
    G = 4
    cfg = GTPOConfig.from_preset(preset, group_size=G, epsilon_high=0.28)
    ids, mask, rewards, entropy, logp, old = _rollout(seed, G=G)
    from gtpo.maths.advantages import group_advantages

    adv = group_advantages(rewards, G, scale=cfg.resolved_scale_rewards)
    inputs = method.group_inputs(ids, mask, adv, cfg)
    assert inputs.token_weights is not None and bool((inputs.token_weights != 1).any())  # conflicts exist
    seq_entropy = method.completion_entropy(entropy, mask)
    initial = method.initial_entropy_value(method.initial_entropy_sums(seq_entropy, mask)) \
        if method.uses_initial_entropy(cfg) else None
    eff = method.effective_advantages(adv, seq_entropy, cfg, initial_entropy=initial, shift_mask=inputs.shift_mask,
                                      sign_rows=inputs.sign_mask).advantages

    lp1 = logp.clone().requires_grad_(True)
    ref = POLICY_LOSSES["gtpo"](lp1, old, eff, mask, LossExtras(token_weights=inputs.token_weights,
                                                                 n_conflict=inputs.n_conflict), cfg).loss
    ref.backward()
    lp2 = logp.clone().requires_grad_(True)
    tok = method.token_advantages(eff, inputs, mask, cfg).double()
    got = _reduced_surrogate(lp2, old, tok, mask, cfg.epsilon, cfg.resolved_epsilon_high)
    got.backward()
    assert abs(float(got.detach()) - float(ref.detach())) <= 1e-6 * max(1.0, abs(float(ref.detach())))
    torch.testing.assert_close(lp2.grad, lp1.grad, rtol=1e-6, atol=1e-9)
    assert bool((tok[mask == 0] == 0).all())


def test_token_advantages_golden():
    """Two rows of one group: lambda, the conflict-count division and the factor G, by hand."""
    cfg = GTPOConfig.from_preset("official", group_size=2)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    inputs = method.GroupInputs(token_weights=torch.tensor([[2.0, 1.0, 1.0], [0.0, 1.0, 0.0]]),
                                n_conflict=torch.tensor([1, 2]), conflict_run=None, shift_mask=None, sign_mask=None)
    tok = method.token_advantages(torch.tensor([0.5, -0.5]), inputs, mask, cfg)
    # row 0: 2 * 0.5 * [2, 1, 1] / 1; row 1: 2 * -0.5 * [0, 1, 0] / 2
    torch.testing.assert_close(tok, torch.tensor([[2.0, 1.0, 1.0], [0.0, -0.5, 0.0]]))
    paper = GTPOConfig.from_preset("paper", group_size=2)  # mean reduction, no division
    torch.testing.assert_close(method.token_advantages(torch.tensor([0.5, -0.5]), inputs, mask, paper),
                               torch.tensor([[1.0, 0.5, 0.5], [0.0, -0.5, 0.0]]))


def test_token_advantages_refuse_negative_conflict_weights():
    cfg = GTPOConfig.from_preset("official", group_size=2, neg_weight=-1.0)
    inputs = method.GroupInputs(torch.ones(2, 3), torch.ones(2, dtype=torch.long), None, None, None)
    with pytest.raises(ValueError, match="neg_weight=-1.0"):
        method.token_advantages(torch.zeros(2), inputs, torch.ones(2, 3), cfg)
