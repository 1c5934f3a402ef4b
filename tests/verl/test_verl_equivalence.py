"""On verl's own code: GTPO's estimator + loss mode, through verl's DataProto, its mini-batch iterator, its
micro-batch splitting (fixed and token-balanced) and its ppo_loss, equal gtpo.maths.losses.gtpo_loss (loss and gradient,
1e-6) -- for the official and paper presets, several groups, a truncated completion, a zero-variance group; invariant
to row permutation (verl's batch balancing), to the micro-batch split and to data-parallel ranks."""

import pytest
import torch

from gtpo.maths import method
from gtpo.maths.advantages import group_advantages
from gtpo.maths.losses import gtpo_loss

from verl_batches import compose, log_probs, rollout, uid_array

verl = pytest.importorskip("verl")

from verl.protocol import DataProto  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.workers.engine.utils import prepare_micro_batches  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

from gtpo.integrations.verl import compute_gtpo_advantage, gtpo_config_from_verl, gtpo_token_level_advantages  # noqa: E402

PRESETS = {"official": [], "paper": ["algorithm.gtpo={preset:paper}"]}


def _configs(preset: str, extra: list[str] | None = None):
    cfg = compose(overrides=PRESETS[preset] + ["actor_rollout_ref.rollout.n=4", "data.max_response_length=10",
                                               "actor_rollout_ref.actor.clip_ratio_high=0.28"] + (extra or []))
    return cfg, gtpo_config_from_verl(cfg), omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def _reference(r, gcfg, logp, old):
    """GTPO's loss on the prompt-major batch: gtpo.maths.losses.gtpo_loss with the inputs of gtpo.maths.method (as gtpo's own
    trainer and the TRL engine compute them)."""
    G, mask = r["G"], r["mask"]
    adv = group_advantages(r["rewards"], G, scale=gcfg.resolved_scale_rewards)
    inputs = method.group_inputs(r["ids"], mask, adv, gcfg)
    seq_entropy = method.completion_entropy(r["entropy"], mask)
    initial = (method.initial_entropy_value(method.initial_entropy_sums(seq_entropy, mask))
               if method.uses_initial_entropy(gcfg) else None)
    eff = method.effective_advantages(adv, seq_entropy, gcfg, initial_entropy=initial, shift_mask=inputs.shift_mask,
                                      sign_rows=inputs.sign_mask)
    assert float(eff.metrics["gtpo/filtered_frac"]) > 0  # the entropy filter acts in this batch
    leaf = logp.clone().requires_grad_(True)
    out = gtpo_loss(leaf, mask, eff.advantages, token_weights=inputs.token_weights, n_conflict=inputs.n_conflict,
                    old_logp=old, eps_low=gcfg.epsilon, eps_high=gcfg.resolved_epsilon_high,
                    divide_by_conflict_count=gcfg.divide_by_conflict_count,
                    completion_reduction=gcfg.completion_reduction, group_size=G)
    assert float(out.metrics["clipfrac"]) > 0  # the clip acts
    loss = out.loss
    loss.backward()
    return loss.detach(), leaf.grad


def _advantages(r, gcfg, perm):
    """verl's advantage step on a DataProto whose rows are in the order ``perm`` (batch balancing reorders them)."""
    data = DataProto.from_dict(
        tensors={"token_level_rewards": r["scores"][perm], "response_mask": r["mask"][perm],
                 "responses": r["ids"][perm], "entropy": r["entropy"][perm].float()},
        non_tensors={"uid": uid_array(r["uid"])[perm.numpy()]})
    adv, returns = compute_gtpo_advantage(
        token_level_rewards=data.batch["token_level_rewards"], response_mask=data.batch["response_mask"],
        index=data.non_tensor_batch["uid"], config=None, responses=data.batch["responses"],
        entropy=data.batch["entropy"], gtpo_config=gcfg)
    assert adv is returns
    return adv


