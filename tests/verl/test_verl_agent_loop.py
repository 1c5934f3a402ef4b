"""verl agent-loop batches (issue 44 item 4): a multi-turn / tool agent loop writes a ``response_mask`` with holes
(0 on the tool / environment tokens inside a response). GTPO's estimator and loss mode run over the model tokens
only (docs/method.md, "Multi-turn completions"): on a DataProto whose responses interleave tool segments, the
token-level advantages on the model tokens, the loss and its gradient equal those of the same batch with the tool
segments cut out (model tokens contiguous), and tool tokens get advantage 0 whatever their ids and entropies."""

import pytest
import torch

from verl_batches import compose, log_probs, rollout, uid_array

pytest.importorskip("verl")

from verl.protocol import DataProto  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402

from gtpo.integrations.verl import (check_verl_config, compute_gtpo_advantage, compute_policy_loss_gtpo,  # noqa: E402
                                    gtpo_config_from_verl)

PRESETS = {"official": [], "paper": ["algorithm.gtpo={preset:paper}"]}


def _configs(preset):
    cfg = compose(overrides=PRESETS[preset] + ["actor_rollout_ref.rollout.n=4", "data.max_response_length=10",
                                               "actor_rollout_ref.actor.clip_ratio_high=0.28"])
    return gtpo_config_from_verl(cfg), omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def with_tool_segments(r, seed):
    """The rollout ``r`` as an agent loop returns it: after some model tokens of each response, a tool segment
    (ids that would conflict if they were partners, entropies far above any threshold) with response_mask 0.
    Returns the holed tensors and ``pos (N, L)``: where each model token went."""
    g = torch.Generator().manual_seed(seed)
    N, T = r["ids"].shape
    rows = []
    for i in range(N):
        n = int(r["lengths"][i])
        cut = int(torch.randint(1, max(2, n), (1,), generator=g))  # a tool call after `cut` model tokens
        tool = int(torch.randint(1, 5, (1,), generator=g))
        rows.append((n, cut, tool))
    W = max(n + tool for n, _, tool in rows)
    ids = torch.zeros(N, W, dtype=r["ids"].dtype)
    mask = torch.zeros(N, W)
    scores = torch.zeros(N, W)
    entropy = torch.zeros(N, W, dtype=r["entropy"].dtype)
    pos = torch.zeros(N, T, dtype=torch.long)
    for i, (n, cut, tool) in enumerate(rows):
        model_pos = list(range(cut)) + list(range(cut + tool, n + tool))
        ids[i, cut:cut + tool] = 5  # a token the model also writes: never a partner here
        entropy[i, cut:cut + tool] = 50.0
        for k, t in enumerate(model_pos):
            ids[i, t], mask[i, t], entropy[i, t] = r["ids"][i, k], 1.0, r["entropy"][i, k]
            pos[i, k] = t
        pos[i, n:] = W - 1  # read only (times the mask): padding of the model-token view
        scores[i, model_pos[-1]] = r["rewards"][i]
    return dict(ids=ids, mask=mask, scores=scores, entropy=entropy, pos=pos, rows=rows)


def _advantages(ids, mask, scores, entropy, uid, gcfg):
    data = DataProto.from_dict(tensors={"token_level_rewards": scores, "response_mask": mask, "responses": ids,
                                        "entropy": entropy.float()}, non_tensors={"uid": uid})
    adv, _ = compute_gtpo_advantage(
        token_level_rewards=data.batch["token_level_rewards"], response_mask=data.batch["response_mask"],
        index=data.non_tensor_batch["uid"], config=None, responses=data.batch["responses"],
        entropy=data.batch["entropy"], gtpo_config=gcfg)
    return adv


@pytest.mark.parametrize("preset", ["official", "paper"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agent_loop_batch_equals_the_batch_without_tool_segments(preset, seed):
    gcfg, actor_cfg = _configs(preset)
    r = rollout(seed)
    h = with_tool_segments(r, seed)
    uid = uid_array(r["uid"])
    adv_h = _advantages(h["ids"], h["mask"], h["scores"], h["entropy"], uid, gcfg)
    adv_c = _advantages(r["ids"], r["mask"], r["scores"], r["entropy"], uid, gcfg)
    assert bool(adv_c.abs().sum() > 0)
    # tool tokens: advantage 0; model tokens: the advantages of the batch without tool segments
    assert bool((adv_h[h["mask"] == 0] == 0).all())
    on_model = adv_h.gather(1, h["pos"]) * r["mask"]
    torch.testing.assert_close(on_model, adv_c * r["mask"], rtol=1e-6, atol=1e-7)

    # the loss mode: same loss and gradient on the model tokens
    logp_c, old_c = log_probs(seed, r["ids"].shape)
    logp_h = torch.zeros(h["ids"].shape, dtype=logp_c.dtype)
    old_h = torch.zeros_like(logp_h)
    for i, (n, _, _) in enumerate(h["rows"]):  # each model token's log-probs at its place in the agent-loop row
        logp_h[i, h["pos"][i, :n]] = logp_c[i, :n]
        old_h[i, h["pos"][i, :n]] = old_c[i, :n]
    lc, lh = logp_c.clone().requires_grad_(True), logp_h.clone().requires_grad_(True)
    loss_c, _ = compute_policy_loss_gtpo(old_c, lc, adv_c.double(), r["mask"], "seq-mean-token-mean", actor_cfg)
    loss_h, _ = compute_policy_loss_gtpo(old_h, lh, adv_h.double(), h["mask"], "seq-mean-token-mean", actor_cfg)
    loss_c.backward()
    loss_h.backward()
    loss_h, loss_c = loss_h.detach(), loss_c.detach()
    assert abs(float(loss_h) - float(loss_c)) <= 1e-6 * max(1.0, abs(float(loss_c)))
    assert bool((lh.grad[h["mask"] == 0] == 0).all())
    torch.testing.assert_close(lh.grad.gather(1, h["pos"]) * r["mask"].double(), lc.grad * r["mask"].double(),
                               rtol=1e-6, atol=1e-9)


def test_multi_turn_agent_loops_are_accepted():
    cfg = compose(overrides=["actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.multi_turn.enable=true",
                             "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent"])
    check_verl_config(cfg)
