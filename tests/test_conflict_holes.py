"""GTPO over multi-turn completions: masks with holes (tool / environment tokens), issue 44 item 1.

The definition [D] (docs/method.md, "Multi-turn completions"): the method runs over the MODEL tokens only,
aligned by their index among the model tokens. Checked against a slow Python reference written in the
original coordinates (no compaction), and, for contiguous masks, bitwise against the functions as they were
before multi-turn support (tests/fixtures/conflict_main.py, a frozen copy).
"""

from __future__ import annotations

import importlib.util
import pathlib
import random

import pytest
import torch

from gtpo.config import GTPOConfig
from gtpo.maths import method
from gtpo.maths.conflict import compaction_order, conflict_runs, conflict_weights

_spec = importlib.util.spec_from_file_location(
    "conflict_main", pathlib.Path(__file__).parent / "fixtures" / "conflict_main.py")
conflict_main = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conflict_main)


def slow_reference(ids, mask, adv, G, pos_weight=2.0, neg_weight=0.0, combine="product", count="max_run"):
    """Lists in, lists out; one group at a time, in the ORIGINAL coordinates: the k-th model token of a
    completion is ``ids[i][model[i][k]]`` with ``model[i]`` the positions where ``mask[i]`` is 1."""
    N, T = len(ids), len(ids[0])
    model = [[t for t in range(T) if mask[i][t]] for i in range(N)]
    sign = [(a > 0) - (a < 0) for a in adv]
    W = [[0.0] * T for _ in range(N)]
    n_conf = [0] * N
    pre = [[False] * T for _ in range(N)]
    suf = [[False] * T for _ in range(N)]
    for g0 in range(0, N, G):
        members = range(g0, g0 + G)

        def tok(i, k, from_end):
            L = len(model[i])
            return ids[i][model[i][L - 1 - k] if from_end else model[i][k]]

        runs = {}
        for i in members:
            for from_end in (False, True):
                r = 0
                while sign[i] != 0 and r < len(model[i]) and any(
                        sign[j] == -sign[i] and r < len(model[j]) and tok(j, r, from_end) == tok(i, r, from_end)
                        for j in members):
                    r += 1
                runs[i, from_end] = r
        for i in members:
            L, a, b = len(model[i]), runs[i, False], runs[i, True]
            w_run = pos_weight if sign[i] > 0 else neg_weight if sign[i] < 0 else 1.0
            for k, t in enumerate(model[i]):
                in_p, in_s = k < a, k >= L - b
                pre[i][t], suf[i][t] = in_p, in_s
                if combine == "product":
                    W[i][t] = (w_run if in_p else 1.0) * (w_run if in_s else 1.0)
                else:
                    W[i][t] = w_run if (in_p or in_s) else 1.0
            n = max(a, b) if count == "max_run" else min(a + b, L)
            n_conf[i] = 0 if sign[i] == 0 else max(n, 1)
    return W, n_conf, pre, suf


def random_batch(rng, P, G, T, vocab, holes=True, all_tool_row=False, equal_group=False):
    N = P * G
    ids = [[rng.randrange(vocab) for _ in range(T)] for _ in range(N)]
    # shared openings / endings so that runs exist
    for i in range(N):
        ids[i][:3] = [1, 2, 3]
    mask = []
    for i in range(N):
        L = rng.randint(0, T)
        row = [1] * L + [0] * (T - L)
        if holes and L > 2:
            for _ in range(rng.randint(1, 3)):  # tool segments inside the completion
                s = rng.randrange(1, L)
                e = min(L, s + rng.randint(1, 4))
                row[s:e] = [0] * (e - s)
        mask.append(row)
    if all_tool_row:
        mask[1] = [0] * T
        mask[1][:0] = []
    adv = [rng.choice([-1.0, 0.0, 1.0, 0.5, -0.7]) for _ in range(N)]
    if equal_group:
        adv[:G] = [0.0] * G  # a group with all-equal rewards: every advantage 0
    return ids, mask, adv


CASES = [(1, 2, 6, 3), (2, 4, 12, 4), (3, 5, 20, 3), (2, 8, 40, 2), (1, 3, 70, 5)]


@pytest.mark.parametrize("P,G,T,vocab", CASES)
@pytest.mark.parametrize("combine,count", [("product", "max_run"), ("union", "union"), ("product", "union")])
def test_holes_match_slow_reference(P, G, T, vocab, combine, count):
    rng = random.Random(P * 1000 + G * 100 + T)
    for trial in range(6):
        ids, mask, adv = random_batch(rng, P, G, T, vocab, all_tool_row=trial == 1, equal_group=trial == 2)
        W, n, pre, suf = slow_reference(ids, mask, adv, G, combine=combine, count=count)
        ids_t, mask_t, adv_t = torch.tensor(ids), torch.tensor(mask), torch.tensor(adv)
        w_t, n_t = conflict_weights(ids_t, mask_t, adv_t, G, combine=combine, count=count)
        p_t, s_t = conflict_runs(ids_t, mask_t, adv_t, G)
        assert w_t.tolist() == W
        assert n_t.tolist() == n
        assert p_t.tolist() == pre and s_t.tolist() == suf
        # tool tokens: weight 0, never in a run
        hole = mask_t == 0
        assert not (w_t[hole] != 0).any() and not (p_t | s_t)[hole].any()


