"""Tests of gtpo.maths.losses (policy_loss and its table of losses): golden values, reductions between
losses, micro-batch exactness, masked values, and a per-token reference implementation.

GTPO's entropy filter and gamma shift shape the advantages before the loss (the trainer calls
gtpo.maths.advantages.entropy_control, then the loss); ``_policy_loss`` below composes the two the same
way, so that the golden values of the whole objective stay checked in one place."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gtpo.config import LOSS_TYPES
from gtpo.config import GTPOConfig
from gtpo.maths.advantages import entropy_control, group_advantages, shape_advantages
from gtpo.maths.conflict import conflict_weights
from gtpo.maths.losses import POLICY_LOSSES, LossExtras, LossOutput, dapo_loss, dr_grpo_loss, grpo_loss, gtpo_loss
from reference_impl import ref_policy_loss, reference_code_gtpo_loss

F64 = torch.float64
SHAPING = {"entropy_threshold": "threshold", "gamma": "gamma", "filter_scope": "scope",
           "initial_entropy": "initial_entropy"}


KEYWORD_LOSSES = {"gtpo": gtpo_loss, "grpo": grpo_loss, "dr_grpo": dr_grpo_loss, "dapo": dapo_loss}


def _loss_only(loss_type, logp, mask, adv, **kw):
    """The keyword function (the maths) of ``loss_type``."""
    return KEYWORD_LOSSES[loss_type](logp, mask, adv, **kw)


def policy_loss(loss_type, logp, mask, adv, **kw):
    """For gtpo: the advantages shaped by the entropy filter and the gamma shift (``seq_entropy`` and
    the SHAPING arguments, defaults 0.7 and 0.1), then the loss; the baselines as they are."""
    if loss_type == "gtpo":
        shaping = {SHAPING[k]: kw.pop(k) for k in list(kw) if k in SHAPING}
        ent = kw.pop("seq_entropy", None)
        shaping.setdefault("threshold", 0.7)
        shaping.setdefault("gamma", 0.1)
        if ent is None:
            assert shaping["threshold"] is None and shaping["gamma"] == 0, "entropy control needs seq_entropy"
        else:
            adv = shape_advantages(adv, ent, **shaping)
    return _loss_only(loss_type, logp, mask, adv, **kw)


def _leaf(values):
    return torch.tensor(values, dtype=F64, requires_grad=True)


def _loss_and_grad(*args, **kwargs):
    logp = args[1]
    out = policy_loss(*args, **kwargs)
    (grad,) = torch.autograd.grad(out.loss, [logp])
    return out, grad


# ---------------------------------------------------------------------------
# golden values
# ---------------------------------------------------------------------------

# two completions: lengths 2 and 1 (T = 3), advantages +1 and -2, on-policy (ratio 1)
# per-token loss -A: row 0 (-1, -1), row 1 (+2)
MASK2 = torch.tensor([[1, 1, 0], [1, 0, 0]])
ADV2 = torch.tensor([1.0, -2.0], dtype=F64)


def _logp2():
    return _leaf([[-1.0, -2.0, -3.0], [-0.5, -0.7, -0.9]])


def test_grpo_on_policy_is_reinforce_golden():
    out, grad = _loss_and_grad("grpo", _logp2(), MASK2, ADV2)
    # seq-mean-token-mean: ((-1 - 1) / 2 + 2 / 1) / 2 = 0.5
    assert out.loss.item() == pytest.approx(0.5, abs=1e-15)
    # gradient -A / len_i / N: row 0 -1/2/2 = -0.25 per token, row 1 +2/1/2 = 1, padding 0
    assert grad.tolist() == [[-0.25, -0.25, 0.0], [1.0, 0.0, 0.0]]
    assert out.metrics["clipfrac"].item() == 0.0
    assert out.metrics["approx_kl"].item() == 0.0
    assert out.metrics["ratio/mean"].item() == 1.0
    assert "kl" not in out.metrics


def test_dapo_and_dr_grpo_aggregations_golden():
    out, grad = _loss_and_grad("dapo", _logp2(), MASK2, ADV2)
    # token mean: (-1 - 1 + 2) / 3 tokens = 0; gradient -A / 3
    assert out.loss.item() == pytest.approx(0.0, abs=1e-15)
    want = torch.tensor([[-1 / 3, -1 / 3, 0.0], [2 / 3, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(grad, want, rtol=0, atol=1e-15)
    out, grad = _loss_and_grad("dr_grpo", _logp2(), MASK2, ADV2, max_completion_length=4)
    # constant: sum / (max_completion_length 4 * N 2) = 0 / 8; gradient -A / 8
    assert out.loss.item() == pytest.approx(0.0, abs=1e-15)
    want = torch.tensor([[-1 / 8, -1 / 8, 0.0], [2 / 8, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(grad, want, rtol=0, atol=1e-15)


def test_ppo_clip_golden():
    # four one-token completions, eps 0.2: ratios 1.5, 1.5, 0.5, 0.5; advantages +1, -1, -1, +1
    #   a: -min(1.5, 1.2) = -1.2 (clipped, no gradient)   b: -min(-1.5, -1.2) = 1.5 (grad -A r = 1.5)
    #   c: -min(-0.5, -0.8) = 0.8 (clipped, no gradient)  d: -min(0.5, 0.8) = -0.5 (grad -A r = -0.5)
    ratios = [1.5, 1.5, 0.5, 0.5]
    logp = _leaf([[-1.0]] * 4)
    old = torch.tensor([[-1.0 - math.log(r)] for r in ratios], dtype=F64)
    mask = torch.ones(4, 1)
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=F64)
    out, grad = _loss_and_grad("grpo", logp, mask, adv, old_logp=old)
    assert out.loss.item() == pytest.approx((-1.2 + 1.5 + 0.8 - 0.5) / 4, abs=1e-12)
    assert grad[:, 0].tolist() == pytest.approx([0.0, 1.5 / 4, 0.0, -0.5 / 4], abs=1e-12)
    assert out.metrics["clipfrac"].item() == pytest.approx(0.5, abs=1e-15)
    assert out.metrics["ratio/mean"].item() == pytest.approx(1.0, abs=1e-12)
    # approx_kl = mean((r - 1) - ln r): r = 1.5 -> 0.5 - ln 1.5, r = 0.5 -> -0.5 + ln 2
    want_kl = (2 * (0.5 - math.log(1.5)) + 2 * (-0.5 + math.log(2.0))) / 4
    assert out.metrics["approx_kl"].item() == pytest.approx(want_kl, abs=1e-12)
    # DAPO clip-higher eps_high = 0.6: ratio 1.5 with A > 0 is no longer clipped: -1.5, grad -1.5
    out, grad = _loss_and_grad("dapo", logp, mask, adv, old_logp=old, eps_high=0.6)
    assert out.loss.item() == pytest.approx((-1.5 + 1.5 + 0.8 - 0.5) / 4, abs=1e-12)
    assert grad[:, 0].tolist() == pytest.approx([-1.5 / 4, 1.5 / 4, 0.0, -0.5 / 4], abs=1e-12)
    assert out.metrics["clipfrac"].item() == pytest.approx(0.25, abs=1e-15)


def test_k3_kl_golden():
    # A = 0, one token, ref - logp = ln 2: k3 = e^{ln 2} - ln 2 - 1 = 1 - ln 2; d k3 / d logp = 1 - 2 = -1
    logp = _leaf([[-1.0, 0.0]])
    ref = torch.tensor([[-1.0 + math.log(2.0), 5.0]], dtype=F64)
    mask = torch.tensor([[1, 0]])
    out, grad = _loss_and_grad("grpo", logp, mask, torch.zeros(1, dtype=F64), ref_logp=ref, beta=0.1)
    assert out.loss.item() == pytest.approx(0.1 * (1.0 - math.log(2.0)), abs=1e-15)
    torch.testing.assert_close(grad, torch.tensor([[-0.1, 0.0]], dtype=F64), rtol=0, atol=1e-15)
    assert out.metrics["kl"].item() == pytest.approx(1.0 - math.log(2.0), abs=1e-15)


# The conflict example of test_conflict.py with advantages (+1, -1, -1, +1), G = 4, one prompt:
#   weights (pos 2, neg 0): row 0 [2 2 1 2 .], row 1 [0 0 1 0 .], row 2 [0 1 0 . .], row 3 [1 1 1 1 1]
#   n_conflict (max_run): 2, 2, 1, 1
# entropies (0.5, 0.2, 0.9, 0.3), threshold 0.7, gamma 0.1: row 2 filtered;
#   A' = (1 - 0.05, -1 - 0.02, 0, 1 - 0.03) = (0.95, -1.02, 0, 0.97)
# per completion token mean of -A' lambda (on-policy):
#   row 0: -0.95 * 7 / 4 = -1.6625 ; row 1: 1.02 * 1 / 4 = 0.255 ; row 2: 0 ; row 3: -0.97 * 5 / 5 = -0.97
# divided by n_conflict: -0.83125, 0.1275, 0, -0.97 -> sum -1.67375 over the (one) group
GTPO_IDS = torch.tensor([[5, 6, 7, 1, 0], [5, 6, 8, 1, 0], [5, 9, 1, 0, 0], [4, 6, 7, 1, 0]])
GTPO_MASK = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
GTPO_ADV = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=F64)
GTPO_ENT = torch.tensor([0.5, 0.2, 0.9, 0.3], dtype=F64)


def _gtpo_inputs():
    weights, n = conflict_weights(GTPO_IDS, GTPO_MASK, GTPO_ADV, 4)
    logp = torch.full((4, 5), -1.0, dtype=F64, requires_grad=True)
    return logp, weights, n


def test_gtpo_golden_reference_code_defaults():
    logp, weights, n = _gtpo_inputs()
    assert weights.tolist() == [[2, 2, 1, 2, 0], [0, 0, 1, 0, 0], [0, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    out, grad = _loss_and_grad(
        "gtpo", logp, GTPO_MASK, GTPO_ADV, seq_entropy=GTPO_ENT, token_weights=weights, n_conflict=n, group_size=4
    )
    assert out.loss.item() == pytest.approx(-1.67375, abs=1e-12)
    # d/dlogp[0, t] = -A' lambda_t / len / n * (groups / N ... = G / N = 1): t=0: -0.95 * 2 / 4 / 2
    assert grad[0].tolist() == pytest.approx([-0.2375, -0.2375, -0.11875, -0.2375, 0.0], abs=1e-12)
    assert grad[2].tolist() == [0.0] * 5  # filtered completion: no gradient
    assert grad[3].tolist() == pytest.approx([-0.97 / 5] * 5, abs=1e-12)
    m = out.metrics
    shaped, keep = entropy_control(GTPO_ADV, GTPO_ENT)
    assert 1.0 - keep.double().mean().item() == pytest.approx(0.25, abs=1e-15)
    assert shaped.mean().item() == pytest.approx((0.95 - 1.02 + 0.97) / 4, abs=1e-12)
    assert ((shaped - GTPO_ADV)[keep]).mean().item() == pytest.approx(-(0.05 + 0.02 + 0.03) / 3, abs=1e-12)
    # masked tokens 4 + 4 + 3 + 5 = 16, of which 3 + 3 + 2 + 0 = 8 have weight != 1
    assert m["gtpo/weighted_token_frac"].item() == pytest.approx(0.5, abs=1e-15)
    assert m["gtpo/n_conflict_mean"].item() == pytest.approx(1.5, abs=1e-15)
    assert m["clipfrac"].item() == 0.0 and m["approx_kl"].item() == 0.0


def test_gtpo_golden_options():
    logp, weights, n = _gtpo_inputs()
    kw = dict(seq_entropy=GTPO_ENT, token_weights=weights, n_conflict=n, group_size=4)
    # the paper's 1/G: mean over completions = -1.67375 / 4
    out = policy_loss("gtpo", logp, GTPO_MASK, GTPO_ADV, completion_reduction="mean", **kw)
    assert out.loss.item() == pytest.approx(-1.67375 / 4, abs=1e-12)
    # no division by n_conflict: -1.6625 + 0.255 + 0 - 0.97 = -2.3775
    out = policy_loss("gtpo", logp, GTPO_MASK, GTPO_ADV, divide_by_conflict_count=False, **kw)
    assert out.loss.item() == pytest.approx(-2.3775, abs=1e-12)
    # OnlyNeg: row 2 is negative and above the threshold -> still filtered, same loss
    out = policy_loss("gtpo", logp, GTPO_MASK, GTPO_ADV, filter_scope="negative", **kw)
    assert out.loss.item() == pytest.approx(-1.67375, abs=1e-12)
    # paper's <H>_ini rule with <H>_ini = 1.0 > 0.7: row 2 kept, A'_2 = -1 - 0.09 = -1.09,
    # weights (0 1 0): 1.09 * 1 / 3 / n=1 -> + 0.363333...
    out = policy_loss("gtpo", logp, GTPO_MASK, GTPO_ADV, initial_entropy=1.0, **kw)
    assert out.loss.item() == pytest.approx(-1.67375 + 1.09 / 3, abs=1e-12)
    assert bool(entropy_control(GTPO_ADV, GTPO_ENT, initial_entropy=1.0)[1].all())  # nothing filtered


# ---------------------------------------------------------------------------
# reductions between the losses
# ---------------------------------------------------------------------------


def _random_batch(seed, N=8, T=6, off_policy=True):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    logp = (-torch.rand(N, T, generator=g, dtype=F64) * 3).requires_grad_(True)
    old = (logp.detach() + 0.4 * torch.randn(N, T, generator=g, dtype=F64)) if off_policy else None
    ref = logp.detach() + 0.3 * torch.randn(N, T, generator=g, dtype=F64)
    rewards = torch.randint(0, 3, (N,), generator=g).to(F64)
    adv = group_advantages(rewards, 4)
    ent = torch.rand(N, generator=g, dtype=F64) * 1.4
    ids = torch.randint(0, 3, (N, T), generator=g)
    return logp, mask, adv, old, ref, ent, ids


@pytest.mark.parametrize("seed", range(3))
def test_gtpo_without_conflicts_and_filter_equals_grpo(seed):
    logp, mask, adv, old, _, ent, _ = _random_batch(seed)
    # distinct tokens everywhere -> no conflict: weights = mask, n_conflict = 1 for active rows
    ids = torch.arange(logp.numel()).view_as(logp)
    weights, n = conflict_weights(ids, mask, adv, 4)
    assert torch.equal(weights, mask.float())
    base, base_grad = _loss_and_grad("grpo", logp, mask, adv, old_logp=old, eps_high=0.3)
    common = dict(old_logp=old, eps_high=0.3, seq_entropy=ent, token_weights=weights, n_conflict=n,
                  entropy_threshold=None, gamma=0.0, group_size=4)
    out, grad = _loss_and_grad("gtpo", logp, mask, adv, completion_reduction="mean", **common)
    torch.testing.assert_close(out.loss, base.loss, rtol=0, atol=1e-14)
    torch.testing.assert_close(grad, base_grad, rtol=0, atol=1e-14)
    assert out.metrics["clipfrac"].item() == base.metrics["clipfrac"].item() > 0
    # "sum" over the G completions of a group = G x the mean
    out, _ = _loss_and_grad("gtpo", logp, mask, adv, completion_reduction="sum", **common)
    torch.testing.assert_close(out.loss, 4 * base.loss, rtol=0, atol=1e-13)


@pytest.mark.parametrize("seed", range(3))
def test_dapo_with_symmetric_clip_and_seq_mean_equals_grpo(seed):
    logp, mask, adv, old, ref, _, _ = _random_batch(seed)
    base, base_grad = _loss_and_grad("grpo", logp, mask, adv, old_logp=old, ref_logp=ref, beta=0.05)
    out, grad = _loss_and_grad(
        "dapo", logp, mask, adv, old_logp=old, ref_logp=ref, beta=0.05, eps_high=0.2,
        aggregation="seq_mean_token_mean",
    )
    torch.testing.assert_close(out.loss, base.loss, rtol=0, atol=0)
    torch.testing.assert_close(grad, base_grad, rtol=0, atol=0)
    assert base.metrics["clipfrac"].item() > 0  # the clip is exercised


# ---------------------------------------------------------------------------
# micro-batches, masked values, permutations, reference implementation
# ---------------------------------------------------------------------------


def _kwargs_for(loss_type, ent, weights, n):
    if loss_type == "gtpo":
        return dict(seq_entropy=ent, token_weights=weights, n_conflict=n, group_size=4)
    if loss_type == "dr_grpo":
        return dict(max_completion_length=6)
    if loss_type == "grpo":
        return dict(beta=0.04)
    return dict(eps_high=0.28, beta=0.01)


@pytest.mark.parametrize(
    "loss_type,completion_reduction",
    [("gtpo", "sum"), ("gtpo", "mean"), ("grpo", None), ("dr_grpo", None), ("dapo", None)],
)
def test_micro_batch_losses_sum_to_the_full_batch_loss(loss_type, completion_reduction):
    logp, mask, adv, old, ref, ent, ids = _random_batch(11, N=12)
    weights, n = conflict_weights(ids, mask, adv, 4)
    kw = _kwargs_for(loss_type, ent, weights, n)
    if loss_type == "gtpo":
        kw["completion_reduction"] = completion_reduction
    else:
        kw["ref_logp"] = ref
    full, full_grad = _loss_and_grad(loss_type, logp, mask, adv, old_logp=old, **kw)
    total_tokens = int(mask.sum())
    parts = []
    for rows in (slice(0, 3), slice(3, 4), slice(4, 12)):  # not aligned with the groups on purpose
        sub = {k: (v[rows] if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        parts.append(
            policy_loss(
                loss_type, logp[rows], mask[rows], adv[rows], old_logp=old[rows],
                num_sequences=12, **({} if loss_type == "gtpo" else {"num_tokens": total_tokens}), **sub,
            ).loss
        )
    total = sum(parts)
    (grad,) = torch.autograd.grad(total, [logp])
    torch.testing.assert_close(total, full.loss, rtol=0, atol=1e-14)
    torch.testing.assert_close(grad, full_grad, rtol=0, atol=1e-14)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_values_under_the_mask_do_not_matter(loss_type):
    logp, mask, adv, old, ref, ent, ids = _random_batch(5)
    weights, n = conflict_weights(ids, mask, adv, 4)
    kw = _kwargs_for(loss_type, ent, weights, n)
    if loss_type != "gtpo":
        kw["ref_logp"] = ref
    out, grad = _loss_and_grad(loss_type, logp, mask, adv, old_logp=old, **kw)

    nan = torch.tensor(float("nan"), dtype=F64)
    logp2 = torch.where(mask, logp.detach(), torch.full_like(logp, 123.0)).requires_grad_(True)
    kw2 = dict(kw)
    if "token_weights" in kw2:
        kw2["token_weights"] = torch.where(mask, weights, torch.tensor(float("nan")))
    if "ref_logp" in kw2:
        kw2["ref_logp"] = torch.where(mask, ref, nan)
    old2 = torch.where(mask, old, nan)
    out2, grad2 = _loss_and_grad(loss_type, logp2, mask, adv, old_logp=old2, **kw2)
    torch.testing.assert_close(out2.loss, out.loss, rtol=0, atol=0)
    torch.testing.assert_close(grad2, grad, rtol=0, atol=0)
    for key, value in out.metrics.items():
        torch.testing.assert_close(out2.metrics[key], value, rtol=0, atol=0)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_conflict_masks_only_ablation_weights_the_baselines_tokens(loss_type):
    # token_weights multiply the per-token terms of the baselines too ("GRPO + conflict masks only")
    logp, mask, adv, old, ref, ent, ids = _random_batch(7)
    weights, _ = conflict_weights(ids, mask, adv, 4)
    assert (weights == 0).any() and (weights > 1).any()
    out, grad = _loss_and_grad(loss_type, logp, mask, adv, old_logp=old, token_weights=weights)
    want = ref_policy_loss(loss_type, logp, mask, adv, old_logp=old, token_weights=weights)
    (want_grad,) = torch.autograd.grad(want, [logp])
    torch.testing.assert_close(out.loss, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=1e-12)
    assert bool((grad[(weights == 0) & mask] == 0).all())  # the skipped negative updates


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_permuting_completions_inside_groups_leaves_the_loss_unchanged(loss_type):
    logp, mask, adv, old, ref, ent, ids = _random_batch(3)
    weights, n = conflict_weights(ids, mask, adv, 4)
    kw = _kwargs_for(loss_type, ent, weights, n)
    if loss_type != "gtpo":
        kw["ref_logp"] = ref
    out = policy_loss(loss_type, logp, mask, adv, old_logp=old, **kw)
    perm = torch.tensor([2, 0, 3, 1, 5, 7, 4, 6])
    kw_p = {k: (v[perm] if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    # the conflict weights of the permuted batch are the permuted weights
    w_p, n_p = conflict_weights(ids[perm], mask[perm], adv[perm], 4)
    assert torch.equal(w_p, weights[perm]) and torch.equal(n_p, n[perm])
    out_p = policy_loss(loss_type, logp[perm], mask[perm], adv[perm], old_logp=old[perm], **kw_p)
    torch.testing.assert_close(out_p.loss, out.loss, rtol=0, atol=1e-14)


@given(
    seed=st.integers(0, 10_000),
    loss_type=st.sampled_from(LOSS_TYPES),
    off_policy=st.booleans(),
    eps=st.sampled_from([(0.2, None), (0.2, 0.28), (0.1, 0.5)]),
    gtpo_opts=st.fixed_dictionaries(
        {
            "entropy_threshold": st.sampled_from([None, 0.7, 1.05]),
            "gamma": st.sampled_from([0.0, 0.1]),
            "filter_scope": st.sampled_from(["all", "negative"]),
            "initial_entropy": st.sampled_from([None, 0.5, 2.0]),
            "divide_by_conflict_count": st.booleans(),
            "completion_reduction": st.sampled_from(["sum", "mean"]),
        }
    ),
    aggregation=st.sampled_from([None, "token_mean", "seq_mean_token_mean", "constant"]),
)
@settings(max_examples=60, deadline=None)
def test_matches_per_token_reference(seed, loss_type, off_policy, eps, gtpo_opts, aggregation):
    logp, mask, adv, old, ref, ent, ids = _random_batch(seed, off_policy=off_policy)
    kw = dict(old_logp=old, eps_low=eps[0], eps_high=eps[1])
    if loss_type == "gtpo":
        weights, n = conflict_weights(ids, mask, adv, 4)
        kw.update(gtpo_opts, seq_entropy=ent, token_weights=weights, n_conflict=n, group_size=4)
    else:
        kw.update(ref_logp=ref, beta=0.05, aggregation=aggregation, max_completion_length=7)
    out, grad = _loss_and_grad(loss_type, logp, mask, adv, **kw)
    want = ref_policy_loss(loss_type, logp, mask, adv, **kw)
    (want_grad,) = torch.autograd.grad(want, [logp])
    torch.testing.assert_close(out.loss, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("num_prompts", [1, 3])
def test_gtpo_defaults_match_the_released_code_loop(num_prompts):
    # the released code loops over the completions of ONE prompt and sums their losses; with
    # several prompts this project averages the per-prompt sums
    g = torch.Generator().manual_seed(num_prompts)
    G, T = 8, 10
    N = num_prompts * G
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    ids = torch.randint(0, 2, (N, T), generator=g)
    rewards = torch.randint(0, 3, (N,), generator=g).to(F64) * 10
    adv = group_advantages(rewards, G)
    ent = torch.rand(N, generator=g, dtype=F64)
    logp = (-torch.rand(N, T, generator=g, dtype=F64)).requires_grad_(True)
    weights, n = conflict_weights(ids, mask, adv, G)
    assert (weights == 4).any() and (weights == 0).any() and (n > 1).any()  # the example exercises lambda
    out, grad = _loss_and_grad(
        "gtpo", logp, mask, adv, seq_entropy=ent, token_weights=weights, n_conflict=n, group_size=G
    )
    want = sum(
        reference_code_gtpo_loss(logp[p * G:(p + 1) * G], mask[p * G:(p + 1) * G], weights[p * G:(p + 1) * G].to(F64),
                                 adv[p * G:(p + 1) * G], ent[p * G:(p + 1) * G], n[p * G:(p + 1) * G])
        for p in range(num_prompts)
    ) / num_prompts
    (want_grad,) = torch.autograd.grad(want, [logp])
    torch.testing.assert_close(out.loss, want, rtol=0, atol=1e-13)
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=1e-13)


def test_output_type_and_detached_metrics():
    logp, mask, adv, old, ref, ent, ids = _random_batch(1)
    weights, n = conflict_weights(ids, mask, adv, 4)
    for loss_type in LOSS_TYPES:
        kw = _kwargs_for(loss_type, ent, weights, n)
        if loss_type != "gtpo":
            kw["ref_logp"] = ref
        out = policy_loss(loss_type, logp, mask, adv, old_logp=old, **kw)
        assert isinstance(out, LossOutput)
        assert out.loss.dim() == 0 and out.loss.requires_grad
        assert {"clipfrac", "approx_kl", "ratio/mean"} <= set(out.metrics)
        for value in out.metrics.values():
            assert value.dim() == 0 and not value.requires_grad
        assert ("kl" in out.metrics) == (kw.get("beta", 0.0) > 0)
        if loss_type == "gtpo":
            assert {"gtpo/weighted_token_frac", "gtpo/n_conflict_mean"} <= set(out.metrics)


# ---------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------


def test_errors_name_the_argument():
    logp, mask, adv, old, ref, ent, ids = _random_batch(0)
    weights, n = conflict_weights(ids, mask, adv, 4)
    cases = [
        ("max_completion_length", dict(loss_type="dr_grpo")),
        ("ref_logp", dict(beta=0.1)),
        ("old_logp", dict(old_logp=old[:, :3])),
        ("advantages", dict(advantages=adv[:5])),
        ("completion_mask", dict(completion_mask=mask[:, :2])),
        ("token_weights", dict(token_weights=weights[:, :2])),
        ("group_size", dict(loss_type="gtpo")),
        ("group_size", dict(loss_type="gtpo", group_size=3)),
        ("n_conflict", dict(loss_type="gtpo", token_weights=weights, group_size=4)),
        ("token_weights", dict(loss_type="gtpo", token_weights=weights[:, :2], n_conflict=n, group_size=4)),
        ("n_conflict", dict(loss_type="gtpo", token_weights=weights, n_conflict=n[:3], group_size=4)),
    ]
    for name, override in cases:
        args = dict(loss_type="grpo", logp=logp, completion_mask=mask, advantages=adv)
        args.update(override)
        loss_type = args.pop("loss_type")
        lp, cm, ad = args.pop("logp"), args.pop("completion_mask"), args.pop("advantages")
        with pytest.raises(ValueError, match=name):
            _loss_only(loss_type, lp, cm, ad, **args)
    # gtpo without conflict weights needs nothing but its group size
    _loss_only("gtpo", logp, mask, adv, group_size=4)


# ---------------------------------------------------------------------------
# the registry: one signature for every loss
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("off_policy", [False, True])
def test_registry_is_the_keyword_loss_with_the_configs_values(loss_type, off_policy):
    """``POLICY_LOSSES[t](logp, old_logp, advantages, mask, extras, config)`` is the keyword function of ``t``
    with the config's hyperparameters and the extras' tensors: the same loss, gradient and metrics, bitwise."""
    logp, mask, adv, old, ref, ent, ids = _random_batch(21, off_policy=off_policy)
    weights, n = conflict_weights(ids, mask, adv, 4)
    is_w = torch.rand(mask.shape, dtype=F64, generator=torch.Generator().manual_seed(3)) + 0.5
    old_logp = old if off_policy else None
    if loss_type == "gtpo":
        cfg = GTPOConfig(loss_type="gtpo", group_size=4, epsilon=0.1, epsilon_high=0.3, completion_reduction="mean",
                         divide_by_conflict_count=True)
        want = gtpo_loss(logp, mask, adv, token_weights=weights, n_conflict=n, old_logp=old_logp, eps_low=0.1,
                         eps_high=0.3, divide_by_conflict_count=True, completion_reduction="mean", group_size=4,
                         num_sequences=16, is_weights=is_w)
    else:
        cfg = GTPOConfig(loss_type=loss_type, group_size=4, epsilon=0.1, epsilon_high=0.3, beta=0.04,
                         max_completion_length=7)
        want = KEYWORD_LOSSES[loss_type](logp, mask, adv, old_logp=old_logp, ref_logp=ref, beta=0.04, eps_low=0.1,
                                         eps_high=0.3, max_completion_length=7, num_sequences=16, num_tokens=40,
                                         token_weights=weights, is_weights=is_w)
    extras = LossExtras(token_weights=weights, n_conflict=n, ref_logp=ref, is_weights=is_w, num_sequences=16,
                        num_tokens=40)
    out = POLICY_LOSSES[loss_type](logp, old_logp, adv, mask, extras, cfg)
    (grad,) = torch.autograd.grad(out.loss, [logp])
    (want_grad,) = torch.autograd.grad(want.loss, [logp])
    torch.testing.assert_close(out.loss, want.loss, rtol=0, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=0)
    assert out.metrics.keys() == want.metrics.keys()
    for key in want.metrics:
        torch.testing.assert_close(out.metrics[key], want.metrics[key], rtol=0, atol=0)


def test_registry_gtpo_without_counts_does_not_divide():
    # conflict masks off but other per-token weights (TRL's top-entropy mask): no counts, no division
    logp, mask, adv, old, ref, ent, ids = _random_batch(4)
    w = torch.rand(mask.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    cfg = GTPOConfig(loss_type="gtpo", group_size=4)
    out = POLICY_LOSSES["gtpo"](logp, None, adv, mask, LossExtras(token_weights=w), cfg)
    want = gtpo_loss(logp, mask, adv, token_weights=w, divide_by_conflict_count=False, group_size=4)
    torch.testing.assert_close(out.loss, want.loss, rtol=0, atol=0)


def test_registry_holds_every_loss_type_and_a_bad_one_is_a_config_error():
    assert set(POLICY_LOSSES) == set(LOSS_TYPES)
    with pytest.raises(ValueError, match="loss_type"):
        GTPOConfig(loss_type="ppo")
