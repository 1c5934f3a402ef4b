"""The trainer's step, piece by piece (rollout -> score -> advantages -> gtpo inputs -> update -> metrics),
each piece tested on a tiny random model against what the pure functions give."""

import math
import os

import pytest
import torch

from gtpo import GTPOTrainer
from gtpo.maths.advantages import entropy_control, group_advantages, sign_mask, varying_groups
from gtpo.maths.conflict import conflict_weights
from helpers import PROMPTS, digit_reward, tiny_config


def rows(n=8):
    return [{"prompt": p, "answer": str(i), "kind": i % 2} for i, p in enumerate(PROMPTS[:n])]


def config(tmp_path, **kw):
    return tiny_config(tmp_path, **{"max_steps": 3, "entropy_threshold": 100.0, **kw})


def trainer_for(tiny_model_path, tmp_path, reward=digit_reward, **kw):
    return GTPOTrainer(tiny_model_path, reward, rows(), args=config(tmp_path, **kw))


# ----------------------------------------------------------------------------- 1-2. rollout and score
def test_sample_batch_is_prompt_major_and_scored(tiny_model_path, tmp_path):
    seen = {}

    def reward(prompts, completions, kind, **kw):
        seen["prompts"], seen["kind"] = prompts, kind
        return [float(k) for k in kind]

    trainer = trainer_for(tiny_model_path, tmp_path, reward=reward, reward_weights=[2.0])
    batch, stats = trainer.sample_batch()
    assert batch.rollout.completion_ids.shape[0] == 8 and len(batch.rows) == 2
    # the G completions of a prompt are consecutive rows and share its dataset columns
    assert seen["prompts"] == [PROMPTS[r] for r in batch.rows for _ in range(4)]
    assert seen["kind"] == [r % 2 for r in batch.rows for _ in range(4)]
    torch.testing.assert_close(batch.rewards, 2.0 * batch.per_func[:, 0])
    assert stats == {"dynamic_sampling/rounds": 0.0}


def test_dynamic_sampling_replaces_zero_variance_groups(tiny_model_path, tmp_path):
    # only the prompts of rows 0 and 2 get rewards that vary; every other group is zero-variance
    def reward(completions, answer, **kw):
        return [float(i % 2) if a in ("0", "2") else 0.0 for i, a in enumerate(answer)]

    trainer = trainer_for(tiny_model_path, tmp_path, reward=reward, loss_type="dapo", dynamic_sampling=True,
                          max_resample_rounds=6)
    first = trainer.sampler.state_dict()
    batch, stats = trainer.sample_batch()
    assert sorted(batch.rows) == [0, 2]  # one epoch of the permutation holds both; the rest were replaced
    assert all(batch.group_varies(p, 4) for p in range(2))
    trainer.sampler.load_state_dict(first)
    drawn = trainer.sampler.next(2 * (1 + int(stats["dynamic_sampling/rounds"])))
    assert drawn.index(0) >= 0 and drawn.index(2) >= 0  # the rounds drew exactly until both were found
    assert stats["dynamic_sampling/rounds"] == max(drawn.index(0), drawn.index(2)) // 2


def test_score_adds_the_overlong_penalty(tiny_model_path, tmp_path):
    trainer = trainer_for(tiny_model_path, tmp_path, reward=lambda completions, **kw: [1.0] * len(completions),
                          overlong_buffer_length=2, overlong_penalty_factor=0.5)
    rollout = trainer.sample_rollout([0, 1])
    batch = trainer.score([0, 1], rollout)
    lengths = rollout.lengths.float()
    want = 1.0 - 0.5 * ((lengths - 4).clamp(min=0) / 2).clamp(max=1)  # linear over the last 2 of 6 tokens
    torch.testing.assert_close(batch.rewards, want)


