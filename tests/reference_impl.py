"""Slow, obvious reference implementations of the GTPO maths, for tests and benchmarks.

Written to be read, not to be fast: Python loops over groups, completions and positions, Python
floats, the textbook formulas of gtpo-method.md. The vectorised functions in ``gtpo`` must agree
with these on random inputs.
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F


# ---------------------------------------------------------------------------
# advantages
# ---------------------------------------------------------------------------


def ref_group_advantages(rewards: list[float], group_size: int, scale: str = "none", eps: float = 1e-4) -> list[float]:
    """A_i = R_i - mean(group); optionally / (group std + eps) or / (batch std + eps) (unbiased std)."""
    out = []
    batch_std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    for start in range(0, len(rewards), group_size):
        group = rewards[start:start + group_size]
        if max(group) == min(group):
            out.extend([0.0] * group_size)
            continue
        mean = statistics.fmean(group)
        for r in group:
            a = r - mean
            if scale == "group":
                a = a / (statistics.stdev(group) + eps)
            elif scale == "batch":
                a = a / (batch_std + eps)
            out.append(a)
    return out


def ref_shape_advantages(advantages, seq_entropy, threshold=0.7, gamma=0.1, scope="all", initial_entropy=None):
    out = []
    for a, h in zip(advantages, seq_entropy):
        drop = threshold is not None and h > threshold
        if scope == "negative" and not a < 0:
            drop = False
        if initial_entropy is not None and threshold is not None and initial_entropy > threshold:
            drop = False
        out.append(0.0 if drop else a - gamma * h)
    return out


# ---------------------------------------------------------------------------
# conflict runs and weights
# ---------------------------------------------------------------------------


def _sign(a: float) -> int:
    return 1 if a > 0 else (-1 if a < 0 else 0)


def _weights_and_count(L, a, b, s, pos_weight, neg_weight, combine, count, T):
    """Weights row and conflict count of one completion from its run lengths a (prefix), b (suffix)."""
    row = [0.0] * T
    prefix = [False] * T
    suffix = [False] * T
    w = pos_weight if s > 0 else neg_weight
    for t in range(L):
        in_prefix = s != 0 and t < a
        in_suffix = s != 0 and t >= L - b
        prefix[t], suffix[t] = in_prefix, in_suffix
        if combine == "product":
            row[t] = (w if in_prefix else 1.0) * (w if in_suffix else 1.0)
        else:
            row[t] = w if (in_prefix or in_suffix) else 1.0
    if s == 0:
        n = 0
    elif count == "max_run":
        n = max(a, b, 1)
    else:
        n = max(sum(1 for t in range(L) if prefix[t] or suffix[t]), 1)
    return row, n, prefix, suffix


def ref_conflict(
    ids, mask, advantages, group_size, pos_weight=2.0, neg_weight=0.0, combine="product", count="max_run"
):
    """Literal transcription of gtpo-method.md §4, one group at a time.

    For every position k (counted from the start, then from each completion's last masked token),
    the conflicting tokens are those held at k by at least one positive AND at least one negative
    completion of the group; each completion's run is the initial contiguous stretch of its
    positions whose token is a conflicting token.

    ``ids``, ``mask``: lists of lists (N x T); ``advantages``: list of N floats.
    Returns ``(weights, n_conflict, prefix_run, suffix_run)`` as nested Python lists.
    """
    N, T = len(ids), len(ids[0])
    lengths = [sum(1 for v in row if v) for row in mask]
    signs = [_sign(a) for a in advantages]
    weights, n_conflict, prefix_run, suffix_run = [], [], [], []
    for start in range(0, N, group_size):
        members = range(start, start + group_size)

        def token(i, k, from_end):
            return ids[i][lengths[i] - 1 - k] if from_end else ids[i][k]

        conflicting = {}  # (from_end, k) -> set of conflicting token ids
        for from_end in (False, True):
            for k in range(T):
                pos_tokens = {token(i, k, from_end) for i in members if signs[i] > 0 and k < lengths[i]}
                neg_tokens = {token(i, k, from_end) for i in members if signs[i] < 0 and k < lengths[i]}
                conflicting[from_end, k] = pos_tokens & neg_tokens
        for i in members:
            runs = []
            for from_end in (False, True):
                r = 0
                while r < lengths[i] and signs[i] != 0 and token(i, r, from_end) in conflicting[from_end, r]:
                    r += 1
                runs.append(r)
            row, n, prefix, suffix = _weights_and_count(
                lengths[i], runs[0], runs[1], signs[i], pos_weight, neg_weight, combine, count, T
            )
            weights.append(row)
            n_conflict.append(n)
            prefix_run.append(prefix)
            suffix_run.append(suffix)
    return weights, n_conflict, prefix_run, suffix_run


def ref_conflict_walk(
    ids, mask, advantages, group_size, pos_weight=2.0, neg_weight=0.0, combine="product", count="max_run"
):
    """A second, faster loop formulation: walk each completion's positions from the start (and
    from its last masked token) while some completion of the opposite sign in the group has the
    same token there; stops at the first non-conflicting position. Same outputs as ref_conflict.
    """
    N, T = len(ids), len(ids[0])
    lengths = [sum(1 for v in row if v) for row in mask]
    signs = [_sign(a) for a in advantages]
    weights, n_conflict, prefix_run, suffix_run = [], [], [], []
    for i in range(N):
        g0 = i - i % group_size
        partners = [j for j in range(g0, g0 + group_size) if signs[i] != 0 and signs[j] == -signs[i]]
        L = lengths[i]
        a = 0
        while a < L and any(a < lengths[j] and ids[j][a] == ids[i][a] for j in partners):
            a += 1
        b = 0
        while b < L and any(b < lengths[j] and ids[j][lengths[j] - 1 - b] == ids[i][L - 1 - b] for j in partners):
            b += 1
        row, n, prefix, suffix = _weights_and_count(L, a, b, signs[i], pos_weight, neg_weight, combine, count, T)
        weights.append(row)
        n_conflict.append(n)
        prefix_run.append(prefix)
        suffix_run.append(suffix)
    return weights, n_conflict, prefix_run, suffix_run


def bincount_conflict_runs(
    ids: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, group_size: int, vocab_size: int
):
    """The reference GTPO code's algorithm (re-implemented): per group, ``bincount`` of the keys
    ``step * V + token`` of the positive and of the negative completions (two arrays of V*T per
    direction), a position conflicts when its key occurs in both. Padding comes from ``mask``.
    Memory grows with V*T: used by the benchmark to contrast with the vectorised version.
    Returns ``prefix_run (N, T)``, ``suffix_run (N, T)`` bool.
    """
    N, T = ids.shape
    mask = mask.bool()
    lengths = mask.sum(1)
    prefix = torch.zeros(N, T, dtype=torch.bool)
    suffix = torch.zeros(N, T, dtype=torch.bool)
    steps = torch.arange(T)
    for start in range(0, N, group_size):
        rows = slice(start, start + group_size)
        x, m, adv, L = ids[rows], mask[rows], advantages[rows], lengths[rows]
        pos, neg = adv > 0, adv < 0
        right_index = (L[:, None] - 1 - steps[None, :]).clamp(min=0)
        x_right = x.gather(1, right_index)
        runs = []
        for xx in (x, x_right):
            keys = steps[None, :] * vocab_size + xx  # (G, T)
            in_pos = torch.bincount(keys[pos[:, None] & m], minlength=vocab_size * T) > 0
            in_neg = torch.bincount(keys[neg[:, None] & m], minlength=vocab_size * T) > 0
            conflict = (in_pos & in_neg)[keys] & m & (pos | neg)[:, None]
            runs.append(torch.cumprod(conflict.to(torch.int32), dim=1).sum(1))  # (G,) run lengths
        a, b = runs
        prefix[rows] = steps[None, :] < a[:, None]
        suffix[rows] = (steps[None, :] >= (L - b)[:, None]) & m
    return prefix, suffix


# ---------------------------------------------------------------------------
# log-probs and entropy from full logits
# ---------------------------------------------------------------------------


def naive_token_logprobs_and_entropy(hidden, weight, targets, temperature=1.0, bias=None):
    """The obvious path: full logits (N, T, V), log_softmax, gather; entropy without gradient."""
    logits = F.linear(hidden, weight, bias)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    del logits
    logp = logp_all.gather(-1, targets[..., None].long()).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


# ---------------------------------------------------------------------------
# policy losses, one completion and one token at a time
# ---------------------------------------------------------------------------


def ref_policy_loss(
    loss_type,
    logp,
    mask,
    advantages,
    *,
    old_logp=None,
    ref_logp=None,
    beta=0.0,
    eps_low=0.2,
    eps_high=None,
    aggregation=None,
    max_completion_length=None,
    num_sequences=None,
    num_tokens=None,
    seq_entropy=None,
    token_weights=None,
    n_conflict=None,
    entropy_threshold=0.7,
    gamma=0.1,
    filter_scope="all",
    initial_entropy=None,
    divide_by_conflict_count=True,
    completion_reduction="sum",
    group_size=None,
):
    """The loss as a sum of per-token scalar terms (0-dim tensors, so autograd gives the gradient)."""
    N, T = logp.shape
    eps_high = eps_low if eps_high is None else eps_high
    n_rows = N if num_sequences is None else num_sequences
    if loss_type == "gtpo":
        ent = [0.0] * N if seq_entropy is None else seq_entropy.tolist()
        adv = ref_shape_advantages(advantages.tolist(), ent, entropy_threshold, gamma, filter_scope, initial_entropy)
    else:
        adv = advantages.tolist()
    lengths = [int(mask[i].sum()) for i in range(N)]
    total_tokens = sum(lengths) if num_tokens is None else num_tokens
    if aggregation is None and loss_type != "gtpo":
        aggregation = {"grpo": "seq_mean_token_mean", "dapo": "token_mean", "dr_grpo": "constant"}[loss_type]
    loss = logp.new_zeros(())
    for i in range(N):
        seq = logp.new_zeros(())
        for t in range(lengths[i]):
            lp = logp[i, t]
            old = lp.detach() if old_logp is None else old_logp[i, t]
            r = torch.exp(lp - old)
            r_clip = min(max(float(r.detach()), 1.0 - eps_low), 1.0 + eps_high)
            # PPO: the smaller of the unclipped and the clipped objective; the clipped one is a
            # constant (no gradient) whenever it is strictly the smaller
            if float(r.detach()) * adv[i] <= r_clip * adv[i]:
                term = -(r * adv[i])
            else:
                term = -r.new_tensor(r_clip * adv[i])
            if token_weights is not None:
                term = term * float(token_weights[i, t])
            if beta > 0:
                d = ref_logp[i, t] - lp
                term = term + beta * (torch.exp(d) - d - 1.0)
            seq = seq + term
        if loss_type == "gtpo":
            c = seq / max(lengths[i], 1)
            if divide_by_conflict_count and n_conflict is not None:
                c = c / max(int(n_conflict[i]), 1)
            loss = loss + (c * group_size / n_rows if completion_reduction == "sum" else c / n_rows)
        elif aggregation == "seq_mean_token_mean":
            loss = loss + seq / max(lengths[i], 1) / n_rows
        elif aggregation == "token_mean":
            loss = loss + seq / max(total_tokens, 1)
        else:  # constant
            loss = loss + seq / (max_completion_length * n_rows)
    return loss


def reference_code_gtpo_loss(logp, mask, token_weights, advantages, seq_entropy, n_conflict, threshold=0.7, gamma=0.1):
    """The released GTPO code's loss for ONE prompt (one group), per completion:
    ``A' = A - gamma H`` if ``H <= threshold`` else 0; ``ratio = exp(logp - logp.detach())``;
    ``(-(ratio * A' * delta) * mask).sum() / len / max(n_conflict, 1)``, summed over completions.
    """
    total = logp.new_zeros(())
    for i in range(logp.shape[0]):
        a = advantages[i] - gamma * seq_entropy[i] if seq_entropy[i] <= threshold else 0.0 * advantages[i]
        ratio = torch.exp(logp[i] - logp[i].detach())
        m = mask[i].to(logp.dtype)
        per_tok = -(ratio * a * token_weights[i])
        total = total + (per_tok * m).sum() / m.sum().clamp(min=1.0) / n_conflict[i].clamp(min=1)
    return total
