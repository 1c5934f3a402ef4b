"""GTPO conflict tokens: the prefix / suffix runs and the token weights lambda.

Shapes: ``P`` prompts, ``G = group_size`` completions per prompt, ``N = P * G`` rows in
prompt-major order (row ``p * G + g``), ``T`` completion tokens, right padded:
``completion_mask (N, T)`` is 1 on the tokens the policy generated (first EOS included). In a single-turn
completion they are contiguous from position 0; in a multi-turn (tool-calling) completion the mask has
holes: the tool / environment tokens inside the completion are 0.

Multi-turn masks [D] (docs/method.md, "Multi-turn completions"): the method runs over the MODEL tokens
only, aligned by their index among the model tokens: the k-th model token of completion i is compared
with the k-th model token of completion j (and, right aligned, the k-th from the last). Tool tokens are
never conflict partners, never in a run and never counted in ``n_conflict``; a run goes on across a tool
segment when the model tokens on both sides keep conflicting. This is computed by
:func:`compaction_order`, a stable gather index that moves each row's model tokens to the front
(a contiguous mask -> the identity), running the single-turn method on the compacted rows and scattering
the result back. A contiguous mask takes the single-turn code path unchanged: bitwise today's results.

Method (gtpo-method.md §4, from the released reference code [C]). Within each group, the sign of
the UNSHAPED advantage makes a completion positive (A > 0), negative (A < 0) or inactive (A = 0).

* Position ``k`` of completion ``i`` *conflicts* when some completion of the opposite sign in
  the same group has the same token id at position ``k`` (both positions inside the mask). That
  is the reference code's test "token v at step k occurs in at least one positive and at least
  one negative completion", restricted to the completions that hold v at k.
* Prefix run: positions counted from the start; only the initial contiguous run of conflicting
  positions counts. Suffix run: the same test with positions counted from each completion's
  last masked token (right aligned, so EOS lines up with EOS); again only the initial run.
* lambda = ``pos_weight`` (2.0) on run tokens of a positive completion, ``neg_weight`` (0.0:
  the negative update of shared tokens is skipped) on run tokens of a negative completion, 1 on
  other masked tokens, 0 outside the mask; inactive completions get 1 on every masked token.
  The reference code multiplies the prefix and suffix weights (4.0 for a positive token in both
  runs) [C] -> ``combine="product"``; ``combine="union"`` applies the weight once [D].
* ``n_conflict``: the reference code divides each completion's loss by a conflict count, which,
  because it ORs the prefix run (left-aligned coordinates) with the suffix run (right-aligned
  coordinates), equals ``max(prefix run, suffix run)`` [C] -> ``count="max_run"``;
  ``count="union"`` counts the tokens in either run in the same coordinates [D]. Both are
  clamped to at least 1 for active completions; inactive completions get 0.

Decisions [D]: padding is read from ``completion_mask``, never from a pad id (the reference code
hard-codes Llama-3.1's 128004; EOS may equal PAD for SmolLM2 and Qwen base models). The
reference code builds four ``bincount``s of size ``V * T`` per group (about 1.5 GB at V = 128k,
T = 1500); here tokens are compared directly, pairwise inside a group: for a block of ``B``
positions, a ``(P, G, B, G)`` boolean "same token, partner of the opposite sign, partner inside
its mask", reduced with ``any`` over the partner. Nothing depends on the vocabulary size: token
ids can be any int64 values. Everything is vectorised over all groups at once, and the prefix
and suffix scans run as one batch. Runs are usually short (shared format tokens), so positions
are scanned in blocks of growing size (32, 64, 128, ...) until every run has ended (one host
sync per block; at most ~log2(T) blocks, < 2T positions in the worst case), and the weights
only touch the run columns. The remaining loop chunks the prompts to bound the pairwise
temporaries at about 16 M booleans. ``conflict_weights`` also syncs once to validate the mask
and once for the longest runs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import CONFLICT_COMBINE, CONFLICT_COUNT
from .ops import _check_group_size, _check_option, _check_shape, _check_tensor

__all__ = ["compaction_order", "conflict_runs", "conflict_weights"]

# Upper bound on the elements of one (P_chunk, G, G, B) boolean temporary.
_MAX_PAIR_ELEMENTS = 2**24
# First block of positions scanned for the runs (then 64, 128, ...).
_FIRST_BLOCK = 32


def _validate(completion_ids, completion_mask, advantages, group_size) -> tuple[Tensor, bool]:
    """Check the common arguments; return the mask as bool ``(N, T)`` and whether it has holes (a 1 after
    a 0 in some row: a multi-turn completion; one host sync)."""
    _check_tensor("completion_ids", completion_ids, ndim=2)
    if completion_ids.is_floating_point() or completion_ids.is_complex() or completion_ids.dtype == torch.bool:
        raise ValueError(f"completion_ids: expected an integer tensor of token ids, got dtype {completion_ids.dtype}")
    _check_shape("completion_mask", completion_mask, completion_ids.shape, "completion_ids.shape (N, T)")
    _check_shape("advantages", advantages, completion_ids.shape[:1], "(N,)")
    _check_group_size(group_size, completion_ids.shape[0], "completion_ids")
    mask = completion_mask if completion_mask.dtype == torch.bool else completion_mask != 0  # (N, T)
    holes = mask.shape[1] > 1 and bool((mask[:, 1:] & ~mask[:, :-1]).any())
    return mask, holes


def compaction_order(mask: Tensor) -> Tensor:
    """``(N, T)`` int64 gather index moving each row's model tokens to the front, in order.

    ``mask (N, T)`` (bool or 0/1) is 1 on the tokens the policy produced. Row ``i`` of the result lists the
    positions ``t`` with ``mask[i, t]`` in increasing order, then the other positions in increasing order
    (a stable sort), so ``x.gather(1, order)`` is right padded and ``out.scatter(1, order, y)`` puts values
    computed on the compacted rows back in place. A contiguous (right-padded) mask gives the identity.
    """
    _check_tensor("mask", mask, ndim=2)
    key = (mask == 0).to(torch.uint8)  # (N, T): 0 on model tokens, 1 elsewhere
    return torch.sort(key, dim=1, stable=True).indices  # (N, T) int64


def _conflict_block(ids_blk: Tensor, mask_blk: Tensor, opposite: Tensor, group_size: int) -> Tensor:
    """Conflict indicator ``(N, B)`` for a block of ``B`` positions.

    ``ids_blk (N, B)``, ``mask_blk (N, B)`` bool, ``opposite (P, G, G)`` bool (completions i and
    j of prompt p have opposite signs). Position t of completion i conflicts when
    ``mask[i, t]`` and some j of the same group with the opposite sign has ``mask[j, t]`` and
    ``ids[j, t] == ids[i, t]``: a ``(P, G, B, G)`` comparison reduced with ``any`` over j.
    """
    N, B = ids_blk.shape
    G = group_size
    P = N // G
    x = ids_blk.reshape(P, G, B)
    m = mask_blk.reshape(P, G, B)
    # partner layout (P, B, G): the reduction over the partner j runs along the last dimension
    x_partner = x.transpose(1, 2).contiguous()  # (P, B, G)
    m_partner = m.transpose(1, 2).contiguous()  # (P, B, G)
    conflict = torch.empty((P, G, B), dtype=torch.bool, device=ids_blk.device)
    step = max(1, _MAX_PAIR_ELEMENTS // max(1, G * G * B))
    for p0 in range(0, P, step):  # chunks of prompts bound the (Pc, G, B, G) temporaries
        p1 = min(p0 + step, P)
        same = x[p0:p1, :, :, None] == x_partner[p0:p1, None, :, :]  # (Pc, G, B, G) ids[i, t] == ids[j, t]
        # j has the opposite sign of i and its position t is inside its mask
        same &= opposite[p0:p1, :, None, :] & m_partner[p0:p1, None, :, :]
        conflict[p0:p1] = same.any(dim=-1)
    conflict &= m  # i's position t is inside its mask
    return conflict.view(N, B)


def _initial_conflict_run(block_fn, rows: int, T: int, opposite: Tensor, group_size: int, device) -> Tensor:
    """Length ``(rows,)`` of the initial run of conflicting positions of each row.

    ``block_fn(t0, t1) -> (ids (rows, B), mask (rows, B))`` gives positions ``[t0, t1)`` in the
    coordinates where the runs start at position 0 (left-aligned for the prefix, right-aligned
    for the suffix). Runs are usually short (shared format tokens), so positions are scanned in
    blocks of growing size (32, 64, 128, ...) and the scan stops once every run has ended: at
    most ~log2(T) blocks and < 2T positions in the worst case, one host sync per block.
    """
    run = torch.zeros(rows, dtype=torch.int64, device=device)
    alive = torch.ones(rows, dtype=torch.bool, device=device)  # run not ended yet
    t0, block = 0, _FIRST_BLOCK
    while t0 < T:
        t1 = min(T, t0 + block)
        ids_blk, mask_blk = block_fn(t0, t1)
        conflict = _conflict_block(ids_blk, mask_blk, opposite, group_size)  # (rows, B)
        run_in_block = conflict.to(torch.uint8).cumprod(dim=1).sum(dim=1)  # (rows,) initial run length
        run += run_in_block * alive
        alive &= run_in_block == (t1 - t0)
        if not bool(alive.any()):
            break
        t0, block = t1, 2 * block
    return run


def _runs(completion_ids: Tensor, mask: Tensor, advantages: Tensor, group_size: int, lengths: Tensor):
    """Run lengths ``prefix_len (N,)`` and ``suffix_len (N,)`` (validated input; ``lengths (N,)``
    int64 completion lengths).

    The prefix scan (left-aligned) and the suffix scan (right-aligned) run together as one batch
    of ``2N`` rows (``2P`` groups): rows ``[0, N)`` left-aligned, rows ``[N, 2N)`` right-aligned.
    """
    N, T = completion_ids.shape
    G = group_size
    P = N // G
    device = completion_ids.device
    pos = (advantages > 0).view(P, G)
    neg = (advantages < 0).view(P, G)
    # opposite[p, i, j]: completions i and j of prompt p have opposite signs
    opposite = (pos[:, :, None] & neg[:, None, :]) | (neg[:, :, None] & pos[:, None, :])  # (P, G, G)
    opposite = torch.cat([opposite, opposite])  # (2P, G, G)

    def block(t0: int, t1: int):
        # right-aligned: position k holds ids[i, len_i - 1 - k], valid while k < len_i
        k = torch.arange(t0, t1, device=device)[None, :]  # (1, B)
        index = (lengths[:, None] - 1 - k).clamp(min=0)  # (N, B)
        ids_blk = torch.cat([completion_ids[:, t0:t1], completion_ids.gather(1, index)])  # (2N, B)
        mask_blk = torch.cat([mask[:, t0:t1], k < lengths[:, None]])  # (2N, B)
        return ids_blk, mask_blk

    runs = _initial_conflict_run(block, 2 * N, T, opposite, G, device)  # (2N,)
    return runs[:N], runs[N:]


def _run_masks(prefix_len: Tensor, suffix_len: Tensor, lengths: Tensor, T: int):
    k = torch.arange(T, device=prefix_len.device)[None, :]  # (1, T)
    prefix_run = k < prefix_len[:, None]  # (N, T)
    suffix_run = (k >= (lengths - suffix_len)[:, None]) & (k < lengths[:, None])  # (N, T)
    return prefix_run, suffix_run


def conflict_runs(
    completion_ids: Tensor,
    completion_mask: Tensor,
    advantages: Tensor,
    group_size: int,
) -> tuple[Tensor, Tensor]:
    """Membership of each token in its completion's prefix run and suffix run.

    Args:
        completion_ids: ``(N, T)`` integer token ids (any int64 values; no vocabulary needed).
        completion_mask: ``(N, T)`` 1/True on the policy's tokens incl. the first EOS; right padded, or
            with holes (tool tokens of a multi-turn completion: aligned over the model tokens [D]).
        advantages: ``(N,)`` unshaped group advantages; only their sign is used.
        group_size: ``G >= 2``; ``N`` must be divisible by it.

    Returns:
        ``prefix_run (N, T)`` bool and ``suffix_run (N, T)`` bool, in the original (left-aligned)
        coordinates, inside the mask; all False for inactive completions (advantage 0).
    """
    mask, holes = _validate(completion_ids, completion_mask, advantages, group_size)
    if holes:  # multi-turn: the method over the compacted model tokens, scattered back [D]
        order = compaction_order(mask)  # (N, T)
        prefix_c, suffix_c = _conflict_runs(completion_ids.gather(1, order), mask.gather(1, order), advantages,
                                            group_size)
        return (torch.zeros_like(prefix_c).scatter_(1, order, prefix_c),
                torch.zeros_like(suffix_c).scatter_(1, order, suffix_c))
    return _conflict_runs(completion_ids, mask, advantages, group_size)


def _conflict_runs(completion_ids: Tensor, mask: Tensor, advantages: Tensor, group_size: int):
    """:func:`conflict_runs` on a validated, right-padded bool ``mask (N, T)``."""
    lengths = torch.count_nonzero(mask, dim=1)  # (N,) int64
    prefix_len, suffix_len = _runs(completion_ids, mask, advantages, group_size, lengths)
    return _run_masks(prefix_len, suffix_len, lengths, completion_ids.shape[1])


def conflict_weights(
    completion_ids: Tensor,
    completion_mask: Tensor,
    advantages: Tensor,
    group_size: int,
    *,
    pos_weight: float = 2.0,
    neg_weight: float = 0.0,
    combine: str = "product",
    count: str = "max_run",
) -> tuple[Tensor, Tensor]:
    """GTPO token weights lambda and the per-completion conflict count.

    Args:
        completion_ids: ``(N, T)`` integer token ids (any int64 values).
        completion_mask: ``(N, T)`` 1/True on the policy's tokens incl. the first EOS; right padded, or
            with holes (tool tokens of a multi-turn completion: aligned over the model tokens [D]).
        advantages: ``(N,)`` UNSHAPED group advantages (their sign defines positive/negative).
        group_size: ``G >= 2``.
        pos_weight: lambda on run tokens of positive completions (2.0 [C]).
        neg_weight: lambda on run tokens of negative completions (0.0 [C]).
        combine: ``"product"`` multiplies the prefix and suffix weights (reference code: 4.0 for
            a positive token in both runs) [C]; ``"union"`` applies the weight once [D].
        count: ``"max_run"`` = ``max(prefix run, suffix run)`` (the reference code's number) [C];
            ``"union"`` = number of tokens in either run [D].

    Returns:
        ``weights (N, T)`` float32 (0 outside the mask) and ``n_conflict (N,)`` int64: 0 for
        inactive completions, otherwise ``max(count, 1)``.
    """
    mask, holes = _validate(completion_ids, completion_mask, advantages, group_size)
    for name, value in (("pos_weight", pos_weight), ("neg_weight", neg_weight)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name}: expected a float, got {value!r}")
    _check_option("combine", combine, CONFLICT_COMBINE)
    _check_option("count", count, CONFLICT_COUNT)
    kwargs = dict(pos_weight=pos_weight, neg_weight=neg_weight, combine=combine, count=count)
    if holes:  # multi-turn: the method over the compacted model tokens, scattered back [D]
        order = compaction_order(mask)  # (N, T)
        weights_c, n_conflict = _conflict_weights(completion_ids.gather(1, order), mask.gather(1, order), advantages,
                                                  group_size, **kwargs)
        return torch.zeros_like(weights_c).scatter_(1, order, weights_c), n_conflict
    return _conflict_weights(completion_ids, mask, advantages, group_size, **kwargs)


def _conflict_weights(completion_ids: Tensor, mask: Tensor, advantages: Tensor, group_size: int, *,
                      pos_weight: float, neg_weight: float, combine: str, count: str) -> tuple[Tensor, Tensor]:
    """:func:`conflict_weights` on a validated, right-padded bool ``mask (N, T)``."""
    N, T = completion_ids.shape
    device = completion_ids.device
    weights = mask.to(torch.float32)  # (N, T): 1 on masked tokens, 0 outside
    lengths = weights.sum(dim=1).to(torch.int64)  # (N,) exact: sums of ones below 2^24
    prefix_len, suffix_len = _runs(completion_ids, mask, advantages, group_size, lengths)  # (N,) each

    positive = advantages > 0
    negative = advantages < 0
    active = positive | negative  # (N,)
    run_weight = torch.where(
        positive,
        torch.full((), float(pos_weight), dtype=torch.float32, device=device),
        torch.where(negative, torch.full((), float(neg_weight), dtype=torch.float32, device=device),
                    torch.ones((), dtype=torch.float32, device=device)),
    )[:, None]  # (N, 1)

    # Runs are short ranges: start from the mask and touch only the run columns. Prefix run of
    # row i = positions [0, a_i); suffix run = [L_i - b_i, L_i); both inside the mask (a_i, b_i <= L_i).
    max_prefix = int(prefix_len.max()) if N > 0 else 0
    max_suffix = int(suffix_len.max()) if N > 0 else 0
    if max_prefix > 0:
        k = torch.arange(max_prefix, device=device)[None, :]  # (1, A)
        weights[:, :max_prefix] *= torch.where(k < prefix_len[:, None], run_weight, 1.0)  # (N, A)
    if max_suffix > 0:
        j = torch.arange(max_suffix, device=device)[None, :]  # (1, B) distance from the last token
        position = (lengths[:, None] - 1 - j).clamp(min=0)  # (N, B) original coordinates
        in_suffix = j < suffix_len[:, None]  # (N, B); False wherever the clamp kicked in (b_i <= L_i)
        if combine == "union":  # weight once: skip the suffix tokens already in the prefix run
            in_suffix &= position >= prefix_len[:, None]
        factor = torch.where(in_suffix, run_weight, 1.0)  # (N, B)
        # multiply in place; repeated (clamped) positions carry factor 1, so "prod" is exact
        weights.scatter_reduce_(1, position, factor, reduce="prod")

    if count == "max_run":
        n = torch.maximum(prefix_len, suffix_len)
    else:  # |[0, a) U [L - b, L)| = min(a + b, L)
        n = torch.minimum(prefix_len + suffix_len, lengths)
    n_conflict = torch.where(active, n.clamp(min=1), torch.zeros_like(n)).to(torch.int64)  # (N,)
    return weights, n_conflict