def _nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def _verl_loss(r, adv, perm, logp, old, actor_cfg, *, micro: int | None, dp: int = 1, seed: int = 0):
    """The actor update of one mini-batch as verl runs it: the batch split over ``dp`` ranks in order, each rank's
    rows shuffled by verl's mini-batch iterator, split by verl's prepare_micro_batches (``micro`` rows, or
    token-balanced with ``micro=None``), each micro-batch's loss from verl's ppo_loss (loss mode gtpo) backpropagated,
    the ranks' gradients averaged (FSDP). Returns the summed loss / dp and d/d logp in prompt-major order."""
    N = len(perm)
    leaf = logp.clone().requires_grad_(True)
    lengths, plen = r["lengths"][perm], r["prompt_len"][perm]
    total = torch.zeros((), dtype=torch.float64)
    batch_tokens = int(r["mask"].sum())
    for rank in range(dp):
        rows = list(range(rank * N // dp, (rank + 1) * N // dp))
        td = tu.get_tensordict(tensor_dict={
            "prompts": _nested([torch.full((int(plen[i]),), 1) for i in rows]),
            "responses": _nested([r["ids"][perm][i, :lengths[i]] for i in rows]),
            "input_ids": _nested([torch.cat([torch.full((int(plen[i]),), 1), r["ids"][perm][i, :lengths[i]]])
                                  for i in rows]),
            "response_mask": _nested([torch.ones(int(lengths[i]), dtype=torch.long) for i in rows]),
            "loss_mask": _nested([torch.ones(int(lengths[i]), dtype=torch.long) for i in rows]),
            "old_log_probs": _nested([old[perm][i, :lengths[i]] for i in rows]),
            "advantages": _nested([adv[i, :lengths[i]].double() for i in rows]),
            "row": perm[rows],  # the prompt-major row of each verl row
        }, non_tensor_dict={"dp_size": dp, "batch_num_tokens": batch_tokens, "global_batch_size": N,
                            "use_dynamic_bsz": micro is None, "micro_batch_size_per_gpu": micro or 1,
                            "max_token_len_per_gpu": 24})
        mini_batches = tu.make_iterator(td, mini_batch_size=len(rows), epochs=1, seed=seed + rank,
                                        dataloader_kwargs={"shuffle": True})
        for mini in mini_batches:
            micro_batches, _ = prepare_micro_batches(mini, dp_group=None, same_micro_num_in_dp=True)
            assert micro is None or len(micro_batches) == len(rows) // micro
            for mb in micro_batches:
                pieces, offsets = [], [0]
                for row in mb["row"].tolist():
                    p, n = int(r["prompt_len"][row]), int(r["lengths"][row])
                    # the model's output over prompt + response; verl's no_padding_2_padding reads the response's
                    # log-probs one position to the left
                    pieces += [torch.zeros(p - 1, dtype=torch.float64), leaf[row, :n], torch.zeros(1, dtype=torch.float64)]
                    offsets.append(offsets[-1] + p + n)
                out = torch.nested.nested_tensor_from_jagged(torch.cat(pieces), offsets=torch.tensor(offsets))
                loss, metrics = ppo_loss(actor_cfg, {"log_probs": out}, mb)
                assert "actor/pg_loss" in metrics
                loss.backward()
                total = total + loss.detach()
    return total / dp, leaf.grad / dp


@pytest.mark.parametrize("preset", ["official", "paper"])
@pytest.mark.parametrize("seed", [0, 1])
def test_estimator_and_loss_equal_gtpo_loss(preset, seed):
    cfg, gcfg, actor_cfg = _configs(preset)
    assert gcfg.completion_reduction == ("sum" if preset == "official" else "mean")
    r = rollout(seed)
    logp, old = log_probs(seed, r["ids"].shape)
    ref_loss, ref_grad = _reference(r, gcfg, logp, old)
    perm = torch.randperm(len(r["uid"]), generator=torch.Generator().manual_seed(seed))  # batch balancing
    adv = _advantages(r, gcfg, perm)
    loss, grad = _verl_loss(r, adv, perm, logp, old, actor_cfg, micro=3)
    assert abs(float(loss) - float(ref_loss)) <= 1e-6 * max(1.0, abs(float(ref_loss)))
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-9)
    assert bool(ref_grad.abs().sum() > 0)


@pytest.mark.parametrize("preset", ["official", "paper"])
def test_invariant_to_row_order_micro_batches_and_ranks(preset):
    cfg, gcfg, actor_cfg = _configs(preset)
    r = rollout(3)
    logp, old = log_probs(3, r["ids"].shape)
    ref_loss, ref_grad = _reference(r, gcfg, logp, old)
    N = len(r["uid"])
    base = _advantages(r, gcfg, torch.arange(N))
    for k in range(3):
        perm = torch.randperm(N, generator=torch.Generator().manual_seed(10 + k))
        torch.testing.assert_close(_advantages(r, gcfg, perm), base[perm], rtol=0, atol=0)  # equivariant, exactly
        for micro, dp in ((1, 1), (2, 1), (4, 1), (12, 1), (None, 1), (3, 2), (None, 2), (1, 4)):
            loss, grad = _verl_loss(r, base[perm], perm, logp, old, actor_cfg, micro=micro, dp=dp, seed=k)
            assert abs(float(loss) - float(ref_loss)) <= 1e-6 * max(1.0, abs(float(ref_loss))), (micro, dp)
            torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-9)


