"""Tests of gtpo.maths.conflict: prefix / suffix conflict runs, weights lambda, conflict counts."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gtpo.maths.conflict import conflict_runs, conflict_weights
from reference_impl import bincount_conflict_runs, ref_conflict, ref_conflict_walk

# One group, G = 4, T = 5. Token 0 is a real token of row 3 (its EOS, say) and the pad of the
# others: padding comes from the mask only.
#   row 0 (+): 5 6 7 1 | .        row 1 (-): 5 6 8 1 | .
#   row 2 (-): 5 9 1 | . .        row 3 (+): 4 6 7 1 0
IDS = torch.tensor([[5, 6, 7, 1, 0], [5, 6, 8, 1, 0], [5, 9, 1, 0, 0], [4, 6, 7, 1, 0]])
MASK = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
ADV = torch.tensor([1.0, -1.0, -1.0, 0.5])
# Prefix runs (a negative partner for + rows, a positive one for - rows, same token, same position):
#   row 0: 5 (row 1) yes, 6 (row 1) yes, 7 vs {8, 1} no           -> prefix run 2
#   row 1: 5 (row 0) yes, 6 (rows 0, 3) yes, 8 vs {7, 7} no        -> 2
#   row 2: 5 (row 0) yes, 9 vs {6, 6} no                          -> 1
#   row 3: 4 vs {5, 5} no                                         -> 0
# Suffix runs, right aligned on each row's last masked token:
#   row 0: last 1 (rows 1, 2 end with 1) yes, then 7 vs {8, 9} no -> suffix run 1
#   row 1: last 1 (row 0) yes, then 8 vs {7 (row 0), 1 (row 3)} no -> 1
#   row 2: last 1 (row 0) yes, then 9 vs {7, 1} no                -> 1
#   row 3: last 0 vs {1, 1} no                                    -> 0
PREFIX = [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]]
SUFFIX = [[0, 0, 0, 1, 0], [0, 0, 0, 1, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0]]
# Weights (pos 2, neg 0): run tokens of + rows 2, of - rows 0, other masked tokens 1, padding 0.
WEIGHTS = [[2, 2, 1, 2, 0], [0, 0, 1, 0, 0], [0, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
# max_run: max(prefix, suffix) clamped >= 1: (2, 2, 1, max(0, 0) -> 1)
# union:  tokens in either run: (3, 3, 2, 0 -> 1)


def test_golden_runs_weights_and_counts():
    prefix, suffix = conflict_runs(IDS, MASK, ADV, 4)
    assert prefix.dtype == torch.bool and suffix.dtype == torch.bool
    assert prefix.int().tolist() == PREFIX
    assert suffix.int().tolist() == SUFFIX
    weights, n = conflict_weights(IDS, MASK, ADV, 4)
    assert weights.dtype == torch.float32 and n.dtype == torch.int64
    assert weights.tolist() == WEIGHTS
    assert n.tolist() == [2, 2, 1, 1]
    weights_u, n_u = conflict_weights(IDS, MASK, ADV, 4, combine="union", count="union")
    assert weights_u.tolist() == WEIGHTS  # no token is in both runs here
    assert n_u.tolist() == [3, 3, 2, 1]


def test_product_versus_union_when_a_token_is_in_both_runs():
    # G = 2: (+) 3 1 and (-) 3 1: every position conflicts from both ends -> prefix 2, suffix 2
    ids = torch.tensor([[3, 1], [3, 1]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([0.5, -0.5])
    w, n = conflict_weights(ids, mask, adv, 2)
    assert w.tolist() == [[4.0, 4.0], [0.0, 0.0]]  # reference code: 2 * 2 = 4
    assert n.tolist() == [2, 2]
    w, n = conflict_weights(ids, mask, adv, 2, combine="union", count="union")
    assert w.tolist() == [[2.0, 2.0], [0.0, 0.0]]
    assert n.tolist() == [2, 2]
    w, _ = conflict_weights(ids, mask, adv, 2, pos_weight=1.5, neg_weight=0.5)
    assert w.tolist() == [[2.25, 2.25], [0.25, 0.25]]


def test_eos_equal_to_pad_is_read_from_the_mask():
    # EOS = PAD = 2 (SmolLM2, Qwen base). (+) 3 EOS | pad pad ; (-) 4 3 EOS | pad
    # prefix: 3 vs 4 no -> 0 for both. suffix: EOS = EOS yes, 3 = 3 yes, then (+) has no 3rd
    # token -> (+) suffix 2 (whole completion); (-) 4 vs nothing (partner too short) -> 2
    ids = torch.tensor([[3, 2, 2, 2], [4, 3, 2, 2]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    w, n = conflict_weights(ids, mask, torch.tensor([1.0, -1.0]), 2)
    assert w.tolist() == [[2.0, 2.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    assert n.tolist() == [2, 2]


def test_inactive_and_one_sided_groups():
    # group 0: all advantages 0; group 1: all positive (no partner); group 2: all negative
    ids = torch.tensor([[1, 2, 3], [1, 2, 3]] * 3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]] * 3)
    adv = torch.tensor([0.0, 0.0, 1.0, 2.0, -1.0, -3.0])
    w, n = conflict_weights(ids, mask, adv, 2)
    assert w.tolist() == mask.float().tolist()  # 1 on every masked token
    assert n.tolist() == [0, 0, 1, 1, 1, 1]  # inactive 0, active at least 1
    prefix, suffix = conflict_runs(ids, mask, adv, 2)
    assert not prefix.any() and not suffix.any()


def test_inactive_completion_in_an_active_group_is_no_partner():
    # (+) 1 2, (0) 1 2, (-) 7 8: the zero-advantage row shares tokens with (+) but is no partner
    ids = torch.tensor([[1, 2], [1, 2], [7, 8]])
    mask = torch.ones(3, 2, dtype=torch.bool)
    w, n = conflict_weights(ids, mask, torch.tensor([1.0, 0.0, -1.0]), 3)
    assert w.tolist() == [[1.0, 1.0]] * 3
    assert n.tolist() == [1, 0, 1]


def test_length_one_and_length_zero_completions():
    # (+) EOS alone, (-) EOS alone: both runs cover the single token -> product 4 / 0
    # (+) empty completion (length 0): weights all 0, still active -> n = 1
    ids = torch.tensor([[9, 0], [9, 0], [0, 0], [5, 0]])
    mask = torch.tensor([[1, 0], [1, 0], [0, 0], [1, 0]])
    w, n = conflict_weights(ids, mask, torch.tensor([1.0, -1.0, 1.0, -1.0]), 2)
    assert w.tolist() == [[4.0, 0.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0]]
    assert n.tolist() == [1, 1, 1, 1]


def test_any_int64_token_ids_no_vocabulary():
    # the same group with ids remapped far apart (incl. negative and near the int64 limits)
    remap = {0: -(2**63), 1: 2**62 + 1, 4: 10**18, 5: -1, 6: 2**63 - 1, 7: 12345678901, 8: 3, 9: 0}
    big = IDS.clone().apply_(lambda v: remap[v])
    w, n = conflict_weights(big, MASK, ADV, 4)
    assert w.tolist() == WEIGHTS
    assert n.tolist() == [2, 2, 1, 1]
    w32, _ = conflict_weights(IDS.to(torch.int32), MASK.bool(), ADV.double(), 4)
    assert w32.tolist() == WEIGHTS


def test_only_the_sign_of_the_advantage_matters():
    w, n = conflict_weights(IDS, MASK, ADV, 4)
    w2, n2 = conflict_weights(IDS, MASK, ADV * torch.tensor([100.0, 0.01, 3.0, 1e-6]), 4)
    assert torch.equal(w, w2) and torch.equal(n, n2)
    # flipping every sign keeps the runs (conflict is symmetric) and swaps the weights' roles
    p, s = conflict_runs(IDS, MASK, ADV, 4)
    p2, s2 = conflict_runs(IDS, MASK, -ADV, 4)
    assert torch.equal(p, p2) and torch.equal(s, s2)


# ---------------------------------------------------------------------------
# random groups against the slow reference
# ---------------------------------------------------------------------------


def _random_batch(rng: random.Random, num_groups: int, group_size: int, T: int, vocab: int):
    ids, mask, adv = [], [], []
    for _ in range(num_groups):
        kind = rng.choice(["mixed", "mixed", "mixed", "all_pos", "all_neg", "zero"])
        shared = [rng.randrange(vocab) for _ in range(T)]  # a common template makes long runs likely
        for _ in range(group_size):
            length = rng.choice([0, 1, 1, T, rng.randint(1, T), rng.randint(1, T)])
            row = [s if rng.random() < 0.7 else rng.randrange(vocab) for s in shared]
            # tail shared from the end too (right-aligned template)
            for k in range(min(length, 3)):
                if rng.random() < 0.7:
                    row[length - 1 - k] = shared[T - 1 - k]
            row = row[:length] + [rng.randrange(vocab) for _ in range(T - length)]  # garbage padding
            ids.append(row)
            mask.append([1] * length + [0] * (T - length))
            if kind == "mixed":
                adv.append(rng.choice([-1.5, -0.5, 0.0, 0.5, 2.0]))
            elif kind == "all_pos":
                adv.append(rng.choice([0.5, 1.0]))
            elif kind == "all_neg":
                adv.append(rng.choice([-0.5, -1.0]))
            else:
                adv.append(0.0)
    return ids, mask, adv


@pytest.mark.parametrize(
    "combine,count,pos_weight,neg_weight",
    [
        ("product", "max_run", 2.0, 0.0),
        ("union", "union", 2.0, 0.0),
        ("product", "union", 1.5, 0.25),
        ("union", "max_run", 3.0, -1.0),
    ],
)
def test_matches_slow_reference_on_random_groups(combine, count, pos_weight, neg_weight):
    rng = random.Random(f"{combine}-{count}-{pos_weight}")
    checked = 0
    # (group_size, T, vocab, number of groups): 1000 groups per option set
    shapes = [(2, 1, 2, 300), (2, 6, 2, 300), (3, 9, 3, 200), (4, 12, 2, 120), (8, 7, 4, 80)]
    for group_size, T, vocab, num_groups in shapes:
        ids, mask, adv = _random_batch(rng, num_groups, group_size, T, vocab)
        w, n = conflict_weights(
            torch.tensor(ids), torch.tensor(mask), torch.tensor(adv), group_size,
            pos_weight=pos_weight, neg_weight=neg_weight, combine=combine, count=count,
        )
        prefix, suffix = conflict_runs(torch.tensor(ids), torch.tensor(mask), torch.tensor(adv), group_size)
        for reference in (ref_conflict, ref_conflict_walk):
            w_ref, n_ref, prefix_ref, suffix_ref = reference(
                ids, mask, adv, group_size, pos_weight, neg_weight, combine, count
            )
            assert w.tolist() == w_ref
            assert n.tolist() == n_ref
            assert prefix.tolist() == prefix_ref
            assert suffix.tolist() == suffix_ref
        checked += num_groups
    assert checked == 1000


@pytest.mark.parametrize("first_block", [1, 2, 5])
def test_block_scan_boundaries(monkeypatch, first_block):
    # the runs are scanned in growing blocks of positions (32, 64, ... by default); tiny first
    # blocks put block boundaries inside the runs and make the scan continue over many blocks
    import gtpo.maths.conflict

    monkeypatch.setattr(gtpo.maths.conflict, "_FIRST_BLOCK", first_block)
    rng = random.Random(first_block)
    for group_size, T, vocab in [(2, 17, 1), (2, 17, 2), (4, 23, 2), (3, 9, 1)]:
        ids, mask, adv = _random_batch(rng, 80, group_size, T, vocab)
        for combine, count in [("product", "max_run"), ("union", "union")]:
            w, n = conflict_weights(torch.tensor(ids), torch.tensor(mask), torch.tensor(adv), group_size,
                                    combine=combine, count=count)
            w_ref, n_ref, _, _ = ref_conflict_walk(ids, mask, adv, group_size, combine=combine, count=count)
            assert w.tolist() == w_ref
            assert n.tolist() == n_ref


def test_matches_the_reference_codes_bincount_algorithm():
    # the released code's method (vocabulary-sized bincounts) gives the same runs on a small vocab
    rng = random.Random(7)
    for group_size, T, vocab in [(2, 5, 2), (4, 8, 3), (8, 6, 2)]:
        ids, mask, adv = _random_batch(rng, 60, group_size, T, vocab)
        ids_t, mask_t, adv_t = torch.tensor(ids), torch.tensor(mask), torch.tensor(adv)
        prefix, suffix = conflict_runs(ids_t, mask_t, adv_t, group_size)
        prefix_b, suffix_b = bincount_conflict_runs(ids_t, mask_t, adv_t, group_size, vocab)
        assert torch.equal(prefix, prefix_b)
        assert torch.equal(suffix, suffix_b)


@st.composite
def _groups(draw):
    group_size = draw(st.integers(2, 5))
    num_groups = draw(st.integers(1, 3))
    T = draw(st.integers(1, 6))
    N = group_size * num_groups
    lengths = draw(st.lists(st.integers(0, T), min_size=N, max_size=N))
    ids = draw(st.lists(st.lists(st.integers(0, 2), min_size=T, max_size=T), min_size=N, max_size=N))
    adv = draw(st.lists(st.sampled_from([-1.0, 0.0, 1.0]), min_size=N, max_size=N))
    mask = [[1] * L + [0] * (T - L) for L in lengths]
    return torch.tensor(ids), torch.tensor(mask), torch.tensor(adv), group_size


@given(_groups(), st.data())
@settings(max_examples=50, deadline=None)
def test_values_under_the_mask_do_not_matter(groups, data):
    ids, mask, adv, group_size = groups
    values = data.draw(st.lists(st.integers(-5, 5), min_size=ids.numel(), max_size=ids.numel()))
    garbage = torch.tensor(values).view_as(ids)
    ids2 = torch.where(mask.bool(), ids, garbage)
    for combine, count in [("product", "max_run"), ("union", "union")]:
        w, n = conflict_weights(ids, mask, adv, group_size, combine=combine, count=count)
        w2, n2 = conflict_weights(ids2, mask, adv, group_size, combine=combine, count=count)
        assert torch.equal(w, w2) and torch.equal(n, n2)


@given(_groups(), st.data())
@settings(max_examples=50, deadline=None)
def test_permuting_completions_inside_a_group_permutes_the_output(groups, data):
    ids, mask, adv, group_size = groups
    perm = []
    for start in range(0, ids.shape[0], group_size):
        perm.extend(data.draw(st.permutations(list(range(start, start + group_size)))))
    perm = torch.tensor(perm)
    w, n = conflict_weights(ids, mask, adv, group_size)
    w2, n2 = conflict_weights(ids[perm], mask[perm], adv[perm], group_size)
    assert torch.equal(w2, w[perm]) and torch.equal(n2, n[perm])


# ---------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------


def test_errors_name_the_argument():
    # a mask with holes is a multi-turn completion (tests/test_conflict_holes.py), no longer an error
    with pytest.raises(ValueError, match="completion_mask.*shape"):
        conflict_weights(IDS, MASK[:, :4], ADV, 4)
    with pytest.raises(ValueError, match="advantages.*shape"):
        conflict_weights(IDS, MASK, ADV[:3], 4)
    with pytest.raises(ValueError, match="completion_ids.*integer"):
        conflict_weights(IDS.float(), MASK, ADV, 4)
    with pytest.raises(ValueError, match="completion_ids.*2-D"):
        conflict_weights(IDS[0], MASK[0], ADV[:1], 4)
    with pytest.raises(ValueError, match="group_size.*divisible"):
        conflict_weights(IDS, MASK, ADV, 3)
    with pytest.raises(ValueError, match="group_size.*>= 2"):
        conflict_runs(IDS, MASK, ADV, 1)
    with pytest.raises(ValueError, match="combine"):
        conflict_weights(IDS, MASK, ADV, 4, combine="sum")
    with pytest.raises(ValueError, match="count"):
        conflict_weights(IDS, MASK, ADV, 4, count="prefix")
    with pytest.raises(ValueError, match="pos_weight"):
        conflict_weights(IDS, MASK, ADV, 4, pos_weight="2")