# ----------------------------------------------------------------------------- 4. gtpo inputs
@pytest.mark.parametrize("mask_truncated", [False, True])
def test_gtpo_inputs_are_the_pure_functions_on_the_loss_mask(tiny_model_path, tmp_path, mask_truncated):
    trainer = trainer_for(tiny_model_path, tmp_path, mask_truncated_completions=mask_truncated,
                          gamma_groups="varying", completion_sign="positive")
    batch, _ = trainer.sample_batch()
    r = batch.rollout
    adv = group_advantages(torch.tensor([1.0, 0, 0, 1, 2, 2, 2, 2]), 4)
    inputs = trainer.gtpo_inputs(r, adv)
    mask = r.completion_mask.clone()
    if mask_truncated:
        mask[r.truncated] = 0
    torch.testing.assert_close(inputs.mask, mask.float())
    w, n = conflict_weights(r.completion_ids, mask, adv, 4)
    assert torch.equal(inputs.token_weights, w) and torch.equal(inputs.n_conflict, n)
    assert inputs.shift_mask.tolist() == [True] * 4 + [False] * 4 == varying_groups(adv, 4).tolist()
    assert torch.equal(inputs.sign_mask, sign_mask(adv, "positive"))
    assert inputs.initial_entropy is None and inputs.ref_logp is None


def test_gtpo_inputs_measure_the_initial_entropy_once(tiny_model_path, tmp_path):
    trainer = trainer_for(tiny_model_path, tmp_path, entropy_rule="initial", entropy_threshold=math.log(2))
    batch, _ = trainer.sample_batch()
    adv = torch.zeros(8)
    first = trainer.gtpo_inputs(batch.rollout, adv).initial_entropy
    assert 5.0 < first < math.log(512) + 1e-3  # a random model: close to ln V
    other, _ = trainer.sample_batch()
    assert trainer.gtpo_inputs(other.rollout, adv).initial_entropy == first  # <H>_ini is the first batch's


def test_baselines_get_no_conflict_weights_unless_asked(tiny_model_path, tmp_path):
    grpo = trainer_for(tiny_model_path, tmp_path / "a", loss_type="grpo")
    batch, _ = grpo.sample_batch()
    adv = group_advantages(torch.arange(8.0), 4)
    assert grpo.gtpo_inputs(batch.rollout, adv).token_weights is None
    masked = trainer_for(tiny_model_path, tmp_path / "b", loss_type="grpo", conflict_masks=True, gtpo_ablation=True)
    assert masked.gtpo_inputs(batch.rollout, adv).token_weights is not None


# ----------------------------------------------------------------------------- 5. update
def test_effective_advantages_are_entropy_control_then_the_sign_control(tiny_model_path, tmp_path):
    trainer = trainer_for(tiny_model_path, tmp_path, entropy_threshold=0.5, gamma=0.2, completion_sign="negative")
    batch, _ = trainer.sample_batch()
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 0.0, 2.0, -2.0])
    inputs = trainer.gtpo_inputs(batch.rollout, adv)
    ent = torch.tensor([0.1, 0.2, 0.9, 0.3, 0.4, 0.6, 0.2, 0.8])
    eff, dropped, metrics = trainer._effective_advantages(adv[2:6], ent[2:6], inputs, slice(2, 6))
    shaped, keep = entropy_control(adv, ent, threshold=0.5, gamma=0.2)
    want = torch.where(adv < 0, shaped, torch.zeros(()))[2:6]
    torch.testing.assert_close(eff, want)
    assert dropped.tolist() == (~keep[2:6]).tolist() == [True, False, False, True]
    assert metrics["gtpo/filtered_frac"].item() == pytest.approx(0.5)


