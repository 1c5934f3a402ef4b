"""Tensor primitives shared by the losses: masked reductions, loss aggregation, and a
memory-light log-probability + entropy computation from the last hidden states.

Shapes: ``N`` completions (rows, prompt-major), ``T`` completion tokens (right padded),
``D`` hidden size, ``V`` vocabulary.

Loss aggregation ("how do per-token losses become one number") is the main source of length
bias between GRPO variants, so it lives in one function, :func:`aggregate`, with the three modes
of verl's ``agg_loss``:

* ``"token_mean"`` (DAPO, Yu et al. 2025): every token of the batch weighs the same;
* ``"seq_mean_token_mean"`` (GRPO, Shao et al. 2024; GTPO's per-completion mean): mean over the
  tokens of each completion, then mean over completions;
* ``"constant"`` (Dr.GRPO, Liu et al. 2025): sum over tokens divided by a constant
  (max completion length x number of completions), so no length normalisation at all.

The normalisers can be given as the GLOBAL counts of the whole rollout batch (``num_sequences``,
``num_tokens``): then the losses of micro-batches sum exactly to the full-batch loss, which is
what gradient accumulation needs [D].

:func:`token_logprobs_and_entropy` never materialises the ``(N, T, V)`` logits: it processes
``chunk_size`` token rows at a time and recomputes each chunk's logits in the backward pass
(a custom :class:`torch.autograd.Function`). With V = 49,152 (SmolLM2) or 128k (Llama-3) the full
logits of a rollout batch are gigabytes; this is the "OOM with large vocabularies" complaint of
GRPO trainers. The reference GTPO code computes entropies with full per-completion logits [C];
this project computes the same quantities (log-prob of the sampled token, full-vocabulary entropy)
chunk by chunk [D].

This module imports nothing from the rest of the package.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..config import AGGREGATIONS

__all__ = [
    "aggregate",
    "default_chunk_rows",
    "masked_mean",
    "masked_sum",
    "token_logprobs_and_entropy",
]


# Default size of one chunk of fp32 logits in token_logprobs_and_entropy (bytes): 64 MiB on CPU (measured
# there: larger chunks gain nothing and cost memory), 512 MiB on an accelerator, where a chunk of 64 MiB at
# V = 128k is ~130 rows, too few to fill the matrix units (bench/gpu_check.py times both).
_DEFAULT_CHUNK_BYTES = 64 * 2**20
_ACCELERATOR_CHUNK_BYTES = 512 * 2**20


def default_chunk_rows(vocab_size: int, device: torch.device | str) -> int:
    """Token rows per chunk of :func:`token_logprobs_and_entropy` when ``chunk_size`` is None: the rows
    whose float32 logits ``(rows, V)`` take 64 MiB on CPU, 512 MiB on an accelerator."""
    budget = _DEFAULT_CHUNK_BYTES if torch.device(device).type == "cpu" else _ACCELERATOR_CHUNK_BYTES
    return max(1, budget // (4 * vocab_size))


# ---------------------------------------------------------------------------
# argument checking (shared by the maths modules of the package)
# ---------------------------------------------------------------------------


def _check_tensor(name: str, value, *, ndim: int | None = None) -> Tensor:
    if not isinstance(value, Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if ndim is not None and value.dim() != ndim:
        raise ValueError(
            f"{name}: expected a {ndim}-D tensor, got shape {tuple(value.shape)}"
        )
    return value


def _check_shape(name: str, value, shape: Sequence[int], shape_doc: str) -> Tensor:
    """Raise a ValueError unless ``value`` is a tensor of exactly ``shape``."""
    _check_tensor(name, value)
    if tuple(value.shape) != tuple(shape):
        raise ValueError(
            f"{name}: expected shape {shape_doc} = {tuple(shape)}, got {tuple(value.shape)}"
        )
    return value


def _check_option(name: str, value, options: Sequence[str]) -> str:
    if value not in options:
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, options))}, got {value!r}")
    return value


def _check_group_size(group_size, num_rows: int, rows_name: str) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise ValueError(f"group_size: expected an int >= 2, got {group_size!r}")
    if group_size < 2:
        raise ValueError(
            f"group_size: expected an int >= 2 (a group needs at least two completions to "
            f"compare), got {group_size}"
        )
    if num_rows % group_size != 0:
        raise ValueError(
            f"group_size: the number of rows of {rows_name} ({num_rows}) must be divisible by "
            f"group_size ({group_size}); rows are prompt-major (row p*G+g)"
        )
    return group_size


def _check_positive_int(name: str, value, *, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive int{' or None' if allow_none else ''}, got {value!r}")


# ---------------------------------------------------------------------------
# masked reductions and aggregation
# ---------------------------------------------------------------------------


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values`` where ``mask`` is nonzero.

    ``values (..., T)`` and ``mask`` of the same shape (bool or 0/1 numbers). Entries outside the
    mask contribute exactly 0 and receive a zero gradient even if they are inf or NaN (they are
    selected away with ``torch.where``, not multiplied by 0). ``dim=None`` sums everything (0-dim
    result); otherwise sums over ``dim``.
    """
    _check_tensor("values", values)
    _check_shape("mask", mask, values.shape, "values.shape")
    selected = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over the entries where ``mask`` is nonzero.

    ``values (..., T)``, ``mask`` of the same shape. The count of masked entries is clamped to at
    least 1, so an empty mask gives 0 (never NaN). ``dim=None`` averages over everything.
    """
    total = masked_sum(values, mask, dim)
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim=dim)
    return total / count.clamp(min=1).to(total.dtype)


def aggregate(
    loss: Tensor,
    mask: Tensor,
    mode: str,
    *,
    max_completion_length: int | None = None,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
) -> Tensor:
    """Reduce per-token losses ``loss (N, T)`` over ``mask (N, T)`` to a scalar.

    * ``"token_mean"`` (DAPO): ``sum(loss * mask) / num_tokens`` (default ``mask.sum()``);
    * ``"seq_mean_token_mean"`` (GRPO, GTPO): ``sum_i (sum_t loss_it mask_it) / len_i``, divided
      by ``num_sequences`` (default ``N``); a completion of length 0 contributes 0;
    * ``"constant"`` (Dr.GRPO): ``sum(loss * mask) / (max_completion_length * num_sequences)``;
      ``max_completion_length`` is required.

    ``num_sequences`` / ``num_tokens`` are the GLOBAL counts of the whole rollout batch when
    ``loss`` is a micro-batch: the micro-batch results then sum exactly to the full-batch result
    (gradient accumulation without reweighting) [D, as verl's ``global_token_num``].
    """
    _check_tensor("loss", loss, ndim=2)
    _check_shape("mask", mask, loss.shape, "loss.shape (N, T)")
    _check_option("mode", mode, AGGREGATIONS)
    _check_positive_int("max_completion_length", max_completion_length)
    _check_positive_int("num_sequences", num_sequences)
    _check_positive_int("num_tokens", num_tokens)
    n_rows = loss.shape[0] if num_sequences is None else num_sequences

    if mode == "token_mean":
        total = masked_sum(loss, mask)
        if num_tokens is None:
            return total / mask.bool().sum().clamp(min=1).to(total.dtype)
        return total / num_tokens
    if mode == "seq_mean_token_mean":
        per_seq = masked_mean(loss, mask, dim=1)  # (N,)
        return per_seq.sum() / n_rows
    # constant
    if max_completion_length is None:
        raise ValueError(
            "max_completion_length: the 'constant' aggregation (Dr.GRPO) divides by "
            "max_completion_length * num_sequences; expected a positive int, got None"
        )
    return masked_sum(loss, mask) / (max_completion_length * n_rows)


# ---------------------------------------------------------------------------
# chunked log-probabilities and entropy
# ---------------------------------------------------------------------------


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp16/bf16 -> fp32 softmax; fp32 and fp64 stay as they are."""
    return torch.promote_types(dtype, torch.float32)


def _chunk_logits(
    h: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    temperature: float,
    out: Tensor,
    low: Tensor | None,
) -> Tensor:
    """Logits of the rows ``h (C, D)`` written into ``out[:C] (C, V)`` (compute dtype), divided
    by ``temperature``. ``low`` is a ``(C_max, V)`` buffer in the input dtype for the matmul when
    the compute dtype differs (fp16/bf16 inputs); buffers are reused across chunks so that no
    chunk allocates (and page-faults) fresh memory."""
    C = h.shape[0]
    target = out[:C] if low is None else low[:C]
    if bias is None:
        torch.mm(h, weight.t(), out=target)
    else:
        torch.addmm(bias, h, weight.t(), out=target)
    z = out[:C]
    if low is not None:
        z.copy_(target)
    if temperature != 1.0:
        z.div_(temperature)
    return z


class _ChunkedLogprobEntropy(torch.autograd.Function):
    """logp and entropy of ``softmax((hidden @ weight.T + bias) / temperature)`` chunk by chunk.

    Forward saves only ``hidden``, ``weight``, ``bias``, ``targets`` and the log-normaliser
    ``lse (M,)``; backward recomputes each chunk's logits. With ``p = softmax(z)`` and
    ``g = dL/dlogp``, ``dL/dz = g * (onehot(target) - p)`` and ``z = (h W^T + b) / temperature``.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size):
        # hidden (M, D), weight (V, D), bias (V,) | None, targets (M,) int64
        M, V = hidden.shape[0], weight.shape[0]
        cdtype = _compute_dtype(hidden.dtype)
        device = hidden.device
        logp = torch.empty(M, dtype=cdtype, device=device)
        entropy = torch.empty(M, dtype=cdtype, device=device)
        lse = torch.empty(M, dtype=cdtype, device=device)
        rows = min(chunk_size, M)
        z_buf = torch.empty((rows, V), dtype=cdtype, device=device)  # shifted logits s = z - max
        e_buf = torch.empty((rows, V), dtype=cdtype, device=device)  # exp(s)
        low_buf = torch.empty((rows, V), dtype=hidden.dtype, device=device) if cdtype != hidden.dtype else None
        for start in range(0, M, chunk_size):
            end = min(start + chunk_size, M)
            z = _chunk_logits(hidden[start:end], weight, bias, temperature, z_buf, low_buf)  # (C, V)
            z_target = z.gather(1, targets[start:end, None]).squeeze(1)  # (C,)
            z_max = z.amax(dim=1, keepdim=True)  # (C, 1)
            z.sub_(z_max)  # s = z - max <= 0
            e = torch.exp(z, out=e_buf[: end - start])  # (C, V) unnormalised probabilities
            sum_e = e.sum(dim=1)  # (C,)
            e_dot_s = e.mul_(z).sum(dim=1)  # (C,) sum_v e_v s_v
            log_sum_e = sum_e.log()
            lse_c = z_max.squeeze(1) + log_sum_e
            lse[start:end] = lse_c
            logp[start:end] = z_target - lse_c
            # H = -sum p log p = log(sum e) - sum(e * s) / sum(e)
            entropy[start:end] = log_sum_e - e_dot_s / sum_e
        del z_buf, e_buf, low_buf
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logp, grad_entropy):
        with torch.autocast(device_type=grad_logp.device.type, enabled=False):
            return _ChunkedLogprobEntropy._backward(ctx, grad_logp)

    @staticmethod
    def _backward(ctx, grad_logp):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        temperature, chunk_size = ctx.temperature, ctx.chunk_size
        M, V = hidden.shape[0], weight.shape[0]
        cdtype = lse.dtype
        device = hidden.device
        if not (need_hidden or need_weight or need_bias):
            return None, None, None, None, None, None
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        # accumulate the weight/bias gradients in the compute dtype (fp32 for half inputs)
        grad_weight = torch.zeros(weight.shape, dtype=cdtype, device=device) if need_weight else None
        grad_bias = torch.zeros(V, dtype=cdtype, device=device) if need_bias else None
        g_all = grad_logp.to(cdtype) / temperature  # (M,) dL/dlogp times dz/dlogits
        rows = min(chunk_size, M)
        dz_buf = torch.empty((rows, V), dtype=cdtype, device=device)
        low_buf = torch.empty((rows, V), dtype=hidden.dtype, device=device) if cdtype != hidden.dtype else None
        for start in range(0, M, chunk_size):
            end = min(start + chunk_size, M)
            h = hidden[start:end]
            g = g_all[start:end, None]  # (C, 1)
            dz = _chunk_logits(h, weight, bias, temperature, dz_buf, low_buf)  # (C, V) logits again
            dz.sub_(lse[start:end, None]).exp_()  # p
            dz.mul_(-g)  # -g p
            dz.scatter_add_(1, targets[start:end, None], g)  # g (onehot - p)
            if low_buf is not None:  # matmuls in the input dtype, like autograd on the naive path
                dz = low_buf[: end - start].copy_(dz)
            if need_hidden:
                torch.mm(dz, weight, out=grad_hidden[start:end])
            if need_weight:
                if grad_weight.dtype == hidden.dtype:
                    grad_weight.addmm_(dz.t(), h)
                else:
                    grad_weight.add_(torch.mm(dz.t(), h))
            if need_bias:
                grad_bias.add_(dz.sum(dim=0, dtype=cdtype))
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None


def token_logprobs_and_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Log-probability of ``targets`` and full-vocabulary entropy, without the full logits.

    Args:
        hidden: ``(N, T, D)`` last hidden states (any leading shape ``(*S, D)`` works), the
            positions that PREDICT the targets (i.e. already shifted by one).
        weight: ``(V, D)`` LM-head weight; may be frozen (``requires_grad=False``, LoRA).
        targets: ``(N, T)`` (= ``S``) int64 token ids in ``[0, V)``; padded positions must still
            hold a valid id (e.g. the pad id) and are simply ignored by the caller's mask.
        temperature: logits are ``(hidden @ weight.T + bias) / temperature`` (the sampling
            temperature, as TRL does, so that ratios use the sampling distribution).
        chunk_size: number of token rows per chunk; ``None`` picks ``~64 MiB`` of fp32 logits
            per chunk on CPU (``64 MiB / (4 V)`` rows), 512 MiB on an accelerator (:func:`default_chunk_rows`).
        bias: optional ``(V,)`` LM-head bias.

    Returns:
        ``logp (N, T)``: ``log softmax(z)[target]``, differentiable w.r.t. ``hidden``, ``weight``
        and ``bias``; ``entropy (N, T)``: ``-sum_v p_v log p_v`` over the full vocabulary, no
        gradient. Both in fp32 for fp16/bf16 inputs (the matmul runs in the input dtype, the
        softmax in fp32), in the input dtype for fp32/fp64.

    Gradients equal those of the naive computation (``logits = hidden @ weight.T``,
    ``log_softmax``, ``gather``) up to floating-point rounding; only the per-chunk logits ever
    exist, in the forward pass and again in the backward pass (one extra matmul, the price of
    the memory saving). Logits must be finite (an ``-inf`` bias makes the entropy NaN, as in the
    naive computation). Double backward is not supported. Autocast is disabled inside: the matmul
    runs in the dtype of ``hidden``/``weight`` (cast them to bf16 yourself for a bf16 matmul).
    """
    _check_tensor("hidden", hidden)
    _check_tensor("weight", weight, ndim=2)
    _check_tensor("targets", targets)
    if hidden.dim() < 1:
        raise ValueError(f"hidden: expected shape (N, T, D), got {tuple(hidden.shape)}")
    if not hidden.is_floating_point():
        raise ValueError(f"hidden: expected a floating-point tensor, got dtype {hidden.dtype}")
    if weight.dtype != hidden.dtype:
        raise ValueError(f"weight: expected dtype {hidden.dtype} (the dtype of hidden), got {weight.dtype}")
    V, D = weight.shape
    if hidden.shape[-1] != D:
        raise ValueError(
            f"hidden: expected last dimension D = {D} (weight is (V, D) = {tuple(weight.shape)}), "
            f"got shape {tuple(hidden.shape)}"
        )
    _check_shape("targets", targets, hidden.shape[:-1], "hidden.shape[:-1] (N, T)")
    if targets.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise ValueError(f"targets: expected an integer tensor of token ids, got dtype {targets.dtype}")
    if bias is not None:
        _check_shape("bias", bias, (V,), "(V,)")
        if bias.dtype != hidden.dtype:
            raise ValueError(f"bias: expected dtype {hidden.dtype} (the dtype of hidden), got {bias.dtype}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature: expected a float > 0, got {temperature!r}")
    _check_positive_int("chunk_size", chunk_size)
    if chunk_size is None:
        chunk_size = default_chunk_rows(V, hidden.device)

    out_shape = targets.shape
    hidden_2d = hidden.reshape(-1, D)  # (M, D)
    targets_1d = targets.reshape(-1).to(torch.int64)  # (M,)
    # the dtypes are chosen explicitly (matmul in the input dtype, softmax in fp32): no autocast
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        logp, entropy = _ChunkedLogprobEntropy.apply(
            hidden_2d, weight, bias, targets_1d, float(temperature), int(chunk_size)
        )
    return logp.view(out_shape), entropy.view(out_shape)