def test_padding_rows_and_whole_groups():
    """verl's synthetic padding rows (one uid, no response token) get 0; a group of the wrong size is refused."""
    _, gcfg, _ = _configs("official")
    r = rollout(4)
    N, T = r["ids"].shape
    pad = 3
    mask = torch.cat([r["mask"], torch.zeros(pad, T)])
    out = gtpo_token_level_advantages(torch.cat([r["scores"], torch.zeros(pad, T)]), mask,
                                      uid_array(r["uid"] + ["pad0"] * pad), torch.cat([r["ids"], torch.ones(pad, T).long()]),
                                      torch.cat([r["entropy"].float(), torch.zeros(pad, T)]), gcfg)
    assert bool((out.advantages[N:] == 0).all())
    torch.testing.assert_close(out.advantages[:N], _advantages(r, gcfg, torch.arange(N)))
    assert {"gtpo/conflict_frac", "gtpo/n_conflict_mean", "gtpo/filtered_frac"} <= set(out.metrics)
    with pytest.raises(ValueError, match="has 3 rows, expected actor_rollout_ref.rollout.n = 4"):
        gtpo_token_level_advantages(r["scores"][:-1], r["mask"][:-1], uid_array(r["uid"][:-1]), r["ids"][:-1],
                                    r["entropy"][:-1].float(), gcfg)


def test_estimator_refuses_verls_own_trainers():
    """verl's trainers call an estimator without the completions and entropies: a clear error names the key."""
    r = rollout(0)
    with pytest.raises(ValueError, match="trainer.v1.trainer_mode=gtpo"):
        compute_gtpo_advantage(token_level_rewards=r["scores"], response_mask=r["mask"], index=uid_array(r["uid"]),
                               config=None)


def test_loss_mode_refuses_rows_of_two_signs_and_other_aggregations():
    from gtpo.integrations.verl import compute_policy_loss_gtpo

    _, _, actor_cfg = _configs("official")
    logp, old = log_probs(0, (2, 3))
    adv = torch.tensor([[1.0, -1.0, 1.0], [0.5, 0.5, 0.5]], dtype=torch.float64)
    with pytest.raises(ValueError, match="one sign per row"):
        compute_policy_loss_gtpo(old, logp, adv, torch.ones(2, 3), "seq-mean-token-mean", actor_cfg)
    with pytest.raises(ValueError, match="loss_agg_mode: .*got 'token-sum'"):
        compute_policy_loss_gtpo(old, logp, adv.abs(), torch.ones(2, 3), "token-sum", actor_cfg)


def test_loss_mode_reduces_as_gtpo_under_verls_default_aggregation():
    """verl's default loss_agg_mode (token-mean) gives exactly the seq-mean-token-mean loss: GTPO's reduction,
    so a user needs only the three GTPO keys."""
    from gtpo.integrations.verl import compute_policy_loss_gtpo

    _, _, actor_cfg = _configs("official")
    logp, old = log_probs(1, (3, 4))
    adv = torch.tensor([[1.0, 2.0, 1.0, 0.0], [-0.5, -0.5, -1.0, -0.5], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.float64)
    a, _ = compute_policy_loss_gtpo(old, logp, adv, mask, "seq-mean-token-mean", actor_cfg)
    b, _ = compute_policy_loss_gtpo(old, logp, adv, mask, "token-mean", actor_cfg)
    assert torch.equal(a, b)