def test_update_does_not_depend_on_the_micro_batch_size(tiny_model_path, tmp_path):
    # the same rollout, one micro-batch vs micro-batches of 3 (not aligned with the groups): the
    # normalisers are the whole batch's, so the accumulated gradient is the same up to float rounding
    results = {}
    rollout = adv = None
    for micro in (None, 3):
        trainer = trainer_for(tiny_model_path, tmp_path / str(micro), micro_batch_size=micro, gamma=0.1)
        if rollout is None:
            batch, _ = trainer.sample_batch()
            rollout = batch.rollout
            adv = group_advantages(torch.tensor([1.0, 0, 0, 1, 2, 0, 2, 0]), 4)
        grads = {}
        step = trainer.optimizer.step

        def capture(*args, _step=step, _grads=grads, _model=trainer.unwrapped_model, **kwargs):
            _grads.update({n: p.grad.detach().clone() for n, p in _model.named_parameters() if p.grad is not None})
            return _step(*args, **kwargs)

        trainer.optimizer.step = capture
        result = trainer.update(rollout, adv, trainer.gtpo_inputs(rollout, adv))
        results[micro] = (grads, result)
    (g1, r1), (g3, r3) = results[None], results[3]
    assert g1.keys() == g3.keys() and g1
    for name in g1:
        torch.testing.assert_close(g3[name], g1[name], rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(r3.seq_entropy, r1.seq_entropy, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r3.loss, r1.loss, rtol=1e-5, atol=1e-7)
    assert r1.skipped_updates == r3.skipped_updates == 0
    assert r1.signal.tolist() == r3.signal.tolist()


def test_update_skips_a_non_finite_loss(tiny_model_path, tmp_path, monkeypatch):
    trainer = trainer_for(tiny_model_path, tmp_path, num_iterations=2)
    batch, _ = trainer.sample_batch()
    adv = group_advantages(torch.arange(8.0), 4)
    before = {n: p.detach().clone() for n, p in trainer.unwrapped_model.named_parameters()}
    real = trainer.loss_fn

    def nan_loss(*args, **kwargs):
        out = real(*args, **kwargs)
        return out._replace(loss=out.loss * float("nan"))

    monkeypatch.setattr(trainer, "loss_fn", nan_loss)
    result = trainer.update(batch.rollout, adv, trainer.gtpo_inputs(batch.rollout, adv))
    assert result.skipped_updates == 2  # this pass and the next are never applied
    assert all(torch.equal(before[n], p) for n, p in trainer.unwrapped_model.named_parameters())


def test_log_policy_change_measures_the_step(tiny_model_path, tmp_path):
    trainer = trainer_for(tiny_model_path, tmp_path, log_policy_change=True)
    metrics = trainer.step()
    assert metrics["gtpo/update_norm"] > 0 and metrics["gtpo/kl_new_old"] > 0 and metrics["gtpo/kl_old_new"] > 0
    still = trainer_for(tiny_model_path, tmp_path / "b", log_policy_change=True, learning_rate=0.0)
    m0 = still.step()
    assert m0["gtpo/update_norm"] == 0.0 and abs(m0["gtpo/kl_new_old"]) < 1e-7 and abs(m0["gtpo/kl_old_new"]) < 1e-7


# ----------------------------------------------------------------------------- 6. metrics, run directory
def test_step_metrics_and_no_signal_reason(tiny_model_path, tmp_path):
    trainer = trainer_for(tiny_model_path, tmp_path, reward=lambda completions, **kw: [0.5] * len(completions),
                          loss_type="grpo")
    metrics = trainer.step()
    assert metrics["frac_reward_zero_std"] == 1.0 and metrics["gtpo/no_signal"] == 1.0
    assert metrics["gtpo/no_signal/zero_variance"] == 1.0 and trainer.no_signal.summary() == "1 (zero-variance 1)"
    assert metrics["step"] == 1 and metrics["reward"] == 0.5


def test_leftovers_of_a_killed_run_are_removed(tiny_model_path, tmp_path):
    trainer = trainer_for(tiny_model_path, tmp_path, max_steps=1)
    out = trainer.args.output_dir
    os.makedirs(out)
    names = [".run_config.json.0123456789ab.tmp", "metrics.jsonl.tmp", ".tmp-checkpoint-7"]
    for name in names[:2]:
        open(os.path.join(out, name), "w").close()
    os.makedirs(os.path.join(out, names[2]))
    trainer.train()
    assert not any(os.path.exists(os.path.join(out, n)) for n in names)