def test_tool_tokens_are_never_partners():
    # two completions, opposite signs; model tokens identical, tool outputs differ and shift positions
    ids = torch.tensor([[5, 6, 90, 91, 7, 8], [5, 6, 80, 7, 8, 0]])
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 0, 1, 1, 0]])
    adv = torch.tensor([1.0, -1.0])
    w, n = conflict_weights(ids, mask, adv, 2)
    # every model token conflicts (aligned over model tokens), the run goes on across the tool segment
    assert n.tolist() == [4, 4]
    assert w.tolist() == [[4.0, 4.0, 0, 0, 4.0, 4.0], [0.0, 0.0, 0, 0.0, 0.0, 0]]
    # the same tokens as tool tokens in the partner: no conflict at all
    mask2 = torch.tensor([[1, 1, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0]])
    w2, n2 = conflict_weights(ids, mask2, adv, 2)
    assert n2.tolist() == [1, 1] and w2[0].tolist() == [1.0, 1.0, 0, 0, 1.0, 1.0]


def test_compaction_order():
    mask = torch.tensor([[1, 0, 1, 0, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]])
    order = compaction_order(mask)
    assert order.tolist() == [[0, 2, 4, 1, 3], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    assert mask.gather(1, order).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [0] * 5]


@pytest.mark.parametrize("P,G,T,vocab", CASES + [(4, 16, 300, 3)])
@pytest.mark.parametrize("combine,count", [("product", "max_run"), ("union", "union")])
def test_contiguous_masks_bitwise_as_before(P, G, T, vocab, combine, count):
    rng = random.Random(7 + T)
    for trial in range(4):
        ids, mask, adv = random_batch(rng, P, G, T, vocab, holes=False, equal_group=trial == 1)
        ids_t, mask_t, adv_t = torch.tensor(ids), torch.tensor(mask), torch.tensor(adv)
        for m in (mask_t, mask_t.bool(), mask_t.float()):
            w, n = conflict_weights(ids_t, m, adv_t, G, combine=combine, count=count)
            w0, n0 = conflict_main.conflict_weights(ids_t, m, adv_t, G, combine=combine, count=count)
            assert torch.equal(w, w0) and w.dtype == w0.dtype and torch.equal(n, n0)
            r, r0 = conflict_runs(ids_t, m, adv_t, G), conflict_main.conflict_runs(ids_t, m, adv_t, G)
            assert torch.equal(r[0], r0[0]) and torch.equal(r[1], r0[1])


