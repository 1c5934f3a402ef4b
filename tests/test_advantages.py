"""Tests of gtpo.maths.advantages: group advantages and GTPO's entropy filter / shaping."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gtpo.maths.advantages import entropy_keep_mask, group_advantages, shape_advantages
from reference_impl import ref_group_advantages, ref_shape_advantages

# two groups of G = 4: rewards (1, 0, 0, 1) and (2, 2, 2, 2)
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0], dtype=torch.float64)


def test_group_advantages_golden_none():
    # group 1 mean 0.5 -> (0.5, -0.5, -0.5, 0.5); group 2 has zero variance -> 0
    assert group_advantages(REWARDS, 4).tolist() == [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]


def test_group_advantages_golden_group_std():
    # unbiased std of (1, 0, 0, 1): sqrt(4 * 0.25 / 3) = sqrt(1/3)
    std = math.sqrt(1.0 / 3.0)
    expected = [0.5 / (std + 1e-4), -0.5 / (std + 1e-4), -0.5 / (std + 1e-4), 0.5 / (std + 1e-4), 0, 0, 0, 0]
    assert group_advantages(REWARDS, 4, scale="group").tolist() == pytest.approx(expected, abs=1e-12)


def test_group_advantages_golden_batch_std():
    # batch mean 10/8 = 1.25; squared deviations 0.0625 + 1.5625 + 1.5625 + 0.0625 + 4 * 0.5625
    # = 5.5; unbiased variance 5.5 / 7; the zero-variance group stays 0
    std = math.sqrt(5.5 / 7.0)
    expected = [0.5 / (std + 1e-4), -0.5 / (std + 1e-4), -0.5 / (std + 1e-4), 0.5 / (std + 1e-4), 0, 0, 0, 0]
    assert group_advantages(REWARDS, 4, scale="batch").tolist() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("scale", ["none", "group", "batch"])
@pytest.mark.parametrize("eps", [1e-4, 0.0])
def test_zero_variance_groups_are_exactly_zero_never_nan(scale, eps):
    # three times 0.1 has a float mean 0.10000000000000002 != 0.1: the advantage must still be 0.0
    rewards = torch.tensor([0.1, 0.1, 0.1, 7.0, 7.0, 7.0], dtype=torch.float64)
    out = group_advantages(rewards, 3, scale=scale, eps=eps)
    assert out.tolist() == [0.0] * 6
    rewards32 = torch.tensor([0.1, 0.1, 0.1, 0.3, 0.3, 0.3], dtype=torch.float32)
    assert group_advantages(rewards32, 3, scale=scale, eps=eps).tolist() == [0.0] * 6


def test_integer_rewards_become_float():
    out = group_advantages(torch.tensor([0, 10, 20, 10]), 2)
    assert out.dtype == torch.float32
    assert out.tolist() == [-5.0, 5.0, 5.0, -5.0]


@given(
    rewards=st.lists(st.sampled_from([0.0, 0.5, 1.0, 10.0, 20.0, -3.25]), min_size=2, max_size=24),
    group_size=st.integers(2, 6),
    scale=st.sampled_from(["none", "group", "batch"]),
    data=st.data(),
)
@settings(max_examples=60, deadline=None)
def test_group_advantages_match_reference_and_permute(rewards, group_size, scale, data):
    n = len(rewards) - len(rewards) % group_size
    if n == 0:
        return
    rewards = rewards[:n]
    r = torch.tensor(rewards, dtype=torch.float64)
    out = group_advantages(r, group_size, scale=scale)
    assert out.tolist() == pytest.approx(ref_group_advantages(rewards, group_size, scale), abs=1e-9)
    assert torch.isfinite(out).all()
    # permuting completions inside each group permutes the advantages the same way
    perm = []
    for start in range(0, n, group_size):
        idx = list(range(start, start + group_size))
        perm.extend(data.draw(st.permutations(idx)))
    perm = torch.tensor(perm)
    torch.testing.assert_close(group_advantages(r[perm], group_size, scale=scale), out[perm], rtol=0, atol=1e-12)


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="group_size.*divisible"):
        group_advantages(torch.zeros(7), 2)
    with pytest.raises(ValueError, match="group_size.*>= 2"):
        group_advantages(torch.zeros(4), 1)
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(4), 2.0)
    with pytest.raises(ValueError, match="rewards.*1-D"):
        group_advantages(torch.zeros(2, 4), 2)
    with pytest.raises(ValueError, match="scale.*'none'"):
        group_advantages(torch.zeros(4), 2, scale="std")
    with pytest.raises(ValueError, match="eps"):
        group_advantages(torch.zeros(4), 2, eps=-1.0)
    with pytest.raises(ValueError, match="rewards.*Tensor"):
        group_advantages([1.0, 0.0], 2)


# ---------------------------------------------------------------------------
# shape_advantages
# ---------------------------------------------------------------------------

ADV = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
ENT = torch.tensor([0.9, 0.8, 0.7, 0.2], dtype=torch.float64)


def test_shape_advantages_golden():
    # scope all, threshold 0.7 (strict): rows 0 (0.9) and 1 (0.8) dropped; row 2 (0.7) kept
    # kept: 0.5 - 0.1 * 0.7 = 0.43, -0.5 - 0.1 * 0.2 = -0.52
    assert shape_advantages(ADV, ENT).tolist() == pytest.approx([0.0, 0.0, 0.43, -0.52], abs=1e-15)
    # OnlyNeg: only row 1 (negative, 0.8 > 0.7) dropped; row 0 kept: 1 - 0.09 = 0.91
    out = shape_advantages(ADV, ENT, scope="negative")
    assert out.tolist() == pytest.approx([0.91, 0.0, 0.43, -0.52], abs=1e-15)
    # paper's rule: <H>_ini = 1.0 > 0.7 -> nothing dropped, every completion shifted
    out = shape_advantages(ADV, ENT, initial_entropy=1.0)
    assert out.tolist() == pytest.approx([0.91, -1.08, 0.43, -0.52], abs=1e-15)
    # <H>_ini = 0.5 <= 0.7 -> the filter applies as in the code
    assert shape_advantages(ADV, ENT, initial_entropy=0.5).tolist() == shape_advantages(ADV, ENT).tolist()
    assert shape_advantages(ADV, ENT, initial_entropy=torch.tensor(1.0)).tolist() == out.tolist()
    # no filter (gamma without the filter ablation)
    assert shape_advantages(ADV, ENT, threshold=None).tolist() == pytest.approx([0.91, -1.08, 0.43, -0.52], abs=1e-15)
    # gamma 0 and no filter: identity
    assert shape_advantages(ADV, ENT, threshold=None, gamma=0.0).tolist() == ADV.tolist()
    # threshold 2.0 keeps everything here, gamma 0.01
    out = shape_advantages(ADV, ENT, threshold=2.0, gamma=0.01)
    assert out.tolist() == pytest.approx([0.991, -1.008, 0.493, -0.502], abs=1e-15)


def test_zero_advantage_group_still_gets_the_entropy_shift():
    # gtpo-method.md §5 side effect: A = 0 (all-equal rewards) -> A' = -gamma <H>
    out = shape_advantages(torch.zeros(2, dtype=torch.float64), torch.tensor([0.5, 0.3], dtype=torch.float64))
    assert out.tolist() == pytest.approx([-0.05, -0.03], abs=1e-15)


def test_keep_mask_golden():
    assert entropy_keep_mask(ADV, ENT).tolist() == [False, False, True, True]
    assert entropy_keep_mask(ADV, ENT, scope="negative").tolist() == [True, False, True, True]
    assert entropy_keep_mask(ADV, ENT, threshold=None).tolist() == [True] * 4


def test_shape_advantages_does_not_backpropagate_into_entropy():
    ent = ENT.clone().requires_grad_(True)
    out = shape_advantages(ADV, ent)
    assert not out.requires_grad


@given(
    adv=st.lists(st.sampled_from([-1.0, -0.25, 0.0, 0.5, 2.0]), min_size=1, max_size=12),
    data=st.data(),
    threshold=st.sampled_from([None, 0.3, 0.7, 1.05]),
    gamma=st.sampled_from([0.0, 0.1, 1e-6]),
    scope=st.sampled_from(["all", "negative"]),
    initial_entropy=st.sampled_from([None, 0.1, 0.7, 2.0]),
)
@settings(max_examples=60, deadline=None)
def test_shape_advantages_matches_reference(adv, data, threshold, gamma, scope, initial_entropy):
    ent = data.draw(st.lists(st.sampled_from([0.0, 0.3, 0.69, 0.7, 0.71, 1.5]), min_size=len(adv), max_size=len(adv)))
    out = shape_advantages(
        torch.tensor(adv, dtype=torch.float64), torch.tensor(ent, dtype=torch.float64),
        threshold=threshold, gamma=gamma, scope=scope, initial_entropy=initial_entropy,
    )
    want = ref_shape_advantages(adv, ent, threshold, gamma, scope, initial_entropy)
    assert out.tolist() == pytest.approx(want, abs=1e-15)


def test_shape_advantages_errors():
    with pytest.raises(ValueError, match="seq_entropy"):
        shape_advantages(ADV, ENT[:3])
    with pytest.raises(ValueError, match="scope"):
        shape_advantages(ADV, ENT, scope="positive")
    with pytest.raises(ValueError, match="threshold"):
        shape_advantages(ADV, ENT, threshold="0.7")
    with pytest.raises(ValueError, match="initial_entropy"):
        shape_advantages(ADV, ENT, initial_entropy=torch.ones(2))
    with pytest.raises(ValueError, match="gamma"):
        shape_advantages(ADV, ENT, gamma=None)
