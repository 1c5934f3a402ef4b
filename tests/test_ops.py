"""Tests of gtpo.maths.ops: masked reductions, aggregation, chunked log-probs + entropy."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from gtpo.maths.ops import aggregate, masked_mean, masked_sum, token_logprobs_and_entropy
from reference_impl import naive_token_logprobs_and_entropy

# ---------------------------------------------------------------------------
# masked reductions
# ---------------------------------------------------------------------------


def test_masked_sum_and_mean_golden():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # masked entries: 1 + 2 + 4 = 7 over 3 entries
    assert masked_sum(values, mask).item() == 7.0
    assert masked_mean(values, mask).item() == pytest.approx(7.0 / 3.0, abs=1e-7)
    # per row: (1 + 2) / 2 = 1.5 and 4 / 1 = 4
    assert masked_sum(values, mask, dim=1).tolist() == [3.0, 4.0]
    assert masked_mean(values, mask, dim=1).tolist() == [1.5, 4.0]


def test_masked_mean_of_empty_mask_is_zero_not_nan():
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[0, 0], [1, 0]])
    assert masked_mean(values, mask, dim=1).tolist() == [0.0, 3.0]
    assert masked_mean(values, torch.zeros_like(mask)).item() == 0.0


def test_masked_sum_ignores_nan_under_the_mask_in_value_and_gradient():
    values = torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]], requires_grad=True)
    mask = torch.tensor([[True, False], [False, True]])
    out = masked_sum(values, mask)
    out.backward()
    assert out.item() == 3.0
    assert values.grad.tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_masked_reductions_reject_mismatched_mask():
    with pytest.raises(ValueError, match="mask"):
        masked_sum(torch.zeros(2, 3), torch.ones(2, 2))


# ---------------------------------------------------------------------------
# aggregate
# ---------------------------------------------------------------------------

# loss rows: [1, 2, 3, x] with 3 tokens, [4, x, x, x] with 1 token, [5, 6, x, x] with 2 tokens
LOSS = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 99.0, 99.0, 99.0], [5.0, 6.0, 99.0, 99.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]])


def test_aggregate_golden_values():
    # token_mean: (1+2+3+4+5+6) / 6 tokens = 21 / 6 = 3.5
    assert aggregate(LOSS, MASK, "token_mean").item() == pytest.approx(3.5, abs=1e-6)
    # seq_mean_token_mean: (6/3 + 4/1 + 11/2) / 3 = (2 + 4 + 5.5) / 3 = 11.5 / 3
    assert aggregate(LOSS, MASK, "seq_mean_token_mean").item() == pytest.approx(11.5 / 3, abs=1e-6)
    # constant: 21 / (max_completion_length 4 * 3 sequences) = 1.75
    assert aggregate(LOSS, MASK, "constant", max_completion_length=4).item() == pytest.approx(1.75, abs=1e-6)
    # global normalisers: token_mean 21 / 10 tokens, seq-mean 11.5 / 5 sequences, constant 21 / (4 * 5)
    assert aggregate(LOSS, MASK, "token_mean", num_tokens=10).item() == pytest.approx(2.1, abs=1e-6)
    assert aggregate(LOSS, MASK, "seq_mean_token_mean", num_sequences=5).item() == pytest.approx(2.3, abs=1e-6)
    assert aggregate(LOSS, MASK, "constant", max_completion_length=4, num_sequences=5).item() == pytest.approx(
        1.05, abs=1e-6
    )


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "constant"])
def test_aggregate_micro_batches_sum_to_full_batch(mode):
    g = torch.Generator().manual_seed(0)
    N, T = 12, 7
    loss = torch.randn(N, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    kwargs = {"max_completion_length": T}
    full = aggregate(loss, mask, mode, **kwargs)
    total_tokens = int(mask.sum())
    parts = [
        aggregate(loss[s], mask[s], mode, num_sequences=N, num_tokens=total_tokens, **kwargs)
        for s in (slice(0, 5), slice(5, 6), slice(6, 12))
    ]
    assert torch.allclose(sum(parts), full, rtol=0, atol=1e-12)


@given(st.data())
@settings(max_examples=40, deadline=None)
def test_aggregate_values_under_the_mask_do_not_matter(data):
    N = data.draw(st.integers(1, 5))
    T = data.draw(st.integers(1, 6))
    lengths = data.draw(st.lists(st.integers(0, T), min_size=N, max_size=N))
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    loss = torch.randn(N, T, dtype=torch.float64)
    garbage = torch.where(mask, loss, torch.full_like(loss, float("nan")))
    for mode in ("token_mean", "seq_mean_token_mean", "constant"):
        a = aggregate(loss, mask, mode, max_completion_length=T)
        b = aggregate(garbage, mask, mode, max_completion_length=T)
        assert torch.equal(a, b)
        assert not torch.isnan(a)


def test_aggregate_errors():
    with pytest.raises(ValueError, match="mode"):
        aggregate(LOSS, MASK, "sequence_mean")
    with pytest.raises(ValueError, match="max_completion_length"):
        aggregate(LOSS, MASK, "constant")
    with pytest.raises(ValueError, match="mask"):
        aggregate(LOSS, MASK[:, :3], "token_mean")
    with pytest.raises(ValueError, match="loss"):
        aggregate(LOSS[0], MASK[0], "token_mean")
    with pytest.raises(ValueError, match="num_sequences"):
        aggregate(LOSS, MASK, "seq_mean_token_mean", num_sequences=0)


# ---------------------------------------------------------------------------
# token_logprobs_and_entropy
# ---------------------------------------------------------------------------


def test_logprobs_and_entropy_golden():
    # V = 3, D = 2, weight rows e1, e2, 0; hidden (ln 2, 0) -> logits (ln 2, 0, 0)
    # softmax = (2, 1, 1) / 4 = (1/2, 1/4, 1/4)
    # logp(target 0) = ln(1/2); logp(target 2) = ln(1/4)
    # entropy = -(1/2 ln 1/2 + 2 * 1/4 ln 1/4) = 1/2 ln 2 + ln 2 = 1.5 ln 2
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    hidden = torch.tensor([[[math.log(2.0), 0.0], [math.log(2.0), 0.0]]], dtype=torch.float64)
    targets = torch.tensor([[0, 2]])
    logp, entropy = token_logprobs_and_entropy(hidden, weight, targets, chunk_size=1)
    assert logp.tolist()[0] == pytest.approx([math.log(0.5), math.log(0.25)], abs=1e-14)
    assert entropy.tolist()[0] == pytest.approx([1.5 * math.log(2.0)] * 2, abs=1e-14)
    # temperature 2: logits (ln 2 / 2, 0, 0) -> exp = (sqrt 2, 1, 1), Z = 2 + sqrt 2
    logp_t, entropy_t = token_logprobs_and_entropy(hidden, weight, targets, temperature=2.0)
    z = 2.0 + math.sqrt(2.0)
    p = [math.sqrt(2.0) / z, 1.0 / z, 1.0 / z]
    assert logp_t[0, 0].item() == pytest.approx(math.log(p[0]), abs=1e-14)
    assert entropy_t[0, 0].item() == pytest.approx(-sum(q * math.log(q) for q in p), abs=1e-14)
    # bias (0, ln 2, 0) -> logits (ln 2, ln 2, 0) -> softmax (2, 2, 1) / 5
    bias = torch.tensor([0.0, math.log(2.0), 0.0], dtype=torch.float64)
    logp_b, _ = token_logprobs_and_entropy(hidden, weight, targets, bias=bias)
    assert logp_b[0].tolist() == pytest.approx([math.log(0.4), math.log(0.2)], abs=1e-14)


def _random_problem(N=3, T=5, D=4, V=11, dtype=torch.float64, seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, T, D, generator=g, dtype=torch.float64).to(dtype)
    weight = torch.randn(V, D, generator=g, dtype=torch.float64).to(dtype)
    b = torch.randn(V, generator=g, dtype=torch.float64).to(dtype) if bias else None
    targets = torch.randint(0, V, (N, T), generator=g)
    upstream = torch.randn(N, T, generator=g, dtype=torch.float64)
    return hidden, weight, b, targets, upstream


@pytest.mark.parametrize("chunk_size", [1, 4, 15, 100, None])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_bias", [False, True])
def test_chunked_matches_full_logits_float64(chunk_size, temperature, with_bias):
    hidden, weight, bias, targets, upstream = _random_problem(bias=with_bias)
    leaves = [hidden, weight] + ([bias] if with_bias else [])
    for x in leaves:
        x.requires_grad_(True)

    logp, entropy = token_logprobs_and_entropy(
        hidden, weight, targets, temperature=temperature, chunk_size=chunk_size, bias=bias
    )
    grads = torch.autograd.grad((logp * upstream).sum(), leaves)
    logp_ref, entropy_ref = naive_token_logprobs_and_entropy(hidden, weight, targets, temperature, bias)
    grads_ref = torch.autograd.grad((logp_ref * upstream).sum(), leaves)

    assert logp.dtype == torch.float64 and logp.shape == (3, 5)
    torch.testing.assert_close(logp, logp_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(entropy, entropy_ref, rtol=0, atol=1e-12)
    assert not entropy.requires_grad
    for got, want in zip(grads, grads_ref):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_gradcheck_against_finite_differences():
    hidden, weight, bias, targets, _ = _random_problem(N=2, T=3, D=3, V=7, bias=True)
    for x in (hidden, weight, bias):
        x.requires_grad_(True)

    def f(h, w, b):
        return token_logprobs_and_entropy(h, w, targets, temperature=1.3, chunk_size=2, bias=b)[0]

    assert torch.autograd.gradcheck(f, (hidden, weight, bias), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_frozen_head_gives_only_the_hidden_gradient():
    hidden, weight, _, targets, upstream = _random_problem()
    hidden.requires_grad_(True)  # weight stays frozen (LoRA)
    logp, _ = token_logprobs_and_entropy(hidden, weight, targets, chunk_size=4)
    (grad,) = torch.autograd.grad((logp * upstream).sum(), [hidden])
    logp_ref, _ = naive_token_logprobs_and_entropy(hidden, weight, targets)
    (grad_ref,) = torch.autograd.grad((logp_ref * upstream).sum(), [hidden])
    torch.testing.assert_close(grad, grad_ref, rtol=0, atol=1e-12)
    assert weight.grad is None


def test_weight_only_gradient_and_no_grad_mode():
    hidden, weight, _, targets, upstream = _random_problem()
    weight.requires_grad_(True)
    logp, _ = token_logprobs_and_entropy(hidden, weight, targets, chunk_size=4)
    (grad,) = torch.autograd.grad((logp * upstream).sum(), [weight])
    logp_ref, _ = naive_token_logprobs_and_entropy(hidden, weight, targets)
    (grad_ref,) = torch.autograd.grad((logp_ref * upstream).sum(), [weight])
    torch.testing.assert_close(grad, grad_ref, rtol=0, atol=1e-12)
    with torch.no_grad():
        logp_ng, _ = token_logprobs_and_entropy(hidden, weight, targets)
    assert not logp_ng.requires_grad
    # another chunking (the default size vs 4 rows) adds in another order: float64 rounding, not bitwise
    torch.testing.assert_close(logp_ng, logp.detach(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_softmax_in_fp32(dtype):
    hidden, weight, _, targets, upstream = _random_problem(N=2, T=6, D=8, V=50, dtype=dtype, seed=1)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    logp, entropy = token_logprobs_and_entropy(hidden, weight, targets, chunk_size=5)
    assert logp.dtype == torch.float32 and entropy.dtype == torch.float32
    g_h, g_w = torch.autograd.grad((logp * upstream.float()).sum(), [hidden, weight])
    assert g_h.dtype == dtype and g_w.dtype == dtype
    # naive path on the same half-precision matmul, fp32 softmax
    logp_ref, entropy_ref = naive_token_logprobs_and_entropy(hidden, weight, targets)
    r_h, r_w = torch.autograd.grad((logp_ref * upstream.float()).sum(), [hidden, weight])
    torch.testing.assert_close(logp, logp_ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, entropy_ref, rtol=0, atol=1e-5)
    # gradients are rounded to the half dtype (weight: accumulated over chunks in fp32 first)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(g_h.float(), r_h.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(g_w.float(), r_w.float(), rtol=tol, atol=tol)


def test_entropy_of_uniform_distribution_is_log_v():
    # zero weight -> all logits 0 -> uniform over V = 13: H = ln 13, logp = -ln 13
    hidden = torch.randn(2, 3, 4)
    weight = torch.zeros(13, 4)
    logp, entropy = token_logprobs_and_entropy(hidden, weight, torch.zeros(2, 3, dtype=torch.long))
    torch.testing.assert_close(entropy, torch.full((2, 3), math.log(13.0)), rtol=0, atol=1e-6)
    torch.testing.assert_close(logp, torch.full((2, 3), -math.log(13.0)), rtol=0, atol=1e-6)


def test_logprob_errors():
    hidden, weight, _, targets, _ = _random_problem()
    with pytest.raises(ValueError, match="hidden"):
        token_logprobs_and_entropy(hidden[..., :3], weight, targets)
    with pytest.raises(ValueError, match="targets"):
        token_logprobs_and_entropy(hidden, weight, targets[:, :4])
    with pytest.raises(ValueError, match="targets"):
        token_logprobs_and_entropy(hidden, weight, targets.double())
    with pytest.raises(ValueError, match="weight"):
        token_logprobs_and_entropy(hidden, weight.float(), targets)
    with pytest.raises(ValueError, match="bias"):
        token_logprobs_and_entropy(hidden, weight, targets, bias=torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs_and_entropy(hidden, weight, targets, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs_and_entropy(hidden, weight, targets, chunk_size=0)


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor produced by an aten op."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.largest = max(self.largest, leaf.numel())
        return out


def test_full_logits_never_exist_at_once():
    # N * T = 32 token rows, V = 97: the full logits have 3104 elements; chunks of 3 rows have 291.
    # Every other tensor is smaller: hidden / grad 32 * 4 = 128, weight / grad 97 * 4 = 388.
    hidden, weight, _, targets, upstream = _random_problem(N=4, T=8, D=4, V=97)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    with _LargestTensor() as chunked:
        logp, _ = token_logprobs_and_entropy(hidden, weight, targets, chunk_size=3)
        (logp * upstream).sum().backward()
    assert chunked.largest == 388  # the weight gradient; a logits chunk is 3 * 97 = 291
    with _LargestTensor() as naive:  # the check does see full logits when they exist
        logp, _ = naive_token_logprobs_and_entropy(hidden, weight, targets)
        (logp * upstream).sum().backward()
    assert naive.largest == 4 * 8 * 97