def test_loss_mask_and_entropy_take_the_tool_mask():
    completion_mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]])
    tool_mask = torch.tensor([[1, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    m = method.loss_mask(completion_mask, torch.tensor([False, True]), mask_truncated_completions=False,
                         tool_mask=tool_mask)
    assert m.tolist() == [[1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0]] and m.dtype == torch.float32
    m2 = method.loss_mask(completion_mask, torch.tensor([False, True]), mask_truncated_completions=True,
                          tool_mask=tool_mask)
    assert m2[1].sum() == 0
    entropy = torch.tensor([[1.0, 100.0, 100.0, 2.0, 3.0, 50.0], [1.0, 1.0, 1.0, 9.0, 9.0, 9.0]])
    h = method.completion_entropy(entropy, m)
    assert h.tolist() == [2.0, 1.0]  # the tool tokens' entropy (100) is not in <H>_i
    with pytest.raises(ValueError, match="tool_mask"):
        method.loss_mask(completion_mask, None, mask_truncated_completions=False, tool_mask=tool_mask[:, :3])


def test_group_inputs_and_token_advantages_with_holes():
    rng = random.Random(3)
    ids, mask, adv = random_batch(rng, 2, 4, 16, 3)
    cfg = GTPOConfig(group_size=4)
    ids_t, mask_t, adv_t = torch.tensor(ids), torch.tensor(mask).float(), torch.tensor(adv)
    gi = method.group_inputs(ids_t, mask_t, adv_t, cfg)
    W, n, pre, suf = slow_reference(ids, mask, adv, 4)
    assert gi.token_weights.tolist() == W and gi.n_conflict.tolist() == n
    assert not gi.conflict_run[mask_t == 0].any()
    tok = method.token_advantages(adv_t, gi, mask_t, cfg)
    assert (tok[mask_t == 0] == 0).all()


@pytest.mark.parametrize("preset", ["official", "paper"])
def test_whole_method_on_holes_equals_the_batch_without_tool_segments(preset):
    """The composition every engine runs (loss mask, lambda / n_conflict, <H>_i and the entropy filter, the shift,
    token-level advantages, the loss and its gradient) on a batch with tool segments equals it on the same batch with
    the tool segments cut out (the definition of docs/method.md "Multi-turn completions"), whatever the tool
    tokens' ids and entropies."""
    from gtpo.maths.advantages import group_advantages
    from gtpo.maths.losses import gtpo_loss

    cfg = GTPOConfig.from_preset(preset, group_size=4)
    g = torch.Generator().manual_seed(0)
    P, G, L = 3, 4, 9
    N = P * G
    ids_c = torch.randint(3, 9, (N, L), generator=g)
    ids_c[:, :2] = 4
    lengths = torch.randint(3, L + 1, (N,), generator=g)
    mask_c = (torch.arange(L)[None] < lengths[:, None]).float()
    ent_c = torch.rand(N, L, generator=g, dtype=torch.float64) * torch.linspace(0.2, 2.0, N)[:, None].double()
    logp_c = -torch.rand(N, L, generator=g, dtype=torch.float64) * 3
    old_c = logp_c + 0.3 * torch.randn(N, L, generator=g, dtype=torch.float64)
    rewards = torch.randint(0, 3, (N,), generator=g).float()
    rewards[G:2 * G] = 1.0  # a group with all-equal rewards
    # the agent-loop view: a tool segment (ids that would conflict, huge entropy) after `cut` model tokens
    W = L + 4
    ids_h, mask_h = torch.full((N, W), 4), torch.zeros(N, W)
    ent_h = torch.full((N, W), 50.0, dtype=torch.float64)
    logp_h, old_h = torch.zeros(N, W, dtype=torch.float64), torch.zeros(N, W, dtype=torch.float64)
    pos = torch.zeros(N, L, dtype=torch.long)
    for i in range(N):
        cut, tool = int(torch.randint(1, 3, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g))
        where = [k if k < cut else k + tool for k in range(L)]
        pos[i] = torch.tensor(where)
        ids_h[i, where], ent_h[i, where], logp_h[i, where], old_h[i, where] = ids_c[i], ent_c[i], logp_c[i], old_c[i]
        mask_h[i, where] = mask_c[i]
    mask_h[2] = 0  # a completion that is all tool tokens ...
    mask_c[2] = 0  # ... has no model token in the compacted view either

    def run(ids, mask, ent, logp, old):
        mask = method.loss_mask(mask, None, mask_truncated_completions=False)
        adv = group_advantages(rewards, G, scale=cfg.resolved_scale_rewards)
        inputs = method.group_inputs(ids, mask, adv, cfg)
        seq = method.completion_entropy(ent, mask)
        initial = (method.initial_entropy_value(method.initial_entropy_sums(seq, mask))
                   if method.uses_initial_entropy(cfg) else None)
        eff = method.effective_advantages(adv, seq, cfg, initial_entropy=initial, shift_mask=inputs.shift_mask,
                                          sign_rows=inputs.sign_mask)
        tok = method.token_advantages(eff.advantages, inputs, mask, cfg)
        leaf = logp.clone().requires_grad_(True)
        out = gtpo_loss(leaf, mask, eff.advantages, token_weights=inputs.token_weights, n_conflict=inputs.n_conflict,
                        old_logp=old, eps_low=cfg.epsilon, eps_high=cfg.resolved_epsilon_high,
                        divide_by_conflict_count=cfg.divide_by_conflict_count,
                        completion_reduction=cfg.completion_reduction, group_size=G)
        out.loss.backward()
        return tok, inputs.n_conflict, seq, out.loss.detach(), leaf.grad

    tok_c, n_c, seq_c, loss_c, grad_c = run(ids_c, mask_c, ent_c, logp_c, old_c)
    tok_h, n_h, seq_h, loss_h, grad_h = run(ids_h, mask_h, ent_h, logp_h, old_h)
    assert torch.equal(n_h, n_c)
    torch.testing.assert_close(seq_h, seq_c, rtol=1e-12, atol=0)
    torch.testing.assert_close(tok_h.gather(1, pos), tok_c, rtol=1e-6, atol=0)
    assert bool((tok_h[mask_h == 0] == 0).all()) and bool((grad_h[mask_h == 0] == 0).all())
    torch.testing.assert_close(loss_h, loss_c, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(grad_h.gather(1, pos), grad_c, rtol=1e-12, atol=1e-15)
    assert bool(grad_c.abs().sum() > 0)
